//! Live pod → claim mapping for the watchdog.
//!
//! The checkpoint records a claim's pods once, from `status.reservedFor` at prepare,
//! and prepare returns early for a claim already prepared: a pod that joins a shared
//! claim later is not in the record, nor is a pod recorded for one claim that later
//! joins a second shared claim on the same GPU. A claim reserved for a PodGroup (1.37,
//! DRAWorkloadResourceClaims) records no pod at all: `reservedFor` names the group. So
//! the watchdog merges the checkpoint's records with what the API server says every pod
//! with GPU processes uses ([`claims_of`]).
//!
//! The API load is one list of this node's pods per refresh ([`PodCache`]), whatever
//! the number of pods: `fieldSelector=spec.nodeName=<node>` with `resourceVersion=0`
//! (served from the API server's watch cache), plus one `get` per prepared claim some
//! listed pod names (for its UID). A refresh is due every [`REFRESH`], sooner
//! ([`NEW_POD_GAP`]) when a pod with GPU processes is not in the last list, and after
//! [`RETRY`] for pods still missing or after a failure; never while no pod has GPU
//! processes. Refreshes run off the tick, on a thread of their own: a tick waits at
//! most [`TICK_WAIT`] for one, so an API server that does not answer never stalls the
//! watchdog beyond that.
//!
//! A pod's claims, from the Pod object: `spec.resourceClaims[].resourceClaimName`
//! (claims named in the spec), `status.resourceClaimStatuses[].resourceClaimName`
//! (claims generated from templates) and `status.extendedResourceClaimStatus`
//! (extended-resource requests), all in the pod's namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::prepare::checkpoint::{ClaimRecord, ClaimState, PodRef};

/// A ResourceClaim a live pod uses, with its UID as the API server has it now (a claim
/// whose UID could not be read is left out: a name alone may be a stale record's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveClaim {
    pub name: String,
    pub uid: String,
}

/// A pod on this node as the API server has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub claims: Vec<LiveClaim>,
    /// Names of prepared claims the pod uses that could not be read: left out of
    /// `claims`, so the pod's budget may be larger than known and the watchdog kills
    /// none of its processes until they are read.
    pub unread: Vec<String>,
}

impl LivePod {
    pub fn pod_ref(&self) -> PodRef {
        PodRef {
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }
}

/// This node's pods as one list answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePods {
    pub pods: Vec<LivePod>,
    /// False when a claim of interest could not be read: it is left out of its pod, and
    /// the list is refreshed again after [`RETRY`].
    pub complete: bool,
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
    #[error("the pod lookup ended without an answer")]
    Lost,
}

