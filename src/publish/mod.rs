//! Publishing the node's pool of ResourceSlices (kube-rs, `resource.k8s.io/v1`).
//!
//! Mirrors the upstream Go helper (`kubernetes-dra-api.md` §6): slices are owned by the
//! Node, named with the indexed `generateName`, written only when something changed,
//! stale ones deleted (with uid + resourceVersion preconditions), the pool generation
//! bumped when more than one slice changes, and the pool republished when somebody
//! (the kubelet at its start) deletes our slices. Before writing, the desired pool is
//! validated against the server version's limits; an invalid pool is refused.

pub mod conflicts;
pub mod dryrun;
pub mod echoes;
pub mod slices;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::publish::slices::{ServerFeatures, parse_slice_index};
use k8s_model::release::{FeatureGates, KubeVersion, VersionError};
use k8s_model::validation;

/// Errors of one publish step. `Display` names the step; the API error is the source.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("API call failed: {step}")]
    Api {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("API server version is not supported")]
    Version(#[source] VersionError),
    #[error("refusing to publish an invalid pool for Kubernetes {version}: {}", reasons.join("; "))]
    InvalidPool {
        version: KubeVersion,
        reasons: Vec<String>,
    },
}

fn api(step: &'static str) -> impl FnOnce(kube::Error) -> PublishError {
    move |source| PublishError::Api { step, source }
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    /// The pool generation now published.
    pub generation: i64,
}

impl SyncReport {
    pub fn writes(&self) -> usize {
        self.created + self.updated + self.deleted
    }
}

/// Whether two slice specs are equal apart from the pool generation (which the
/// publisher assigns). Compares field by field, without cloning the device lists.
pub fn same_ignoring_generation(a: &ResourceSliceSpec, b: &ResourceSliceSpec) -> bool {
    // Destructured so that a field added to the API type fails to compile here.
    let ResourceSliceSpec {
        all_nodes,
        devices,
        driver,
        node_name,
        node_selector,
        partition_type_attribute,
        per_device_node_selection,
        pool,
        shared_counters,
        skip_node_operations,
    } = a;
    pool.name == b.pool.name
        && pool.resource_slice_count == b.pool.resource_slice_count
        && *devices == b.devices
        && *shared_counters == b.shared_counters
        && *driver == b.driver
        && *node_name == b.node_name
        && *node_selector == b.node_selector
        && *all_nodes == b.all_nodes
        && *per_device_node_selection == b.per_device_node_selection
        && *partition_type_attribute == b.partition_type_attribute
        && *skip_node_operations == b.skip_node_operations
}

/// Publishes one node-local pool (pool name = node name).
pub struct Publisher {
    slices: Api<ResourceSlice>,
    driver: String,
    node: String,
    version: KubeVersion,
    owner: OwnerReference,
    /// For each slice index: the spec we last sent and the spec the server stored.
    /// The server may drop gated fields, so "unchanged" means "the server still has
    /// what it made of our last write", not "equal to what we want".
    written: HashMap<usize, (ResourceSliceSpec, ResourceSliceSpec)>,
    /// Where `run` reports each publication's outcome (readiness).
    health: Option<std::sync::Arc<crate::telemetry::http::Health>>,
    /// The NVIDIA device plugin's resources on our Node, seen at start-up.
    device_plugin: Option<crate::publish::conflicts::Conflict>,
    /// Our writes not yet seen coming back through `run`'s watch.
    echoes: echoes::Echoes,
}

impl Publisher {
    /// Learns the server version (`/version`) and the Node's UID for the owner
    /// reference.
    pub async fn new(client: kube::Client, driver: &str, node: &str) -> Result<Self, PublishError> {
        let info = client
            .apiserver_version()
            .await
            .map_err(api("get /version"))?;
        let version =
            KubeVersion::from_server(&info.major, &info.minor).map_err(PublishError::Version)?;
        let nodes: Api<Node> = Api::all(client.clone());
        let n = nodes.get(node).await.map_err(api("get node"))?;
        let device_plugin = crate::publish::conflicts::device_plugin(&n);
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: n.metadata.uid.unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        Ok(Publisher {
            slices: Api::all(client),
            driver: driver.into(),
            node: node.into(),
            version,
            owner,
            written: HashMap::new(),
            health: None,
            device_plugin,
            echoes: echoes::Echoes::default(),
        })
    }

