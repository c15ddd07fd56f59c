//! The scheduling phase: pods without claims, then pods with claims (a whole GPU, a
//! 1g.10gb MIG device, a share, and a `firstAvailable` of MIG or share) filling the
//! fleet's GPUs to a fraction, each batch measured from the scheduler's own metrics.
//! No kubelet runs: bound pods stay Pending with their node set, which is all the
//! scheduler's figures need.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::nodes::{CONFIG_LABEL, NodeKind, SimNode};

/// The namespace of the scale run's pods and claims.
pub const NAMESPACE: &str = "tessera-scale";
/// A share's request: this much memory and compute on a shared GPU.
const SHARE_MEMORY: u64 = 10 << 30;
const SHARE_COMPUTE: u64 = 10;

/// One kind of pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PodKind {
    /// No claim (the baseline).
    Plain,
    /// One whole GPU (`gpu.tessera.dev`), on whole-GPU nodes (node affinity).
    Whole,
    /// One 1g.10gb MIG device.
    Mig,
    /// One share: 10 GiB and 10 % compute of a shared GPU.
    Share,
    /// `firstAvailable`: a 1g.10gb MIG device, else a share.
    FirstAvailable,
}

impl PodKind {
    pub fn label(self) -> &'static str {
        match self {
            PodKind::Plain => "no claim",
            PodKind::Whole => "whole GPU",
            PodKind::Mig => "MIG 1g.10gb",
            PodKind::Share => "share 10Gi/10%",
            PodKind::FirstAvailable => "firstAvailable MIG|share",
        }
    }
}

/// How many pods of each kind fill the fleet's GPUs to `fill`: whole GPUs of the
/// whole-GPU and T4 nodes; MIG and shares to `fill - 5 %` each, and the `firstAvailable`
/// pods the last 5 % of both (they fit in either).
pub fn plan(nodes: &[SimNode], shares_per_gpu: u64, fill: f64) -> Vec<(PodKind, usize)> {
    let count = |k: NodeKind| nodes.iter().filter(|n| n.kind == k).count() as f64;
    let whole = (count(NodeKind::H100Whole) + count(NodeKind::T4)) * 8.0;
    // An H100 80GB holds seven 1g.10gb instances.
    let mig = count(NodeKind::H100Mig) * 8.0 * 7.0;
    let share = count(NodeKind::H100Shared) * 8.0 * shares_per_gpu as f64;
    let partial = (fill - 0.05).max(0.0);
    vec![
        (PodKind::Whole, (whole * fill).floor() as usize),
        (PodKind::Mig, (mig * partial).floor() as usize),
        (PodKind::Share, (share * partial).floor() as usize),
        (
            PodKind::FirstAvailable,
            ((mig + share) * (fill - partial)).floor() as usize,
        ),
    ]
}

/// Shares of [`SHARE_MEMORY`] and [`SHARE_COMPUTE`] one shared GPU of `pool` holds
/// (its published `memory` capacity, in bytes, and 100 % compute).
pub fn shares_per_gpu(pool: &[ResourceSlice]) -> u64 {
    let memory = pool
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| d.allow_multiple_allocations == Some(true))
        .filter_map(|d| {
            d.capacity
                .as_ref()?
                .get("memory")?
                .value
                .0
                .parse::<u64>()
                .ok()
        })
        .min()
        .unwrap_or(0);
    (memory / SHARE_MEMORY).min(100 / SHARE_COMPUTE)
}

/// Creates the namespace and the shipped DeviceClasses (as `kubectl apply -k
/// deploy/deviceclasses` would). Existing ones are kept.
pub async fn prepare(client: &kube::Client) -> Result<()> {
    let ns: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    ignore_exists(ns.create(&PostParams::default(), &obj).await).context("namespace")?;
    // Pods are admitted once the namespace's `default` ServiceAccount exists (the
    // controller-manager creates it).
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let t = Instant::now();
    while sas
        .get_opt("default")
        .await
        .context("get serviceaccount")?
        .is_none()
    {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "no ServiceAccount {NAMESPACE}/default after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for class in tessera::device_classes::read(None).context("the shipped DeviceClasses")? {
        ignore_exists(classes.create(&PostParams::default(), &class).await)
            .context("DeviceClass")?;
    }
    Ok(())
}

fn ignore_exists<T>(r: kube::Result<T>) -> kube::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

