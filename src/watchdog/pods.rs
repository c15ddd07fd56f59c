//! Live pod → claim mapping for the watchdog.
//!
//! The checkpoint records a claim's pods once, from `status.reservedFor` at prepare,
//! and prepare returns early for a claim already prepared: a pod that joins a shared
//! claim later is not in the record. When a GPU process's pod (from its cgroup) is in
//! no claim's record, the watchdog asks the API server which claims that pod uses
//! ([`PodLookup`]), and matches them against the prepared claims ([`claims_of`]).
//! Answers are cached per pod UID for a bounded time ([`PodCache`]); the checkpoint
//! stays the fast path.
//!
//! A pod's claims, from the Pod object: `spec.resourceClaims[].resourceClaimName`
//! (claims named in the spec), `status.resourceClaimStatuses[].resourceClaimName`
//! (claims generated from templates) and `status.extendedResourceClaimStatus`
//! (extended-resource requests), all in the pod's namespace.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::checkpoint::{ClaimRecord, ClaimState, PodRef};

/// A ResourceClaim a live pod uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveClaim {
    pub name: String,
    /// The claim's UID as the API server has it; `None` when it could not be read
    /// (then the match is by namespace and name only).
    pub uid: Option<String>,
}

/// A pod on this node as the API server has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub claims: Vec<LiveClaim>,
}

impl LivePod {
    pub fn pod_ref(&self) -> PodRef {
        PodRef {
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }
}

/// Why a live lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("listing the pods of node {node} failed")]
    ListPods {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// Finds a pod of this node by UID, with its claims. Blocking: the watchdog ticks on
/// a blocking thread.
pub trait PodLookup: Send + Sync {
    /// The pod with this UID, or `None` when no pod of this node has it.
    fn pod(&self, uid: &str) -> Result<Option<LivePod>, LookupError>;
}

/// The names of the ResourceClaims `pod` uses, in its namespace, deduplicated in
/// order of appearance. Deterministic.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let spec = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.clone());
    let status = pod.status.as_ref();
    let generated = status
        .into_iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.clone());
    let extended = status
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|e| e.resource_claim_name.clone());
    let mut out: Vec<String> = Vec::new();
    for n in spec.chain(generated).chain(extended) {
        if !n.is_empty() && !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// The prepared claims (UIDs, in checkpoint order) that `pod` uses: same namespace and
/// name, and the same UID when the live UID is known (a claim deleted and created
/// again under the same name is another claim). Only claims whose prepare completed.
/// Deterministic.
pub fn claims_of(pod: &LivePod, claims: &BTreeMap<String, ClaimRecord>) -> Vec<String> {
    claims
        .iter()
        .filter(|(_, r)| r.state == ClaimState::PrepareCompleted && r.namespace == pod.namespace)
        .filter(|(uid, r)| {
            pod.claims
                .iter()
                .any(|c| c.name == r.name && c.uid.as_ref().is_none_or(|u| u == *uid))
        })
        .map(|(uid, _)| uid.clone())
        .collect()
}

/// How long a found pod is remembered (its claims cannot change: `spec.resourceClaims`
/// is immutable and generated claims are named before its containers start).
pub const FOUND_TTL: Duration = Duration::from_secs(60);
/// How long a miss (pod not found, or the API unreachable) is remembered, so that a
/// process in a pod without claims does not cost a list per tick.
pub const MISS_TTL: Duration = Duration::from_secs(5);
/// Bound on one live lookup in the plugin (the watchdog ticks every 500 ms).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// At most this many pods are cached; expired entries go first, then the oldest.
pub const CACHE_CAP: usize = 1024;

/// Pod UID → live pod (or a remembered miss), with expiry.
#[derive(Debug, Default)]
pub struct PodCache {
    entries: BTreeMap<String, (Instant, Option<LivePod>)>,
}

impl PodCache {
    /// The live pod with this UID: from the cache while fresh, else from `lookup` (the
    /// answer, or a miss on error, is cached). Errors are returned once per miss so
    /// the caller can log them.
    pub fn resolve(
        &mut self,
        uid: &str,
        lookup: &dyn PodLookup,
        now: Instant,
    ) -> (Option<LivePod>, Option<LookupError>) {
        if let Some((expires, pod)) = self.entries.get(uid)
            && *expires > now
        {
            return (pod.clone(), None);
        }
        let (pod, err) = match lookup.pod(uid) {
            Ok(p) => (p, None),
            Err(e) => (None, Some(e)),
        };
        let ttl = if pod.is_some() { FOUND_TTL } else { MISS_TTL };
        self.insert(uid, now + ttl, pod.clone(), now);
        (pod, err)
    }

    fn insert(&mut self, uid: &str, expires: Instant, pod: Option<LivePod>, now: Instant) {
        self.entries.retain(|_, (e, _)| *e > now);
        while self.entries.len() >= CACHE_CAP {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (e, _))| *e)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.entries.remove(&k),
                None => break,
            };
        }
        self.entries.insert(uid.to_string(), (expires, pod));
    }

    /// Entries held (fresh or not yet pruned).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Looks pods up through the API server: lists this node's pods (`fieldSelector
