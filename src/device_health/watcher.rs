//! Device health at run time: the watcher that polls the backend's health events,
//! keeps the [`NodeHealth`] and republishes the pool on every change, and the DRA
//! health gRPC service (`v1alpha1.DRAResourceHealth`, `NodeWatchResources`) that
//! streams the complete device list with each device's health to the kubelet.
//!
//! An XID naming a MIG GPU instance is resolved to that instance's placement, so that
//! only the devices overlapping it turn unhealthy. The watcher keeps the placement of
//! every GPU instance as of its previous poll (from discovery, then the backend's MIG
//! status of each `mig`-mode GPU, re-read every poll): a fatal XID usually kills the
//! pod, whose unprepare destroys the instance before the poll drains the XID, so the
//! placement it had is taken from that cache ([`resolve_instance`]). GPU instance IDs
//! are reused; when the ID names a different placement now than at the previous poll,
//! the XID is charged to both (it happened on one of them). Only an instance never
//! seen is charged to the whole GPU. Each poll also clears the states whose quiet
//! period passed ([`NodeHealth::expire`]).
//!
//! The watcher owns the health model; both outputs are `watch` channels: the pool goes
//! to the publisher (`Publisher::run`), the device list to every open health stream.
//! A stream sends the list at once, on every change, and every
//! [`RESEND_INTERVAL`] (the kubelet marks devices it has not heard of for
//! [`HEALTH_TIMEOUT_SECONDS`] as Unknown).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use std::collections::BTreeMap;

use crate::device_health::policy::{Applied, At, DeviceHealth, NodeHealth, Scope, Span};
use crate::inventory::{GpuBackend, HealthEvent, HealthEventKind};
use crate::kubelet::proto::health_v1alpha1 as pb;
use crate::node::NodeModel;
use crate::publish::slices::{self, ServerFeatures};
use k8s_model::release::KubeVersion;

/// How often the backend is polled for health events.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How often an open health stream repeats the list when nothing changed.
pub const RESEND_INTERVAL: Duration = Duration::from_secs(20);
/// `health_check_timeout_seconds` of every entry: well above [`RESEND_INTERVAL`].
pub const HEALTH_TIMEOUT_SECONDS: i64 = 60;
/// The kubelet truncates longer messages.
const MAX_MESSAGE: usize = 1024;

/// The node's devices and their health, as the watcher sees them.
pub struct HealthWatcher {
    model: NodeModel,
    driver: String,
    node: String,
    version: KubeVersion,
    features: ServerFeatures,
    health: NodeHealth,
    since: u64,
    /// Every device of the pool, healthy or not, with its GPU minor and placement.
    devices: Vec<(String, u32, Option<Span>)>,
    /// The placement of each (GPU minor, GPU instance ID) as of the previous poll.
    placements: Placements,
}

/// GPU instance placements by (GPU minor, GPU instance ID).
pub type Placements = BTreeMap<(u32, u32), Span>;

/// The placements of the instances in `st`, of GPU `minor`.
fn placements_of(
    minor: u32,
    st: &crate::inventory::MigStatus,
) -> impl Iterator<Item = ((u32, u32), Span)> + '_ {
    st.instances.iter().map(move |i| {
        (
            (minor, i.gi_id),
            Span {
                start: i.start,
                size: i.size,
            },
        )
    })
}

/// Where an XID naming GPU instance `gi_id` of GPU `minor` happened, from the
/// placements at the previous poll (`before`) and now (`now`, `None` when the MIG
/// status could not be read): the instance's placement; both when the ID names a
/// different placement now (destroyed and reused since: the XID was one of them's);
/// the whole GPU only when the instance is in neither. Deterministic.
pub fn resolve_instance(
    minor: u32,
    gi_id: u32,
    before: &Placements,
    now: Option<&Placements>,
) -> Vec<Scope> {
    let mut spans: Vec<Span> = Vec::new();
    for span in [
        before.get(&(minor, gi_id)),
        now.and_then(|n| n.get(&(minor, gi_id))),
    ]
    .into_iter()
    .flatten()
    {
        if !spans.contains(span) {
            spans.push(*span);
        }
    }
    if spans.is_empty() {
        return vec![Scope::Gpu];
    }
    spans
        .into_iter()
        .map(|span| Scope::Instance { gi_id, span })
        .collect()
}

impl HealthWatcher {
    /// A watcher with every GPU healthy, under the node config's health policy.
    pub fn new(
        model: NodeModel,
        driver: &str,
        node: &str,
        version: KubeVersion,
        features: ServerFeatures,
    ) -> Self {
        let mut gpus: Vec<_> = model.gpus.iter().collect();
        gpus.sort_by_key(|g| g.gpu.minor);
        let devices = gpus
            .iter()
            .flat_map(|g| {
                let (devs, _) = slices::placed_devices(
                    g,
                    &model.inventory,
                    model.mig.get(&g.gpu.minor),
                    features,
                    model.config.shared_slots,
                );
                devs.into_iter()
                    .map(|(d, span)| (d.name, g.gpu.minor, span))
            })
            .collect();
        let placements = model
            .mig
            .iter()
            .flat_map(|(minor, st)| placements_of(*minor, st))
            .collect();
        HealthWatcher {
            placements,
            health: NodeHealth::new(model.config.health.clone()),
            model,
            driver: driver.into(),
            node: node.into(),
            version,
            features,
            since: 0,
            devices,
        }
    }

