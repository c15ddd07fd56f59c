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

/// Creates one pod (its claim first) and waits until the scheduler has bound it:
/// the time from the pod's creation to its `nodeName` as the client sees it (polled
/// every 10 ms). Nothing else is in the scheduler's queue meanwhile, so this is one
/// pod's scheduling work, not time spent behind others.
pub async fn create_one_and_wait(
    client: &kube::Client,
    kind: PodKind,
    name: &str,
    limit: Duration,
) -> Result<Duration> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    if kind != PodKind::Plain {
        claims
            .create(&PostParams::default(), &claim(name, kind)?)
            .await
            .with_context(|| format!("create claim {name}"))?;
    }
    let t = Instant::now();
    pod_api
        .create(&PostParams::default(), &pod(name, kind)?)
        .await
        .with_context(|| format!("create pod {name}"))?;
    loop {
        let p = pod_api
            .get(name)
            .await
            .with_context(|| format!("get pod {name}"))?;
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            anyhow::bail!(
                "pod {name} not bound after {:?}: {}",
                t.elapsed(),
                unschedulable_message(&p)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn unschedulable_message(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message.clone())
        .unwrap_or_else(|| "no PodScheduled condition".into())
}

/// Why a batch stalled: the scheduler's messages on the pods it left unbound (with how
/// many pods carry each), and what the claims hold, per node config and request (MIG
/// slots and shares taken against what the fleet has). Deletes the unbound pods, so
/// that later batches are not measured behind them.
pub async fn explain_stall(client: &kube::Client, batch_kind: PodKind) -> Result<()> {
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let label = format!("scale.tessera.dev/kind={batch_kind:?}");
    let pods = pod_api
        .list(&kube::api::ListParams::default().labels(&label))
        .await
        .context("list pods")?;
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    let mut unbound = Vec::new();
    for p in &pods.items {
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
            *messages.entry(unschedulable_message(p)).or_default() += 1;
            unbound.extend(p.metadata.name.clone());
        }
    }
    println!(
        "\nstalled batch ({}): {} pods unbound; the scheduler says:",
        batch_kind.label(),
        unbound.len()
    );
    for (m, n) in &messages {
        println!("- {n} pods: {m}");
    }
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut per_device: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in claims
        .list(&Default::default())
        .await
        .context("list claims")?
        .items
    {
        let results = c
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        for r in results {
            let config = NodeKind::ALL
                .iter()
                .find(|k| r.pool.contains(k.label()))
                .map_or("?", |k| k.label());
            *by.entry((config.to_string(), r.request.clone()))
                .or_default() += 1;
            *per_device
                .entry((r.pool.clone(), r.device.clone()))
                .or_default() += 1;
        }
    }
    println!("allocated devices by node config and request: {by:?}");
    let all = pod_api
        .list(&Default::default())
        .await
        .context("list pods")?;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in &all.items {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *per_node.entry(n).or_default() += 1;
        }
    }
    println!(
        "pods per node (every kind): max {}, nodes at 110 (the pod limit): {}",
        per_node.values().max().copied().unwrap_or(0),
        per_node.values().filter(|n| **n >= 110).count()
    );
    let max_share = per_device
        .iter()
        .filter(|((pool, _), _)| pool.contains(NodeKind::H100Shared.label()))
        .map(|(_, n)| *n)
        .collect::<Vec<_>>();
    println!(
        "shared GPUs in use: {}, allocations on one: min {} max {}",
        max_share.len(),
        max_share.iter().min().copied().unwrap_or(0),
        max_share.iter().max().copied().unwrap_or(0)
    );
    for name in unbound {
        let _ = pod_api
            .delete(&name, &kube::api::DeleteParams::default().grace_period(0))
            .await;
    }
    Ok(())
}

/// Writes what `tessera plan` needs to replay the paced sample offline, into `out`:
/// `slices.json` (every slice of the driver, a v1 List), `claims.yaml` (the sampled
/// claims' specs, in the order they were scheduled) and `scheduler.json` (the same
/// claims as the scheduler allocated them). `tests/cluster/scale/plan-sample.py`
/// compares.
pub async fn dump_for_plan(client: &kube::Client, out: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("mkdir {}", out.display()))?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let items = slices
        .list(
            &kube::api::ListParams::default()
                .fields(&format!("spec.driver={}", crate::plugins::DRIVER)),
        )
        .await
        .context("list resourceslices")?
        .items;
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    write_atomic(&out.join("slices.json"), &serde_json::to_vec(&list)?)?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let mut sampled: Vec<ResourceClaim> = claims
        .list(&Default::default())
        .await
        .context("list claims")?
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("s-"))
        })
        .collect();
    // Names are s-KIND-NNNNN; the sample ran kind by kind in PodKind order.
    let order = |c: &ResourceClaim| {
        let name = c.metadata.name.clone().unwrap_or_default();
        let kind = [
            PodKind::Whole,
            PodKind::Mig,
            PodKind::Share,
            PodKind::FirstAvailable,
        ]
        .iter()
        .position(|k| name.starts_with(&format!("s-{}-", format!("{k:?}").to_lowercase())))
        .unwrap_or(usize::MAX);
        (kind, name)
    };
    sampled.sort_by_key(order);
    let mut docs = String::new();
    for c in &sampled {
        let doc = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": c.metadata.name, "namespace": NAMESPACE},
            "spec": c.spec,
        });
        docs.push_str("---\n");
        docs.push_str(&serde_json::to_string(&doc)?);
        docs.push('\n');
    }
    write_atomic(&out.join("claims.yaml"), docs.as_bytes())?;
    write_atomic(&out.join("scheduler.json"), &serde_json::to_vec(&sampled)?)?;
    Ok(())
}

fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename {}", path.display()))?;
    Ok(())
}

/// Deletes the pods of `kind` (at once: no kubelet runs to finish a graceful deletion)
/// and waits until none is left. The baseline pods must not stay: the simulated nodes
/// hold 110 pods each (the kubelet's default), and a node that the baseline packed
/// full refuses the GPU pods that come after ("Too many pods").
pub async fn delete_kind(client: &kube::Client, kind: PodKind) -> Result<()> {
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let lp = kube::api::ListParams::default().labels(&format!("scale.tessera.dev/kind={kind:?}"));
    pod_api
        .delete_collection(&kube::api::DeleteParams::default().grace_period(0), &lp)
        .await
        .context("delete pods")?;
    let t = Instant::now();
    while !pod_api
        .list_metadata(&lp)
        .await
        .context("list pods")?
        .items
        .is_empty()
    {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "{kind:?} pods not deleted after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