fn claim(name: &str, kind: PodKind) -> Result<ResourceClaim> {
    let mig = json!({
        "deviceClassName": "mig.tessera.dev",
        "selectors": [{"cel": {"expression": "device.attributes[\"gpu.tessera.dev\"].profile == \"1g.10gb\""}}]
    });
    let share = json!({
        "deviceClassName": "shared.tessera.dev",
        "capacity": {"requests": {"memory": SHARE_MEMORY.to_string(), "compute": SHARE_COMPUTE.to_string()}}
    });
    let request = match kind {
        PodKind::Plain => anyhow::bail!("a pod without a claim has no claim"),
        PodKind::Whole => json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}),
        PodKind::Mig => json!({"name": "gpu", "exactly": mig}),
        PodKind::Share => json!({"name": "gpu", "exactly": share}),
        PodKind::FirstAvailable => {
            let mut m = mig;
            m["name"] = json!("mig");
            let mut s = share;
            s["name"] = json!("share");
            json!({"name": "gpu", "firstAvailable": [m, s]})
        }
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}}
    }))?)
}

fn pod(name: &str, kind: PodKind) -> Result<Pod> {
    let mut spec = json!({
        "containers": [{
            "name": "c",
            "image": "localhost/tessera/none:1",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}
        }],
        "terminationGracePeriodSeconds": 0
    });
    if kind != PodKind::Plain {
        spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": name}]);
        spec["containers"][0]["resources"]["claims"] = json!([{"name": "gpu"}]);
    }
    if kind == PodKind::Whole {
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": CONFIG_LABEL, "operator": "In",
                "values": [NodeKind::H100Whole.label(), NodeKind::T4.label()]
            }]}]
        }}});
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"scale.tessera.dev/kind": format!("{kind:?}")}},
        "spec": spec
    }))?)
}

/// Creates `pods` (kind, name) in order, each claim before its pod, at most 16 calls in
/// flight.
pub async fn create(client: &kube::Client, pods: &[(PodKind, String)]) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let results: Vec<Result<()>> = stream::iter(pods.iter())
        .map(|(kind, name)| {
            let (claims, pod_api) = (claims.clone(), pod_api.clone());
            async move {
                if *kind != PodKind::Plain {
                    claims
                        .create(&PostParams::default(), &claim(name, *kind)?)
                        .await
                        .with_context(|| format!("create claim {name}"))?;
                }
                pod_api
                    .create(&PostParams::default(), &pod(name, *kind)?)
                    .await
                    .with_context(|| format!("create pod {name}"))?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Pods of the namespace bound to a node, by kind label.
pub async fn bound(client: &kube::Client) -> Result<BTreeMap<String, (usize, usize)>> {
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    // The pods themselves (metadata has no nodeName); small: no kubelet writes status.
    let pods = pod_api
        .list(&Default::default())
        .await
        .context("list pods")?;
    for p in pods.items {
        let kind = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("scale.tessera.dev/kind"))
            .cloned()
            .unwrap_or_default();
        let e = out.entry(kind).or_default();
        e.0 += 1;
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            e.1 += 1;
        }
    }
    Ok(out)
}

/// Names for `count` pods of `kind`, unique in the run.
pub fn names(kind: PodKind, count: usize, batch: &str) -> Vec<(PodKind, String)> {
    let kind_name = format!("{kind:?}").to_lowercase();
    (0..count)
        .map(|i| (kind, format!("{batch}-{kind_name}-{i:05}")))
        .collect()
}

/// Waits until the scheduler has bound `target` more pods than `before` (its
/// `scheduler_schedule_attempts_total{result="scheduled"}`), polling `scheduled`;
/// `Err` after `limit` without progress for 60 s.
pub async fn wait_scheduled<F, Fut>(
    mut scheduled: F,
    before: f64,
    target: usize,
    limit: Duration,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<f64>>,
{
    let t = Instant::now();
    let (mut last, mut progress_at) = (before, Instant::now());
    loop {
        let now = scheduled().await?;
        if now - before >= target as f64 {
            return Ok(t.elapsed());
        }
        if now > last {
            last = now;
            progress_at = Instant::now();
        }
        if t.elapsed() > limit || progress_at.elapsed() > Duration::from_secs(60) {
            anyhow::bail!(
                "{} of {target} pods scheduled after {:?}",
                now - before,
                t.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