    pub fn health(&self) -> &NodeHealth {
        &self.health
    }

    /// The pool with the current health.
    pub fn pool(&self) -> Vec<ResourceSlice> {
        self.model.pool_with_health(
            &self.driver,
            &self.node,
            self.version,
            self.features,
            &self.health,
        )
    }

    /// The complete device list for the health stream, stamped `now`.
    pub fn device_list(&self, now: i64) -> Vec<pb::DeviceHealth> {
        self.devices
            .iter()
            .map(|(name, minor, span)| {
                let (status, message) = match self.health.device_health(*minor, *span) {
                    DeviceHealth::Healthy => (pb::HealthStatus::Healthy, "healthy".to_string()),
                    DeviceHealth::Unhealthy(u) => {
                        let what = if self.features.device_taints {
                            format!(
                                "tainted {}={}:{}",
                                crate::device_health::policy::TAINT_KEY,
                                u.cause.reason(),
                                u.action.effect().unwrap_or("NoSchedule")
                            )
                        } else {
                            "left out of the ResourceSlice (the API server drops taints)".into()
                        };
                        (
                            pb::HealthStatus::Unhealthy,
                            format!("{}; {what}", u.message),
                        )
                    }
                };
                pb::DeviceHealth {
                    device: Some(pb::DeviceIdentifier {
                        pool_name: self.node.clone(),
                        device_name: name.clone(),
                    }),
                    health: status as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: HEALTH_TIMEOUT_SECONDS,
                    message: truncate(message),
                }
            })
            .collect()
    }

    /// Applies events the backend reported at `now`; `current` holds the placement of
    /// each GPU instance of the `mig`-mode GPUs now (`None` for a GPU whose MIG status
    /// could not be read), and becomes the cache for the next call. True when any
    /// device's health changed.
    pub fn apply(
        &mut self,
        events: &[HealthEvent],
        current: &BTreeMap<u32, Option<Placements>>,
        now: At,
    ) -> bool {
        let mut changed = false;
        for e in events {
            self.since = self.since.max(e.seq);
            let scopes = match e.gi_id {
                None => vec![Scope::Gpu],
                Some(gi_id) => {
                    let now_known = current.get(&e.minor).and_then(Option::as_ref);
                    let scopes = resolve_instance(e.minor, gi_id, &self.placements, now_known);
                    if scopes == [Scope::Gpu] {
                        warn!(
                            gpu = e.minor,
                            gi = gi_id,
                            "health event names a GPU instance never seen: attributing it to the whole GPU"
                        );
                    }
                    scopes
                }
            };
            for scope in scopes {
                changed |= self.apply_one(e, scope, now);
            }
        }
        for (minor, st) in current {
            if let Some(st) = st {
                self.placements.retain(|(m, _), _| m != minor);
                self.placements.extend(st.iter().map(|(k, v)| (*k, *v)));
            }
        }
        changed
    }

    /// Applies one event to one scope and logs what it did; true when it changed.
    fn apply_one(&mut self, e: &HealthEvent, scope: Scope, now: At) -> bool {
        let r = self.health.apply_in(e, scope, now);
        let kind = match e.kind {
            HealthEventKind::Xid(x) => format!("XID {x}"),
            HealthEventKind::Lost => "GPU lost".into(),
            HealthEventKind::Recovered => "recovered".into(),
        };
        let gi = e.gi_id.map(i64::from).unwrap_or(-1);
        let state = match scope {
            Scope::Gpu => self.health.unhealthy(e.minor),
            Scope::Instance { .. } => self.health.all_unhealthy().get(&(e.minor, scope)),
        };
        match (&r, state) {
            (Applied::Changed, Some(u)) if self.features.device_taints => warn!(
                gpu = e.minor, gi, event = %kind, effect = u.action.effect().unwrap_or("-"),
                "GPU unhealthy: tainting its devices"
            ),
            (Applied::Changed, Some(_)) => warn!(
                gpu = e.minor, gi, event = %kind,
                "GPU unhealthy: leaving its devices out of the ResourceSlices (the API server drops device taints)"
            ),
            (Applied::Changed, None) => {
                info!(gpu = e.minor, "GPU healthy again: republishing its devices")
            }
            (Applied::Ignored, _) => {
                info!(gpu = e.minor, gi, event = %kind, "health event ignored by policy")
            }
            (Applied::Unchanged, _) => {
                info!(gpu = e.minor, gi, event = %kind, "health event changes nothing")
            }
        }
        r == Applied::Changed
    }

    /// Clears the states whose quiet period passed at `now` (monotonic); true when any
    /// did.
    pub fn expire(&mut self, now: std::time::Instant) -> bool {
        let cleared = self.health.expire(now);
        for ((minor, scope), u) in &cleared {
            let gi = match scope {
                Scope::Gpu => -1,
                Scope::Instance { gi_id, .. } => i64::from(*gi_id),
            };
            info!(
                gpu = minor, gi, cause = %u.cause.reason(), quiet_seconds = u.clear_after.unwrap_or(0),
                "no new XID for the quiet period: clearing the taint"
            );
        }
        !cleared.is_empty()
    }

