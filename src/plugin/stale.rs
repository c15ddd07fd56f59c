//! Clean-up of claims the kubelet forgot: unprepared here when their ResourceClaim is
//! gone or has a new UID (the plugin may have been down when the kubelet asked).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::prepare::state::DeviceState;

/// Periodically (and at start-up) unprepares claims prepared long ago whose
/// ResourceClaim no longer exists or has a new UID: the plugin may have been down when
/// the kubelet tried to unprepare them.
pub async fn stale_claim_cleanup(
    state: Arc<DeviceState>,
    client: kube::Client,
    interval: Duration,
    min_age: Duration,
    stop: CancellationToken,
) {
    loop {
        if let Err(e) = cleanup_once(&state, &client, min_age).await {
            warn!(error = %e, "stale claim clean-up failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// One clean-up pass; returns the UIDs it unprepared. A claim whose unprepare fails is
/// logged and left for the next pass; only a failure to list the candidates is an error.
pub async fn cleanup_once(
    state: &Arc<DeviceState>,
    client: &kube::Client,
    min_age: Duration,
) -> Result<Vec<String>, String> {
    let s = state.clone();
    let secs = min_age.as_secs();
    let candidates = tokio::task::spawn_blocking(move || s.prepared_claims(secs))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.chain())?;
    let mut removed = Vec::new();
    for (uid, ns, name) in candidates {
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
        let gone = match api.get_opt(&name).await {
            Ok(None) => true,
            Ok(Some(c)) => c.metadata.uid.as_deref() != Some(uid.as_str()),
            // Unknown: keep it; better a late clean-up than unpreparing a live claim.
            Err(e) => {
                warn!(claim = %uid, error = %e, "cannot check claim; keeping it");
                false
            }
        };
        if gone {
            let s = state.clone();
            let u = uid.clone();
            let done = tokio::task::spawn_blocking(move || s.unprepare(&u))
                .await
                .map_err(|e| e.to_string())?;
            // One claim that cannot be undone yet (a MIG device still in use) must not
            // stop the clean-up of the others: the next pass retries it.
            match done {
                Ok(()) => {
                    info!(claim = %uid, namespace = %ns, name = %name, "unprepared a claim that no longer exists");
                    removed.push(uid);
                }
                Err(e) => {
                    warn!(claim = %uid, namespace = %ns, name = %name, error = %e.chain(), "cannot unprepare a claim that no longer exists yet; retrying next pass")
                }
            }
        }
    }
    Ok(removed)
}