/// spec.nodeName=<node>`, all namespaces) and reads the UID of each claim the pod uses
/// (`get` on the ResourceClaim; a claim that cannot be read is matched by name).
/// RBAC: `list` pods, `get` resourceclaims.
pub struct KubePods {
    pub client: kube::Client,
    pub node: String,
    pub handle: tokio::runtime::Handle,
    /// Bound on one lookup, so that a slow API server cannot stall the watchdog.
    pub timeout: Duration,
}

impl KubePods {
    async fn find(&self, uid: &str) -> Result<Option<LivePod>, LookupError> {
        use kube::api::{Api, ListParams};
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let list = pods
            .list(&lp)
            .await
            .map_err(|source| LookupError::ListPods {
                node: self.node.clone(),
                source,
            })?;
        let Some(pod) = list
            .items
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
        else {
            return Ok(None);
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
        let mut claims = Vec::new();
        for name in claim_names(&pod) {
            let uid = match api.get_opt(&name).await {
                Ok(Some(c)) => c.metadata.uid,
                // Gone: not a claim of this pod any more (a prepared claim by that
                // name would be another claim's stale record).
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(claim = %name, error = %e, "watchdog: cannot read a pod's claim; matching by name");
                    None
                }
            };
            claims.push(LiveClaim { name, uid });
        }
        Ok(Some(LivePod {
            uid: uid.to_string(),
            namespace,
            name: pod.metadata.name.unwrap_or_default(),
            claims,
        }))
    }
}