    /// Polls the backend once (on a blocking thread: the events, then the MIG status
    /// of every `mig`-mode GPU), applies what it reported and clears what went quiet.
    pub async fn poll(&mut self) -> Result<bool, crate::inventory::BackendError> {
        let backend: Arc<dyn GpuBackend> = self.model.backend.clone();
        let since = self.since;
        let mig_gpus: Vec<u32> = self.model.mig.keys().copied().collect();
        let polled = tokio::task::spawn_blocking(move || {
            let events = backend.health_events(since)?;
            // Read after the events: an instance that had an XID and is gone now is
            // in the previous poll's placements.
            let current: BTreeMap<u32, Option<Placements>> = mig_gpus
                .into_iter()
                .map(|minor| match backend.mig_status(minor) {
                    Ok(st) => (minor, Some(placements_of(minor, &st).collect())),
                    Err(e) => {
                        warn!(gpu = minor, error = %e, "cannot read the MIG status for health events");
                        (minor, None)
                    }
                })
                .collect();
            Ok::<_, crate::inventory::BackendError>((events, current))
        })
        .await;
        let (events, current) = match polled {
            Ok(r) => r?,
            Err(e) => {
                warn!(error = %e, "health poll task failed");
                (Vec::new(), BTreeMap::new())
            }
        };
        let now = At::now();
        let changed = self.apply(&events, &current, now);
        Ok(self.expire(now.mono) || changed)
    }

    /// Polls every `interval` until `stop` is cancelled; on each change sends the new
    /// pool and device list. Ends (dropping both senders) on stop.
    pub async fn run(
        mut self,
        interval: Duration,
        slices_tx: watch::Sender<Vec<ResourceSlice>>,
        devices_tx: watch::Sender<Vec<pb::DeviceHealth>>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut failing = false;
        loop {
            let changed = match self.poll().await {
                Ok(changed) => {
                    failing = false;
                    changed
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "cannot read GPU health events");
                    }
                    failing = true;
                    // Quiet periods still run out while the backend cannot answer.
                    self.expire(At::now().mono)
                }
            };
            if changed {
                let _ = slices_tx.send(self.pool());
                let _ = devices_tx.send(self.device_list(crate::clock::unix_secs() as i64));
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - 3;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// `v1alpha1.DRAResourceHealth` on the DRA socket.
#[derive(Clone)]
pub struct HealthService {
    devices: watch::Receiver<Vec<pb::DeviceHealth>>,
}

impl HealthService {
    pub fn new(devices: watch::Receiver<Vec<pb::DeviceHealth>>) -> Self {
        HealthService { devices }
    }
}

type HealthStream =
    Pin<Box<dyn Stream<Item = Result<pb::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let mut rx = self.devices.clone();
        rx.mark_changed();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            tokio::select! {
                r = rx.changed() => r.ok()?,
                _ = tokio::time::sleep(RESEND_INTERVAL) => {}
            }
            let now = crate::clock::unix_secs() as i64;
            let mut devices = rx.borrow_and_update().clone();
            for d in &mut devices {
                d.last_updated_time = now;
            }
            Some((Ok(pb::NodeWatchResourcesResponse { devices }), rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance's XID goes to its placement at the previous poll or now (both when
    /// the ID was reused for another placement since), and to the whole GPU only
    /// when the instance was never seen.
    #[test]
    fn instance_xids_resolve_to_known_placements() {
        let span = |start, size| Span { start, size };
        let inst = |gi_id, span| Scope::Instance { gi_id, span };
        let before: Placements = [((0, 5), span(4, 2)), ((1, 5), span(0, 1))].into();
        let reused: Placements = [((0, 5), span(0, 1))].into();
        let same: Placements = [((0, 5), span(4, 2))].into();
        let appeared: Placements = [((0, 7), span(6, 1))].into();
        let empty = Placements::new();
        for (gi, now, want) in [
            (5, Some(&empty), vec![inst(5, span(4, 2))]),
            (5, None, vec![inst(5, span(4, 2))]),
            (5, Some(&same), vec![inst(5, span(4, 2))]),
            (
                5,
                Some(&reused),
                vec![inst(5, span(4, 2)), inst(5, span(0, 1))],
            ),
            (7, Some(&appeared), vec![inst(7, span(6, 1))]),
            (7, Some(&empty), vec![Scope::Gpu]),
            (7, None, vec![Scope::Gpu]),
        ] {
            assert_eq!(
                resolve_instance(0, gi, &before, now),
                want,
                "gi {gi} now {now:?}"
            );
        }
    }

    /// Messages are cut to the kubelet's 1024 characters, ending in `...`.
    #[test]
    fn long_messages_are_truncated() {
        assert_eq!(truncate("ok".into()), "ok");
        let t = truncate("é".repeat(1000));
        assert!(t.len() <= MAX_MESSAGE && t.ends_with("..."));
    }
}
