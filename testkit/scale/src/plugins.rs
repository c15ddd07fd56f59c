//! The nodes' plugins, as far as the API server sees them: for each node, Tessera's own
//! start-up sequence against the API (`tessera::publish::Publisher`: the server's
//! version and the Node, the feature probes, the conflict check, the pool built from
//! the node model) and then its publisher loop (`Publisher::run`: a watch of the node's
//! own slices, whose initial list the first sync uses), each with its own pool, generation and API calls. One
//! process drives them all over one client; each has its own `Health`, whose
//! "published" state is the plugin's readiness.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::future::join_all;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tessera::node::NodeModel;
use tessera::publish::Publisher;
use tessera::telemetry::http::Health;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The driver name the simulated plugins publish under (the shipped one).
pub const DRIVER: &str = "gpu.tessera.dev";
/// The plugin's default debounce after a watch event (`--publish-debounce`).
const DEBOUNCE: Duration = Duration::from_millis(500);

/// One node's running plugin.
pub struct Plugin {
    pub node: String,
    /// The pool it publishes.
    pub pool: Vec<ResourceSlice>,
    health: Arc<Health>,
    task: JoinHandle<()>,
}

impl Plugin {
    /// Whether its latest sync succeeded (what `/readyz` says of the slices).
    pub fn published(&self) -> bool {
        self.health.ready().is_ok()
    }
}

/// All plugins of one start, and the signal that stops them.
pub struct Fleet {
    pub plugins: Vec<Plugin>,
    stop: watch::Sender<bool>,
}

/// The slice-shape experiment (`--mig-profiles`): MIG devices of only these profiles are
/// published, as a node config limiting the profiles would publish them (the counters
/// and the whole-GPU devices unchanged). Unset: every profile, as Tessera publishes.
pub static MIG_PROFILES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Drops the MIG devices whose `profile` is not in `keep`.
fn only_mig_profiles(pool: &mut [ResourceSlice], keep: &[String]) {
    for slice in pool {
        if let Some(devices) = slice.spec.devices.as_mut() {
            devices.retain(|d| {
                let attr = |k: &str| {
                    d.attributes
                        .as_ref()
                        .and_then(|a| a.get(k))
                        .and_then(|v| v.string.clone())
                };
                attr("type").as_deref() != Some("mig")
                    || attr("profile").is_some_and(|p| keep.contains(&p))
            });
            // The server stores an empty list as absent: compare like with like.
            if devices.is_empty() {
                slice.spec.devices = None;
            }
        }
    }
}

/// Starts one node's plugin: the API half of `tessera plugin`'s start-up
/// (`plugin::connect_api`), then `Publisher::run` until `stop`.
async fn start(
    client: kube::Client,
    node: String,
    model: Arc<NodeModel>,
    mut stop: watch::Receiver<bool>,
) -> Result<Plugin> {
    let mut publisher = Publisher::new(client, DRIVER, &node)
        .await
        .with_context(|| format!("{node}: publisher start"))?;
    let health = Arc::new(Health::default());
    // Readiness here means "published": the kubelet's sockets are not simulated.
    health.set_serving(true);
    health.set_registered(Ok(()));
    publisher.report_to(health.clone());
    let features = publisher
        .probe_features()
        .await
        .with_context(|| format!("{node}: feature probes"))?;
    let uuids: Vec<String> = model.gpus.iter().map(|g| g.gpu.uuid.clone()).collect();
    let conflicts = publisher
        .conflicts(&uuids)
        .await
        .with_context(|| format!("{node}: conflict check"))?;
    anyhow::ensure!(conflicts.is_empty(), "{node}: conflicts {conflicts:?}");
    let mut pool = model.pool(DRIVER, &node, publisher.version(), features);
    if let Some(keep) = MIG_PROFILES.get() {
        only_mig_profiles(&mut pool, keep);
    }
    publisher
        .prevalidate(&pool)
        .with_context(|| format!("{node}: pool"))?;
    let (tx, rx) = watch::channel(pool.clone());
    let task = tokio::spawn(async move {
        let _keep = tx;
        publisher
            .run(rx, DEBOUNCE, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
    });
    Ok(Plugin {
        node,
        pool,
        health,
        task,
    })
}

impl Fleet {
    /// Starts every node's plugin at once (all start-ups concurrent, as after a
    /// DaemonSet rollout or a fresh cluster).
    pub async fn start_all(
        client: &kube::Client,
        models: &[(String, Arc<NodeModel>)],
    ) -> Result<Fleet> {
        let (stop, rx) = watch::channel(false);
        let started =
            join_all(models.iter().map(|(node, model)| {
                start(client.clone(), node.clone(), model.clone(), rx.clone())
            }))
            .await;
        let plugins = started.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(Fleet { plugins, stop })
    }

    /// Waits until every plugin has published (its latest sync succeeded), at most
    /// `limit`; the time it took, or the nodes still unpublished.
    pub async fn wait_published(&self, since: Instant, limit: Duration) -> Result<Duration> {
        loop {
            let missing: Vec<&str> = self
                .plugins
                .iter()
                .filter(|p| !p.published())
                .map(|p| p.node.as_str())
                .collect();
            if missing.is_empty() {
                return Ok(since.elapsed());
            }
            if since.elapsed() > limit {
                anyhow::bail!(
                    "{} of {} nodes not published after {limit:?} (first: {:?})",
                    missing.len(),
                    self.plugins.len(),
                    &missing[..missing.len().min(5)]
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every plugin and waits for their loops to end (the slices stay, as when
    /// a plugin pod is replaced).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for p in self.plugins {
            let _ = p.task.await;
        }
    }
}