    /// Other owners of our GPUs on this node: the NVIDIA device plugin (seen in the
    /// Node's allocatable at start-up) and other DRA drivers' slices naming our GPU
    /// UUIDs.
    pub async fn conflicts(
        &self,
        uuids: &[String],
    ) -> Result<Vec<crate::publish::conflicts::Conflict>, PublishError> {
        // From the API server's watch cache (resourceVersion 0): a start-up check needs
        // no consistent read, and a consistent read that the cache cannot serve in time
        // goes to etcd, which reads every node's slices to filter ours (at 1,000 plugins
        // starting at once, etcd grew past 10 GB).
        let all = self
            .slices
            .list(
                &ListParams::default()
                    .fields(&format!("spec.nodeName={}", self.node))
                    .match_any(),
            )
            .await
            .map_err(api("list resourceslices"))?;
        let mut out: Vec<_> = self.device_plugin.iter().cloned().collect();
        out.extend(crate::publish::conflicts::other_dra_drivers(
            &all.items,
            &self.driver,
            uuids,
        ));
        Ok(out)
    }

    /// Reports each publication's outcome to `health` (the `/readyz` endpoint).
    pub fn report_to(&mut self, health: std::sync::Arc<crate::telemetry::http::Health>) {
        self.health = Some(health);
    }

    /// The API server's release.
    pub fn version(&self) -> KubeVersion {
        self.version
    }

