//! Where the watchdog reports what it did: Warning Events on the offending pods.

use tracing::warn;

use crate::prepare::checkpoint::PodRef;

/// Where the watchdog reports what it did; Kubernetes Events in the plugin, a list in
/// tests.
pub trait EventSink: Send + Sync {
    /// A Warning Event on pod `namespace/pod`.
    fn warn(&self, namespace: &str, pod: &PodRef, reason: &str, message: &str);
}

/// Posts core/v1 Events through the API server (fire and forget: a failed post is
/// logged, never retried).
pub struct KubeEvents {
    pub client: kube::Client,
    pub node: String,
    pub handle: tokio::runtime::Handle,
}

impl EventSink for KubeEvents {
    fn warn(&self, namespace: &str, pod: &PodRef, reason: &str, message: &str) {
        use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", pod.name)),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                namespace: Some(namespace.to_string()),
                uid: Some(pod.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some("tessera-watchdog".into()),
                host: Some(self.node.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            reporting_component: Some("tessera.dev/watchdog".into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), namespace);
        let (reason, pod_name) = (reason.to_string(), pod.name.clone());
        self.handle.spawn(async move {
            if let Err(e) = api.create(&Default::default(), &ev).await {
                warn!(error = %e, pod = %pod_name, reason, "cannot post the watchdog's Event");
            }
        });
    }
}
