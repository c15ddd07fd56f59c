//! Where the watchdog reports what it did: Warning Events on the offending pods.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use crate::prepare::checkpoint::PodRef;

/// The `reportingController` of the watchdog's Events.
pub const REPORTING_CONTROLLER: &str = "tessera.dev/watchdog";

/// Where the watchdog reports what it did; Kubernetes Events in the plugin, a list in
/// tests.
pub trait EventSink: Send + Sync {
    /// A Warning Event on pod `namespace/pod`.
    fn warn(&self, namespace: &str, pod: &PodRef, reason: &str, message: &str);
}

/// Posts `events.k8s.io/v1` Events through kube-runtime's [`Recorder`], reported by
/// [`REPORTING_CONTROLLER`] on this node. The same Event repeated on the same pod
/// within the Recorder's cache lifetime (6 minutes) becomes a series: the first
/// Event is patched with a new count, and keeps its first note.
///
/// Fire and forget, in order: one task on `handle` publishes the Events one after the
/// other, so a repeat always finds its first Event in the Recorder's cache (two
/// publishes at once would both create). A failed publish is logged, never retried;
/// when [`QUEUE`] Events are waiting (an API server that does not answer), new ones are
/// dropped with a log line rather than queued without bound.
pub struct KubeEvents {
    queue: tokio::sync::mpsc::Sender<(Event, ObjectReference)>,
}

/// Events waiting to be published, at most.
pub const QUEUE: usize = 256;

impl KubeEvents {
    /// Events reported by instance `node`, published on `handle`.
    pub fn new(client: kube::Client, node: &str, handle: tokio::runtime::Handle) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(node.into()),
        };
        let recorder = Recorder::new(client, reporter);
        let (queue, mut rx) = tokio::sync::mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        handle.spawn(async move {
            while let Some((ev, regarding)) = rx.recv().await {
                if let Err(e) = recorder.publish(&ev, &regarding).await {
                    warn!(
                        error = %e,
                        pod = regarding.name.as_deref().unwrap_or_default(),
                        reason = %ev.reason,
                        "cannot post the watchdog's Event"
                    );
                }
            }
        });
        KubeEvents { queue }
    }
}

/// The Events API `action` for a watchdog `reason`: what the watchdog was doing. The
/// sink is not told whether the offenders were killed (enforce mode may fall back to
/// report), so the action names the check; the note says what was done. Pure.
fn action_for(reason: &str) -> &'static str {
    match reason {
        "GpuMemoryOverBudget" => "CheckGpuMemory",
        _ => "Report",
    }
}

/// The Event's `regarding`: pod `namespace/pod`. Pure.
fn pod_reference(namespace: &str, pod: &PodRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(namespace.into()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    }
}

impl EventSink for KubeEvents {
    fn warn(&self, namespace: &str, pod: &PodRef, reason: &str, message: &str) {
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(message.into()),
            action: action_for(reason).into(),
            secondary: None,
        };
        let regarding = pod_reference(namespace, pod);
        if let Err(e) = self.queue.try_send((ev, regarding)) {
            warn!(
                pod = %pod.name,
                reason,
                error = %e,
                "cannot queue the watchdog's Event (dropped)"
            );
        }
    }
}