/// Lists this node's pods with their claims. Blocking: it runs on a thread of its own.
pub trait PodLookup: Send + Sync {
    /// This node's pods, each with those of its claims that are in `wanted` (namespace,
    /// name), read for their UID.
    fn node_pods(&self, wanted: &BTreeSet<(String, String)>) -> Result<NodePods, LookupError>;
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

/// The prepared claims (UIDs, in checkpoint order) that `pod` uses: same namespace,
/// name and UID (a claim deleted and created again under the same name is another
/// claim). Only claims whose prepare completed. Deterministic.
pub fn claims_of(pod: &LivePod, claims: &BTreeMap<String, ClaimRecord>) -> Vec<String> {
    claims
        .iter()
        .filter(|(_, r)| r.state == ClaimState::PrepareCompleted && r.namespace == pod.namespace)
        .filter(|(uid, r)| {
            pod.claims
                .iter()
                .any(|c| c.name == r.name && c.uid == **uid)
        })
        .map(|(uid, _)| uid.clone())
        .collect()
}

/// (namespace, name) of the claims whose prepare completed: the only claims a live
/// pod's list entry is read for. Deterministic.
pub fn wanted_claims(claims: &BTreeMap<String, ClaimRecord>) -> BTreeSet<(String, String)> {
    claims
        .values()
        .filter(|r| r.state == ClaimState::PrepareCompleted)
        .map(|r| (r.namespace.clone(), r.name.clone()))
        .collect()
}

/// A full refresh at least this often (a pod's claims hardly change:
/// `spec.resourceClaims` is immutable and generated claims are named before its
/// containers start).
pub const REFRESH: Duration = Duration::from_secs(60);
/// A pod with GPU processes that the last list did not have triggers a refresh, at
/// most this often.
pub const NEW_POD_GAP: Duration = Duration::from_secs(1);
/// Pods still missing, a failed list or an unreadable claim: refreshed again after
/// this.
pub const RETRY: Duration = Duration::from_secs(5);
/// Bound on one refresh in the plugin (list and gets together).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a tick waits for a refresh in flight; later ticks pick up a slower one.
pub const TICK_WAIT: Duration = Duration::from_millis(250);

type Answer = Result<NodePods, LookupError>;

/// The last list of this node's pods, by pod UID, and the refresh in flight.
#[derive(Debug, Default)]
pub struct PodCache {
    pods: BTreeMap<String, LivePod>,
    /// When the last refresh started (answered or not).
    started: Option<Instant>,
    /// Whether the last answered refresh succeeded and read every claim.
    complete: bool,
    /// The pod UIDs wanted when the last refresh started.
    asked: BTreeSet<String>,
    in_flight: Option<mpsc::Receiver<Answer>>,
}

impl PodCache {
    /// Whether a refresh is due for pods `wanted` (UIDs with GPU processes) at `now`.
    /// Deterministic; see the module doc.
    pub fn due(&self, wanted: &BTreeSet<String>, now: Instant) -> bool {
        // No pod has GPU processes (or one is in flight): nothing to list for.
        if wanted.is_empty() || self.in_flight.is_some() {
            return false;
        }
        let Some(started) = self.started else {
            return true;
        };
        let age = now.saturating_duration_since(started);
        let missing = || wanted.iter().filter(|u| !self.pods.contains_key(*u));
        age >= REFRESH
            || (age >= RETRY && (!self.complete || missing().next().is_some()))
            || (age >= NEW_POD_GAP && missing().any(|u| !self.asked.contains(u)))
    }

    /// Starts a refresh if one is due (on a thread of its own), then waits up to `wait`
    /// for the one in flight and takes its answer. Returns the error of a failed
    /// refresh, once, for the caller to log; the previous list stays in use.
    pub fn refresh(
        &mut self,
        wanted: &BTreeSet<String>,
        claims: BTreeSet<(String, String)>,
        lookup: &Arc<dyn PodLookup>,
        now: Instant,
        wait: Duration,
    ) -> Option<LookupError> {
        if self.due(wanted, now) {
            let (tx, rx) = mpsc::channel();
            let lookup = lookup.clone();
            let spawned = std::thread::Builder::new()
                .name("watchdog-pods".into())
                .spawn(move || {
                    let _ = tx.send(lookup.node_pods(&claims));
                });
            self.started = Some(now);
            self.asked = wanted.clone();
            match spawned {
                Ok(_) => self.in_flight = Some(rx),
                Err(e) => {
                    tracing::warn!(error = %e, "watchdog: cannot start a pod lookup");
                    self.complete = false;
                    return None;
                }
            }
        }
        let rx = self.in_flight.as_ref()?;
        let answer = match rx.recv_timeout(wait) {
            Ok(a) => a,
            Err(mpsc::RecvTimeoutError::Timeout) => return None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(LookupError::Lost),
        };
        self.in_flight = None;
        match answer {
            Ok(np) => {
                self.complete = np.complete;
                self.pods = np.pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
                None
            }
            Err(e) => {
                self.complete = false;
                Some(e)
            }
        }
    }

    /// The pod with this UID in the last list.
    pub fn get(&self, uid: &str) -> Option<&LivePod> {
        self.pods.get(uid)
    }