    fn field_selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }

    /// Validates the desired pool against the server version's limits: each slice as
    /// the server would, plus the cross-slice checks the allocator makes.
    pub fn prevalidate(&self, desired: &[ResourceSlice]) -> Result<(), PublishError> {
        let gates = FeatureGates::defaults(self.version);
        let mut reasons = Vec::new();
        for (i, s) in desired.iter().enumerate() {
            for e in validation::validate_resource_slice(s, &gates) {
                reasons.push(format!("slice {i}: {e}"));
            }
        }
        let refs: Vec<&ResourceSlice> = desired.iter().collect();
        for p in validation::validate_pool_for(&refs, self.version) {
            reasons.push(p.to_string());
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(PublishError::InvalidPool {
                version: self.version,
                reasons,
            })
        }
    }

    /// Creates with `dryRun=All` one desired slice per gate the pool uses
    /// ([`dryrun::slices_to_probe`]) and reports the fields the server dropped (disabled
    /// feature gates), e.g. `slice 1: spec.devices[0].allowMultipleAllocations`: the
    /// examples found in the probed slices. Writes nothing.
    pub async fn detect_dropped_fields(
        &self,
        desired: &[ResourceSlice],
    ) -> Result<Vec<String>, PublishError> {
        let mut dropped = Vec::new();
        for i in dryrun::slices_to_probe(desired) {
            let probe = self.with_metadata(&desired[i], 1, None);
            let stored = self
                .slices
                .create(
                    &PostParams {
                        dry_run: true,
                        field_manager: None,
                    },
                    &probe,
                )
                .await
                .map_err(api("dry-run create resourceslice"))?;
            dropped.extend(
                validation::dropped_fields(&probe, &stored)
                    .into_iter()
                    .map(|path| format!("slice {i}: {path}")),
            );
        }
        dropped.sort();
        dropped.dedup();
        Ok(dropped)
    }

    /// Learns which gated fields the server keeps by creating two probe slices with
    /// `dryRun=All` (nothing is stored): one with a counter set (DRAPartitionableDevices;
    /// from 1.35 a counter set has a slice of its own), and one with two devices, a
    /// multi-allocatable one with a request policy (DRAConsumableCapacity) and a tainted
    /// one (DRADeviceTaints). Run before building the pool, so that Tessera publishes a
    /// layout the server keeps.
    pub async fn probe_features(&self) -> Result<ServerFeatures, PublishError> {
        let probe = |spec: ResourceSliceSpec| ResourceSlice {
            metadata: ObjectMeta {
                generate_name: Some(format!("tessera-probe-{}-", self.node)),
                owner_references: Some(vec![self.owner.clone()]),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: self.driver.clone(),
                node_name: Some(self.node.clone()),
                pool: ResourcePool {
                    name: format!("{}-probe", self.node),
                    generation: 1,
                    resource_slice_count: 1,
                },
                ..spec
            },
        };
        let dry = PostParams {
            dry_run: true,
            field_manager: None,
        };
        let counters = probe(ResourceSliceSpec {
            shared_counters: Some(vec![CounterSet {
                name: "probe".into(),
                counters: BTreeMap::from([(
                    "probe".to_string(),
                    Counter {
                        value: Quantity("1".into()),
                    },
                )]),
            }]),
            ..Default::default()
        });
        let stored = self
            .slices
            .create(&dry, &counters)
            .await
            .map_err(api("dry-run create probe slice"))?;
        let partitionable = stored.spec.shared_counters.is_some_and(|c| !c.is_empty());
        let range = CapacityRequestPolicyRange {
            min: Quantity("1".into()),
            max: None,
            step: Some(Quantity("1".into())),
        };
        let devices = probe(ResourceSliceSpec {
            devices: Some(vec![
                Device {
                    name: "probe-shared".into(),
                    allow_multiple_allocations: Some(true),
                    capacity: Some(BTreeMap::from([(
                        "probe".to_string(),
                        DeviceCapacity {
                            value: Quantity("2".into()),
                            request_policy: Some(CapacityRequestPolicy {
                                default: Some(Quantity("1".into())),
                                valid_range: Some(range),
                                valid_values: None,
                            }),
                        },
                    )])),
                    ..Default::default()
                },
                Device {
                    name: "probe-tainted".into(),
                    taints: Some(vec![DeviceTaint {
                        key: crate::device_health::policy::TAINT_KEY.into(),
                        value: Some("probe".into()),
                        effect: "NoSchedule".into(),
                        time_added: None,
                    }]),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        });
        let stored = self
            .slices
            .create(&dry, &devices)
            .await
            .map_err(api("dry-run create probe slice"))?;
        let stored_device = |name: &str| {
            stored
                .spec
                .devices
                .iter()
                .flatten()
                .find(|d| d.name == name)
        };
        let consumable_capacity = stored_device("probe-shared")
            .is_some_and(|d| d.allow_multiple_allocations == Some(true));
        let device_taints = stored_device("probe-tainted")
            .is_some_and(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()));
        if !partitionable {
            info!(
                kubernetes = %self.version,
                "the API server drops counter sets (DRAPartitionableDevices off): MIG-mode GPUs publish live MIG devices or the whole GPU"
            );
        }
        Ok(ServerFeatures {
            partitionable,
            consumable_capacity,
            device_taints,
        })
    }

    fn with_metadata(
        &self,
        desired: &ResourceSlice,
        generation: i64,
        base: Option<&ResourceSlice>,
    ) -> ResourceSlice {
        let mut s = desired.clone();
        s.spec.pool.generation = generation;
        s.metadata.owner_references = Some(vec![self.owner.clone()]);
        if let Some(base) = base {
            s.metadata.name = base.metadata.name.clone();
            s.metadata.generate_name = base.metadata.generate_name.clone();
            s.metadata.resource_version = base.metadata.resource_version.clone();
            s.metadata.uid = base.metadata.uid.clone();
        }
        s
    }

    fn unchanged(&self, index: usize, existing: &ResourceSlice, desired: &ResourceSlice) -> bool {
        let (have, want) = (&existing.spec, &desired.spec);
        if same_ignoring_generation(have, want) {
            return true;
        }
        matches!(self.written.get(&index), Some((sent, stored))
            if same_ignoring_generation(sent, want) && same_ignoring_generation(stored, have))
    }

    /// Makes the server's pool equal to `desired` with as few writes as possible.
    /// Zero writes when nothing changed. Order: delete obsolete, update changed, create
    /// missing.
    pub async fn sync(&mut self, desired: &[ResourceSlice]) -> Result<SyncReport, PublishError> {
        self.prevalidate(desired)?;
        let list = self
            .slices
            .list(&ListParams::default().fields(&self.field_selector()))
            .await
            .map_err(api("list resourceslices"))?;
        self.apply(desired, list.items).await
    }

    /// [`Publisher::sync`] against `listed`, the node's slices of this driver as just
    /// listed (`run`'s first sync uses its watch's initial list: one LIST, not two).
    async fn sync_listed(
        &mut self,
        desired: &[ResourceSlice],
        listed: Vec<ResourceSlice>,
    ) -> Result<SyncReport, PublishError> {
        self.prevalidate(desired)?;
        self.apply(desired, listed).await
    }

    /// Writes what makes the listed pool equal to `desired` (validated).
    async fn apply(
        &mut self,
        desired: &[ResourceSlice],
        listed: Vec<ResourceSlice>,
    ) -> Result<SyncReport, PublishError> {
        let existing: Vec<ResourceSlice> = listed
            .into_iter()
            .filter(|s| s.spec.pool.name == self.node)
            .collect();
        let max_gen = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let mut obsolete = Vec::new();
        let mut by_index: BTreeMap<usize, ResourceSlice> = BTreeMap::new();
        for s in existing {
            let name = s.metadata.name.clone().unwrap_or_default();
            match parse_slice_index(&name, &self.driver, &self.node) {
                Some(i)
                    if s.spec.pool.generation == max_gen
                        && i < desired.len()
                        && !by_index.contains_key(&i) =>
                {
                    by_index.insert(i, s);
                }
                _ => obsolete.push(s),
            }
        }
        let changed: Vec<usize> = by_index
            .iter()
            .filter(|(i, s)| !self.unchanged(**i, s, &desired[**i]))
            .map(|(i, _)| *i)
            .collect();
        let missing: Vec<usize> = (0..desired.len())
            .filter(|i| !by_index.contains_key(i))
            .collect();
        let mut report = SyncReport {
            generation: max_gen,
            ..Default::default()
        };
        if obsolete.is_empty() && changed.is_empty() && missing.is_empty() {
            return Ok(report);
        }
        // Keep the generation for a single in-place change; otherwise bump it and
        // rewrite every slice, so consumers never mix old and new slices.
        let (generation, to_update): (i64, Vec<usize>) =
            if missing.is_empty() && changed.len() <= 1 && max_gen > 0 {
                (max_gen, changed)
            } else {
                (max_gen + 1, by_index.keys().copied().collect())
            };
        report.generation = generation;
        for s in &obsolete {
            let name = s.metadata.name.clone().unwrap_or_default();
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: s.metadata.uid.clone(),
                    resource_version: s.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            match self.slices.delete(&name, &dp).await {
                Ok(_) => {
                    self.echoes.deleted(s);
                    report.deleted += 1;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(api("delete resourceslice")(e)),
            }
        }
        for i in to_update {
            let base = &by_index[&i];
            let obj = self.with_metadata(&desired[i], generation, Some(base));
            let name = base.metadata.name.clone().unwrap_or_default();
            let stored = self
                .slices
                .replace(&name, &PostParams::default(), &obj)
                .await
                .map_err(api("update resourceslice"))?;
            // A replace the server found to change nothing keeps the resourceVersion
            // and sends no event: nothing to wait for.
            if stored.metadata.resource_version != obj.metadata.resource_version {
                self.echoes.stored(&stored);
            }
            self.written.insert(i, (obj.spec, stored.spec));
            report.updated += 1;
        }
        for i in missing {
            let obj = self.with_metadata(&desired[i], generation, None);
            let stored = self
                .slices
                .create(&PostParams::default(), &obj)
                .await
                .map_err(api("create resourceslice"))?;
            self.echoes.stored(&stored);
            self.written.insert(i, (obj.spec, stored.spec));
            report.created += 1;
        }
        info!(
            node = %self.node,
            generation,
            created = report.created,
            updated = report.updated,
            deleted = report.deleted,
            "published ResourceSlices"
        );
        Ok(report)
    }

    /// Keeps the pool published until `shutdown` resolves: syncs whenever the desired
    /// pool changes or somebody else changes our slices on the server (for example the
    /// kubelet wiping them at its start), retrying failures with a capped backoff. Our
    /// own writes coming back through the watch cause no sync ([`echoes`]). Leaves the
    /// slices in place at shutdown (the kubelet wipes them when the driver is gone).
    pub async fn run(
        mut self,
        mut desired: watch::Receiver<Vec<ResourceSlice>>,
        debounce: Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        // One unpaginated list from the watch cache (resourceVersion 0), as client-go's
        // informers list and as the Go kubelet-plugin helper's publisher works from. A
        // paginated or consistent list that the cache cannot serve in time goes to etcd,
        // which reads every node's slices to filter ours: at 1,000 plugins starting at
        // once, etcd ran out of memory. A cached list may be a moment old; the watch
        // starts from its resourceVersion, so whatever it missed comes as somebody
        // else's change and causes a sync with a consistent LIST.
        let mut cfg = watcher::Config::default()
            .fields(&self.field_selector())
            .any_semantic();
        cfg.page_size = None;
        let mut events = watcher(self.slices.clone(), cfg).default_backoff().boxed();
        tokio::pin!(shutdown);
        // The first sync works from the watch's initial list instead of a LIST of its own.
        let mut listed: Option<Vec<ResourceSlice>> = None;
        let mut initial = Vec::new();
        while listed.is_none() {
            tokio::select! {
                _ = &mut shutdown => return,
                ev = events.next() => match ev {
                    Some(Ok(watcher::Event::Init)) => initial.clear(),
                    Some(Ok(watcher::Event::InitApply(s))) => initial.push(s),
                    Some(Ok(watcher::Event::InitDone)) => listed = Some(std::mem::take(&mut initial)),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        // The watcher retries with its own backoff.
                        warn!(error = %e, "listing our ResourceSlices failed");
                        if let Some(h) = &self.health {
                            h.set_published(Err(format!("listing our ResourceSlices failed: {e}")));
                        }
                    }
                    None => return,
                }
            }
        }
        let mut backoff = Duration::from_millis(200);
        let mut reported_drops: Option<Vec<String>> = None;
        loop {
            let want = desired.borrow_and_update().clone();
            if reported_drops.is_none() {
                match self.detect_dropped_fields(&want).await {
                    Ok(d) if d.is_empty() => reported_drops = Some(d),
                    Ok(d) => {
                        warn!(fields = ?d, "the API server dropped fields of our ResourceSlices (feature gates off)");
                        reported_drops = Some(d);
                    }
                    Err(e) => warn!(error = %e, "dry-run probe for dropped fields failed"),
                }
            }
            let result = match listed.take() {
                Some(l) => match self.sync_listed(&want, l).await {
                    // The cached list was a moment old and a write met a newer object:
                    // sync again at once from a consistent LIST, not after a backoff.
                    Err(PublishError::Api {
                        source: kube::Error::Api(e),
                        ..
                    }) if e.code == 409 => self.sync(&want).await,
                    r => r,
                },
                None => self.sync(&want).await,
            };
            if let Some(h) = &self.health {
                h.set_published(result.as_ref().map(drop).map_err(|e| e.to_string()));
            }
            let retry = match result {
                Ok(_) => {
                    backoff = Duration::from_millis(200);
                    None
                }
                Err(e) => {
                    warn!(error = %e, error_source = ?std::error::Error::source(&e), "publishing ResourceSlices failed");
                    let wait = backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    Some(wait)
                }
            };
            // Wait for a reason to sync again.
            let retry_sleep = tokio::time::sleep(retry.unwrap_or(Duration::from_secs(3600)));
            tokio::pin!(retry_sleep);
            loop {
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = &mut retry_sleep, if retry.is_some() => break,
                    changed = desired.changed() => {
                        if changed.is_err() { return; }
                        reported_drops = None;
                        break;
                    }
                    ev = events.next() => {
                        let theirs = match ev {
                            Some(Ok(watcher::Event::Apply(s))) => !self.echoes.is_own_write(&s),
                            Some(Ok(watcher::Event::Delete(s))) => !self.echoes.is_own_delete(&s),
                            Some(Ok(watcher::Event::InitDone)) => {
                                // A relist: echoes of earlier writes may never come.
                                self.echoes.forget();
                                true
                            }
                            Some(_) => false,
                            None => return,
                        };
                        if theirs {
                            tokio::time::sleep(debounce).await;
                            break;
                        }
                    }
                }
            }
        }
    }
}