impl PodLookup for KubePods {
    fn pod(&self, uid: &str) -> Result<Option<LivePod>, LookupError> {
        self.handle.block_on(async {
            tokio::time::timeout(self.timeout, self.find(uid))
                .await
                .map_err(|_| LookupError::Timeout(self.timeout))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::ClaimRecord;
    use serde_json::json;
    use std::sync::Mutex;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    /// Claims named in the spec, generated from templates and for extended resources
    /// are all found, once each; template references without a generated name yet are
    /// not.
    #[test]
    fn a_pods_claims_come_from_spec_and_status() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared-gpu"},
                {"name": "b", "resourceClaimTemplateName": "tpl"},
                {"name": "c", "resourceClaimTemplateName": "tpl2"}
            ]},
            "status": {
                "resourceClaimStatuses": [
                    {"name": "b", "resourceClaimName": "p-b-x7k2q"},
                    {"name": "a", "resourceClaimName": "shared-gpu"}
                ],
                "extendedResourceClaimStatus": {
                    "requestMappings": [], "resourceClaimName": "p-extended-resources-9"
                }
            }
        }));
        assert_eq!(
            claim_names(&p),
            vec!["shared-gpu", "p-b-x7k2q", "p-extended-resources-9"]
        );
        assert!(claim_names(&pod(json!({"metadata": {"name": "q"}}))).is_empty());
    }

    fn record(ns: &str, name: &str, state: ClaimState) -> ClaimRecord {
        ClaimRecord {
            state,
            namespace: ns.into(),
            name: name.into(),
            devices: vec![],
            cdi_spec: None,
            claim_files: false,
            lib_version: None,
            pods: vec![],
            started_at: 0,
            completed_at: None,
        }
    }

    fn live(ns: &str, claims: &[(&str, Option<&str>)]) -> LivePod {
        LivePod {
            uid: "pod".into(),
            namespace: ns.into(),
            name: "p".into(),
            claims: claims
                .iter()
                .map(|(n, u)| LiveClaim {
                    name: n.to_string(),
                    uid: u.map(str::to_string),
                })
                .collect(),
        }
    }

    /// Matching is by namespace and name, and by UID when the live UID is known; only
    /// completed prepares count.
    #[test]
    fn live_claims_match_prepared_claims_by_namespace_name_and_uid() {
        let claims: BTreeMap<String, ClaimRecord> = [
            ("u1", record("ns", "shared", ClaimState::PrepareCompleted)),
            (
                "u2",
                record("other", "shared", ClaimState::PrepareCompleted),
            ),
            ("u3", record("ns", "half", ClaimState::PrepareStarted)),
            ("u4", record("ns", "old", ClaimState::PrepareCompleted)),
        ]
        .into_iter()
        .map(|(u, r)| (u.to_string(), r))
        .collect();
        /// (the pod's claims: name and live UID, the prepared claims it matches).
        type Case<'a> = (&'a [(&'a str, Option<&'a str>)], &'a [&'a str]);
        let cases: &[Case] = &[
            (&[("shared", None)], &["u1"]),
            (&[("shared", Some("u1"))], &["u1"]),
            // Same name, another UID: the record is of a deleted claim.
            (&[("shared", Some("new"))], &[]),
            (&[("half", None)], &[]),
            (&[("old", Some("u4")), ("shared", None)], &["u1", "u4"]),
            (&[("missing", None)], &[]),
        ];
        for (pod_claims, want) in cases {
            assert_eq!(
                claims_of(&live("ns", pod_claims), &claims),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{pod_claims:?}"
            );
        }
    }

    /// Counts lookups and answers from a fixed table.
    struct Table(Vec<LivePod>, Mutex<usize>);

    impl PodLookup for Table {
        fn pod(&self, uid: &str) -> Result<Option<LivePod>, LookupError> {
            *self.1.lock().unwrap() += 1;
            Ok(self.0.iter().find(|p| p.uid == uid).cloned())
        }
    }

    /// A found pod is asked for once per FOUND_TTL, a miss once per MISS_TTL.
    #[test]
    fn the_cache_bounds_lookups_by_ttl() {
        let t = Table(vec![live("ns", &[("shared", None)])], Mutex::new(0));
        let mut c = PodCache::default();
        let t0 = Instant::now();
        assert!(c.resolve("pod", &t, t0).0.is_some());
        assert!(c.resolve("pod", &t, t0 + FOUND_TTL / 2).0.is_some());
        assert_eq!(*t.1.lock().unwrap(), 1);
        assert!(c.resolve("pod", &t, t0 + FOUND_TTL).0.is_some());
        assert_eq!(*t.1.lock().unwrap(), 2);
        assert!(c.resolve("stranger", &t, t0).0.is_none());
        assert!(c.resolve("stranger", &t, t0 + MISS_TTL / 2).0.is_none());
        assert_eq!(*t.1.lock().unwrap(), 3);
        assert!(c.resolve("stranger", &t, t0 + MISS_TTL).0.is_none());
        assert_eq!(*t.1.lock().unwrap(), 4);
    }

    /// However many pods are seen, the cache holds at most CACHE_CAP entries.
    #[test]
    fn the_cache_is_bounded() {
        let t = Table(vec![], Mutex::new(0));
        let mut c = PodCache::default();
        let t0 = Instant::now();
        for i in 0..CACHE_CAP + 10 {
            c.resolve(&format!("p{i}"), &t, t0);
        }
        assert_eq!(c.len(), CACHE_CAP);
    }
}