    /// Pods held (this node's pods at the last list).
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Looks pods up through the API server: one list of this node's pods
/// (`fieldSelector spec.nodeName=<node>`, all namespaces, `resourceVersion=0`), then
/// one `get` per wanted claim a pod names, for its UID (a claim that cannot be read is
/// left out). RBAC: `list` pods, `get` resourceclaims.
pub struct KubePods {
    pub client: kube::Client,
    pub node: String,
    pub handle: tokio::runtime::Handle,
    /// Bound on one refresh, so that a slow API server cannot hold a lookup thread.
    pub timeout: Duration,
}

impl KubePods {
    async fn list(&self, wanted: &BTreeSet<(String, String)>) -> Answer {
        use kube::api::{Api, ListParams};
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .match_any();
        let list = pods
            .list(&lp)
            .await
            .map_err(|source| LookupError::ListPods {
                node: self.node.clone(),
                source,
            })?;
        let mut complete = true;
        // (namespace, name) → UID, or None when it could not be read; one get each.
        let mut read: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
        let mut unreadable: BTreeSet<(String, String)> = BTreeSet::new();
        let mut out = Vec::new();
        for pod in list.items {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let mut claims = Vec::new();
            let mut unread = Vec::new();
            for name in claim_names(&pod) {
                let key = (namespace.clone(), name.clone());
                if !wanted.contains(&key) {
                    continue;
                }
                if !read.contains_key(&key) {
                    let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
                    let uid = match api.get_opt(&name).await {
                        Ok(c) => c.and_then(|c| c.metadata.uid),
                        Err(e) => {
                            tracing::warn!(namespace = %namespace, claim = %name, error = %e, "watchdog: cannot read a pod's claim; not matching it by name");
                            complete = false;
                            unreadable.insert(key.clone());
                            None
                        }
                    };
                    read.insert(key.clone(), uid);
                }
                // Gone or unreadable: not matched (a prepared claim by that name may be
                // another claim's stale record).
                match read.get(&key) {
                    Some(Some(uid)) => claims.push(LiveClaim {
                        name,
                        uid: uid.clone(),
                    }),
                    Some(None) if unreadable.contains(&key) => unread.push(name),
                    _ => {}
                }
            }
            out.push(LivePod {
                uid: pod.metadata.uid.unwrap_or_default(),
                namespace,
                name: pod.metadata.name.unwrap_or_default(),
                claims,
                unread,
            });
        }
        Ok(NodePods {
            pods: out,
            complete,
        })
    }
}

impl PodLookup for KubePods {
    fn node_pods(&self, wanted: &BTreeSet<(String, String)>) -> Answer {
        self.handle.block_on(async {
            tokio::time::timeout(self.timeout, self.list(wanted))
                .await
                .map_err(|_| LookupError::Timeout(self.timeout))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::checkpoint::ClaimRecord;
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
            metadata: false,
            lib_version: None,
            pods: vec![],
            started_at: 0,
            completed_at: None,
        }
    }

    fn live(ns: &str, claims: &[(&str, &str)]) -> LivePod {
        LivePod {
            uid: "pod".into(),
            namespace: ns.into(),
            name: "p".into(),
            claims: claims
                .iter()
                .map(|(n, u)| LiveClaim {
                    name: n.to_string(),
                    uid: u.to_string(),
                })
                .collect(),
            unread: vec![],
        }
    }

    /// Matching is by namespace, name and UID; only completed prepares count.
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
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (&[("shared", "u1")], &["u1"]),
            // Same name, another UID: the record is of a deleted claim.
            (&[("shared", "new")], &[]),
            (&[("half", "u3")], &[]),
            (&[("old", "u4"), ("shared", "u1")], &["u1", "u4"]),
            (&[("missing", "u9")], &[]),
        ];
        for (pod_claims, want) in cases {
            assert_eq!(
                claims_of(&live("ns", pod_claims), &claims),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{pod_claims:?}"
            );
        }
        assert_eq!(
            wanted_claims(&claims),
            [("ns", "old"), ("ns", "shared"), ("other", "shared")]
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string()))
                .collect()
        );
    }

    /// Counts lists and answers from a fixed table, after `delay`.
    struct Table {
        pods: Vec<LivePod>,
        lists: Mutex<usize>,
        delay: Duration,
    }

    impl Table {
        fn new(pods: Vec<LivePod>, delay: Duration) -> Arc<Self> {
            Arc::new(Table {
                pods,
                lists: Mutex::new(0),
                delay,
            })
        }
        fn lists(&self) -> usize {
            *self.lists.lock().unwrap()
        }
    }

    impl PodLookup for Table {
        fn node_pods(&self, _wanted: &BTreeSet<(String, String)>) -> Result<NodePods, LookupError> {
            *self.lists.lock().unwrap() += 1;
            std::thread::sleep(self.delay);
            Ok(NodePods {
                pods: self.pods.clone(),
                complete: true,
            })
        }
    }

    fn uids(u: &[&str]) -> BTreeSet<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    const WAIT: Duration = Duration::from_secs(5);

    /// One list answers for every pod; a pod found is listed again only at REFRESH;
    /// a pod the list lacks triggers one list after NEW_POD_GAP, then one per RETRY
    /// for all missing pods together.
    #[test]
    fn one_list_serves_every_pod_until_a_refresh_is_due() {
        let t = Table::new(vec![live("ns", &[("shared", "u1")])], Duration::ZERO);
        let lookup: Arc<dyn PodLookup> = t.clone();
        let mut c = PodCache::default();
        let t0 = Instant::now();
        let at = |c: &mut PodCache, wanted: &[&str], dt: Duration| {
            c.refresh(&uids(wanted), BTreeSet::new(), &lookup, t0 + dt, WAIT);
        };
        at(&mut c, &["pod"], Duration::ZERO);
        assert!(c.get("pod").is_some());
        assert_eq!(t.lists(), 1);
        at(&mut c, &["pod"], REFRESH / 2);
        assert_eq!(t.lists(), 1, "found: no list before REFRESH");
        at(&mut c, &["pod", "s1", "s2"], NEW_POD_GAP / 2);
        assert_eq!(t.lists(), 1, "at most one list per NEW_POD_GAP");
        at(&mut c, &["pod", "s1", "s2"], NEW_POD_GAP);
        assert_eq!(t.lists(), 2, "one list for both new pods");
        at(&mut c, &["pod", "s1", "s2"], NEW_POD_GAP * 2);
        assert_eq!(
            t.lists(),
            2,
            "missing pods already asked for wait for RETRY"
        );
        at(&mut c, &["pod", "s1", "s2"], NEW_POD_GAP + RETRY);
        assert_eq!(t.lists(), 3);
        at(&mut c, &["pod"], NEW_POD_GAP + RETRY + REFRESH);
        assert_eq!(t.lists(), 4, "REFRESH");
        assert_eq!(c.len(), 1);
    }

    /// An API server that does not answer stalls a tick for at most the wait: the
    /// list runs on, a later tick picks its answer up, and no second list starts
    /// while one is in flight.
    #[test]
    fn a_slow_list_never_stalls_a_tick_beyond_the_wait() {
        // The list takes 3 s; each refresh waits 50 ms for it. A refresh must return long
        // before the list does (1.5 s is far outside a loaded machine's scheduling noise
        // and far below 3 s), and the answer is used once it arrives.
        let t = Table::new(
            vec![live("ns", &[("shared", "u1")])],
            Duration::from_secs(3),
        );
        let lookup: Arc<dyn PodLookup> = t.clone();
        let mut c = PodCache::default();
        let wait = Duration::from_millis(50);
        let bound = Duration::from_millis(1500);
        let start = Instant::now();
        c.refresh(&uids(&["pod"]), BTreeSet::new(), &lookup, start, wait);
        assert!(start.elapsed() < bound, "{:?}", start.elapsed());
        assert!(c.get("pod").is_none());
        assert!(!c.due(&uids(&["pod", "other"]), start + REFRESH));
        let found = loop {
            let now = Instant::now();
            c.refresh(&uids(&["pod"]), BTreeSet::new(), &lookup, now, wait);
            assert!(now.elapsed() < bound, "{:?}", now.elapsed());
            if c.get("pod").is_some() {
                break now;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "never answered");
        };
        assert!(found >= start + Duration::from_millis(2900));
        assert_eq!(t.lists(), 1);
    }

    /// A failed list keeps the last list and is retried after RETRY.
    #[test]
    fn a_failed_list_is_retried_after_retry() {
        struct Failing(Mutex<usize>);
        impl PodLookup for Failing {
            fn node_pods(&self, _: &BTreeSet<(String, String)>) -> Result<NodePods, LookupError> {
                *self.0.lock().unwrap() += 1;
                Err(LookupError::Timeout(LOOKUP_TIMEOUT))
            }
        }
        let f = Arc::new(Failing(Mutex::new(0)));
        let lookup: Arc<dyn PodLookup> = f.clone();
        let mut c = PodCache::default();
        let t0 = Instant::now();
        let err = c.refresh(&uids(&["pod"]), BTreeSet::new(), &lookup, t0, WAIT);
        assert!(matches!(err, Some(LookupError::Timeout(_))), "{err:?}");
        assert!(!c.due(&uids(&["pod"]), t0 + RETRY / 2));
        assert!(c.due(&uids(&["pod"]), t0 + RETRY));
        assert!(!c.due(&uids(&[]), t0 + REFRESH), "no GPU process, no list");
    }
}
