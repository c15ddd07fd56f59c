//! The service that keeps each prepared claim's `status.devices` true: it writes a
//! claim's entries after its prepare, removes them after its unprepare, turns `Ready`
//! false (and back) as the health watcher reports its devices, and re-asserts every
//! prepared claim at start-up.
//!
//! Level-based: a claim is queued by key, and what is written is derived at write time
//! from the checkpoint and the latest health (`super::desired_statuses`), so the order
//! of prepares, unprepares and health changes does not matter. A status write never
//! fails or delays a prepare: the gRPC handler only queues. A failed write is logged
//! (`tessera_claim_errors_total{op="claim_status"}`) and retried with a backoff from
//! [`RETRY_FIRST`] doubling to [`RETRY_MAX`], until it succeeds or the claim is gone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::claim_status::writer::{ClaimKey, ClaimStatusWriter, Written};
use crate::claim_status::{Health, desired_statuses};
use crate::config::ManagedGpu;
use crate::kubelet::proto::health_v1alpha1 as pb;
use crate::prepare::checkpoint::{ClaimRecord, ClaimState};
use crate::prepare::state::DeviceState;

/// The first retry of a failed write comes after this long.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Retries back off to at most this.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// Where the gRPC handlers report that a claim was prepared or unprepared. Cloneable;
/// never blocks. Sending after the reporter stopped does nothing.
#[derive(Debug, Clone)]
pub struct StatusQueue(mpsc::UnboundedSender<ClaimKey>);

impl StatusQueue {
    /// Queues `key` for a status write (its entries, or their removal once it is no
    /// longer prepared).
    pub fn claim_changed(&self, key: ClaimKey) {
        let _ = self.0.send(key);
    }
}

/// A new queue and the receiving end for [`Reporter::new`].
pub fn queue() -> (StatusQueue, mpsc::UnboundedReceiver<ClaimKey>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (StatusQueue(tx), rx)
}

/// The delay before retry number `attempt` (0 = the first retry). Deterministic.
pub fn backoff(attempt: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
        .min(RETRY_MAX)
}

/// Each device's health from the health stream's device list: unhealthy devices with
/// their message; healthy and unknown ones healthy. Deterministic.
pub fn health_of(list: &[pb::DeviceHealth]) -> BTreeMap<String, Health> {
    list.iter()
        .filter_map(|d| {
            let name = d.device.as_ref()?.device_name.clone();
            let h = if d.health == pb::HealthStatus::Unhealthy as i32 {
                Health::Unhealthy(d.message.clone())
            } else {
                Health::Healthy
            };
            Some((name, h))
        })
        .collect()
}

/// Now, to the second (what the API server keeps of a condition's time).
fn now_seconds() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let secs = i64::try_from(crate::clock::unix_secs()).unwrap_or(0);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(secs)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// A queued claim: when to write next, and how many writes failed in a row.
#[derive(Debug, Clone, Copy)]
struct Pending {
    due: Instant,
    failures: u32,
}

/// The entries with their condition times blanked: what changed, for skipping a write
/// that would change nothing.
fn fingerprint(entries: &[AllocatedDeviceStatus]) -> Vec<AllocatedDeviceStatus> {
    let mut v = entries.to_vec();
    for c in v.iter_mut().flat_map(|e| e.conditions.iter_mut().flatten()) {
        c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
    }
    v
}

/// The `status.devices` service of one plugin.
pub struct Reporter {
    driver: String,
    gpus: Vec<ManagedGpu>,
    state: Arc<DeviceState>,
    writer: Box<dyn ClaimStatusWriter>,
    queue: mpsc::UnboundedReceiver<ClaimKey>,
    health: watch::Receiver<Vec<pb::DeviceHealth>>,
    /// What was last written per claim (fingerprints), to skip writes of the same.
    written: BTreeMap<ClaimKey, Vec<AllocatedDeviceStatus>>,
    pending: BTreeMap<ClaimKey, Pending>,
}

impl Reporter {
    pub fn new(
        state: Arc<DeviceState>,
        writer: Box<dyn ClaimStatusWriter>,
        queue: mpsc::UnboundedReceiver<ClaimKey>,
        health: watch::Receiver<Vec<pb::DeviceHealth>>,
    ) -> Self {
        Reporter {
            driver: state.config().driver.clone(),
            gpus: state.gpus().to_vec(),
            state,
            writer,
            queue,
            health,
            written: BTreeMap::new(),
            pending: BTreeMap::new(),
        }
    }

    /// Runs until `stop`: see the module doc.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut health_open = true;
        self.queue_all_prepared().await;
        loop {
            self.write_due().await;
            let next = self.pending.values().map(|p| p.due).min();
            tokio::select! {
                () = stop.cancelled() => return,
                Some(key) = self.queue.recv() => self.queue_now(key),
                changed = self.health.changed(), if health_open => {
                    if changed.is_err() {
                        health_open = false;
                    } else {
                        self.queue_all_prepared().await;
                    }
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
            }
        }
    }

    fn queue_now(&mut self, key: ClaimKey) {
        self.pending.insert(
            key,
            Pending {
                due: Instant::now(),
                failures: 0,
            },
        );
    }

    /// Queues every claim of the checkpoint (their writes are skipped where nothing
    /// changed since the last one).
    async fn queue_all_prepared(&mut self) {
        for (uid, r) in self.records().await {
            let key = ClaimKey {
                uid,
                namespace: r.namespace,
                name: r.name,
            };
            self.pending.entry(key).or_insert(Pending {
                due: Instant::now(),
                failures: 0,
            });
        }
    }

    /// The checkpoint's claims, read on a blocking thread; empty (logged) when it
    /// cannot be read.
    async fn records(&self) -> BTreeMap<String, ClaimRecord> {
        let state = self.state.clone();
        match tokio::task::spawn_blocking(move || state.prepared()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                warn!(error = %crate::error_chain::cause_chain(&e), "claim status: cannot read the checkpoint");
                BTreeMap::new()
            }
            Err(e) => {
                warn!(error = %e, "claim status: the checkpoint read failed");
                BTreeMap::new()
            }
        }
    }

    /// Writes every claim whose time has come.
    async fn write_due(&mut self) {
        let now = Instant::now();
        let due: Vec<ClaimKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let records = self.records().await;
        let health = health_of(&self.health.borrow());
        for key in due {
            let span = info_span!("claim_status", claim = %key.uid, namespace = %key.namespace, name = %key.name);
            let ours = records
                .get(&key.uid)
                .filter(|r| r.state == ClaimState::PrepareCompleted)
                .map(|r| desired_statuses(&self.driver, r, &self.gpus, &health, now_seconds()))
                .unwrap_or_default();
            // A claim still being prepared or unprepared is queued again by its handler.
            if records
                .get(&key.uid)
                .is_some_and(|r| r.state != ClaimState::PrepareCompleted)
            {
                self.pending.remove(&key);
                continue;
            }
            let print = fingerprint(&ours);
            if self.written.get(&key) == Some(&print) {
                self.pending.remove(&key);
                continue;
            }
            let r = self
                .writer
                .write(&key, &self.driver, ours)
                .instrument(span.clone())
                .await;
            let _g = span.enter();
            match r {
                Ok(w) => {
                    debug!(outcome = ?w, "claim status written");
                    self.pending.remove(&key);
                    match (w, print.is_empty()) {
                        (Written::Gone, _) | (_, true) => {
                            self.written.remove(&key);
                        }
                        _ => {
                            self.written.insert(key, print);
                        }
                    }
                }
                Err(e) => {
                    crate::telemetry::metrics::driver().error("claim_status", e.reason());
                    let failures = self.pending.get(&key).map_or(0, |p| p.failures);
                    let delay = backoff(failures);
                    warn!(error = %crate::error_chain::cause_chain(&e), retry_in = ?delay, "cannot write the claim's status.devices; retrying");
                    self.pending.insert(
                        key,
                        Pending {
                            due: Instant::now() + delay,
                            failures: failures.saturating_add(1),
                        },
                    );
                }
            }
        }
    }
}
