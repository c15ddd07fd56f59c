//! The simulated nodes: their hardware (a mock node description per node, from which
//! Tessera's own code builds the pool), their Node objects and the heartbeat a kubelet
//! would write (the Node's Ready condition at creation, then a Lease renewal every
//! `LEASE_RENEW`), without kubelets.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tessera::inventory::mock::StateAccess;
use tessera::node::{BackendPaths, BackendSpec, NodeModel, load_node};
use tokio::sync::watch;

/// How often each simulated kubelet renews its Lease (the kubelet's default: a quarter
/// of the 40 s lease duration).
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
/// The node label naming the simulated node's config.
pub const CONFIG_LABEL: &str = "scale.tessera.dev/config";

/// The four node configs of the mix, in round-robin order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeKind {
    /// 8×H100, each GPU whole (`exclusive`).
    H100Whole,
    /// 8×H100 in MIG mode: every profile and placement published.
    H100Mig,
    /// 8×H100 shared (consumable capacity).
    H100Shared,
    /// 8×T4, whole.
    T4,
}

impl NodeKind {
    pub const ALL: [NodeKind; 4] = [
        NodeKind::H100Whole,
        NodeKind::H100Mig,
        NodeKind::H100Shared,
        NodeKind::T4,
    ];

    pub fn label(self) -> &'static str {
        match self {
            NodeKind::H100Whole => "h100-whole",
            NodeKind::H100Mig => "h100-mig",
            NodeKind::H100Shared => "h100-shared",
            NodeKind::T4 => "t4",
        }
    }

    fn mode(self) -> &'static str {
        match self {
            NodeKind::H100Whole | NodeKind::T4 => "exclusive",
            NodeKind::H100Mig => "mig",
            NodeKind::H100Shared => "shared",
        }
    }
}

/// One simulated node.
#[derive(Debug, Clone)]
pub struct SimNode {
    pub name: String,
    pub kind: NodeKind,
    pub index: usize,
}

/// `n` nodes, the four configs in turn.
pub fn fleet(n: usize) -> Vec<SimNode> {
    (0..n)
        .map(|index| {
            let kind = NodeKind::ALL[index % NodeKind::ALL.len()];
            SimNode {
                name: format!("scale-{}-{index:04}", kind.label()),
                kind,
                index,
            }
        })
        .collect()
}

/// The mock node description of `node` (deterministic): 8 GPUs of its kind with UUIDs
/// of their own, the driver version given, and its config (every GPU in the kind's mode).
pub fn mock_node_yaml(node: &SimNode, driver_version: &str) -> String {
    let mut gpus = String::new();
    for minor in 0..8u32 {
        let uuid = format!(
            "GPU-{:08x}-{:04x}-4000-8000-{:012x}",
            node.index,
            minor,
            node.index * 8 + minor as usize
        );
        let bus = format!("0000:{:02x}:00.0", 0x19 + minor * 0x10);
        let (root, numa) = if minor < 4 {
            ("pci0000:00", 0)
        } else {
            ("pci0000:80", 1)
        };
        let hw = match node.kind {
            NodeKind::T4 => "  productName: Tesla T4\n  architecture: Turing\n  memoryBytes: 16106127360\n  multiprocessors: 40\n  cudaComputeCapability: \"7.5\"\n  migCapable: false\n".to_string(),
            kind => format!(
                "  productName: NVIDIA H100 80GB HBM3\n  architecture: Hopper\n  memoryBytes: 85520809984\n  multiprocessors: 132\n  cudaComputeCapability: \"9.0\"\n  migCapable: true\n  migEnabled: {}\n",
                kind == NodeKind::H100Mig
            ),
        };
        gpus.push_str(&format!(
            "- minor: {minor}\n  uuid: {uuid}\n  brand: Nvidia\n  pciBusID: \"{bus}\"\n  pcieRoot: {root}\n  numaNode: {numa}\n{hw}"
        ));
    }
    format!(
        "apiVersion: mock.tessera.dev/v1alpha1\nkind: MockNode\ndriverVersion: \"{driver_version}\"\ncudaDriverVersion: \"13.0\"\ncharDevices:\n  nvidia: 195\n  nvidia-uvm: 508\n  nvidia-caps: 511\ngpus:\n{gpus}config:\n  apiVersion: config.tessera.dev/v1alpha1\n  kind: NodeConfig\n  defaultMode: {}\n",
        node.kind.mode()
    )
}

/// The node model Tessera's own code makes of `node` (the mock backend, as
/// `tessera plugin --backend mock:FILE` would): writes the description and the mock's
/// state under `work/<node>/`.
pub fn model(node: &SimNode, driver_version: &str, work: &Path) -> Result<NodeModel> {
    let dir = work.join(&node.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("mock-node.yaml");
    std::fs::write(&file, mock_node_yaml(node, driver_version))
        .with_context(|| format!("writing {}", file.display()))?;
    let paths = BackendPaths {
        state_dir: dir.join("state"),
        ..BackendPaths::default()
    };
    load_node(
        &BackendSpec::Mock(Some(file)),
        None,
        &paths,
        StateAccess::ReadWrite,
    )
    .with_context(|| format!("node model of {}", node.name))
}

fn ready_condition(now: &Time) -> Vec<NodeCondition> {
    let cond = |type_: &str, status: &str, reason: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some("simulated by tessera-scale".into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    vec![
        cond("Ready", "True", "KubeletReady"),
        cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID"),
    ]
}

/// Registers each node as its kubelet would: the Node (labels, capacity, Ready) and its
/// Lease in `kube-node-lease`. Idempotent: an existing object is kept.
pub async fn register(client: &kube::Client, nodes: &[SimNode]) -> Result<()> {
    let node_api: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let results: Vec<Result<()>> = stream::iter(nodes.iter())
        .map(|n| {
            let (node_api, leases) = (node_api.clone(), leases.clone());
            async move {
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                let resources: std::collections::BTreeMap<String, Quantity> = [
                    ("cpu", "128"),
                    ("memory", "2Ti"),
                    ("pods", "110"),
                    ("ephemeral-storage", "1Ti"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.into())))
                .collect();
                let obj = Node {
                    metadata: ObjectMeta {
                        name: Some(n.name.clone()),
                        labels: Some(
                            [
                                ("kubernetes.io/hostname".to_string(), n.name.clone()),
                                ("kubernetes.io/os".to_string(), "linux".to_string()),
                                (CONFIG_LABEL.to_string(), n.kind.label().to_string()),
                            ]
                            .into(),
                        ),
                        ..Default::default()
                    },
                    spec: None,
                    status: Some(NodeStatus {
                        capacity: Some(resources.clone()),
                        allocatable: Some(resources),
                        conditions: Some(ready_condition(&now)),
                        ..Default::default()
                    }),
                };
                let created = match node_api.create(&PostParams::default(), &obj).await {
                    Ok(o) => o,
                    Err(kube::Error::Api(e)) if e.code == 409 => node_api
                        .get(&n.name)
                        .await
                        .with_context(|| format!("get node {}", n.name))?,
                    Err(e) => return Err(e).with_context(|| format!("create node {}", n.name)),
                };
                // The status of a create is kept for Nodes; set it again in case a
                // release drops it.
                if created
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_none()
                {
                    let patch = serde_json::json!({"status": obj.status});
                    node_api
                        .patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .with_context(|| format!("node {} status", n.name))?;
                }
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(n.name.clone()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: n.name.clone(),
                            uid: created.metadata.uid.clone().unwrap_or_default(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(n.name.clone()),
                        lease_duration_seconds: Some(40),
                        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                        ..Default::default()
                    }),
                };
                match leases.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(e).with_context(|| format!("create lease {}", n.name)),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The simulated kubelets' heartbeat until `stop` turns true: every node's Lease
/// renewed every [`LEASE_RENEW`], a tenth of the nodes each second (at most 16 calls
/// in flight). Returns the failed renewals (a real kubelet retries too; reported).
pub async fn heartbeat(
    client: kube::Client,
    names: Vec<String>,
    mut stop: watch::Receiver<bool>,
) -> u64 {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut failures = 0u64;
    let mut tick = tokio::time::interval(LEASE_RENEW / 10);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = 0usize;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return failures,
            _ = tick.tick() => {}
        }
        let turn = round % 10;
        round += 1;
        let batch: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 10 == turn)
            .map(|(_, n)| n.clone())
            .collect();
        let results: Vec<bool> = stream::iter(batch)
            .map(|name| {
                let leases = leases.clone();
                async move {
                    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
                    let patch = serde_json::json!({"spec": {"renewTime": now}});
                    leases
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .is_ok()
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        failures += results.iter().filter(|ok| !**ok).count() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_model::release::KubeVersion;
    use tessera::publish::slices::ServerFeatures;

    /// Each node config of the mix is a valid mock node, and Tessera builds its pool:
    /// 8 GPUs each, every MIG placement on the MIG node, UUIDs of the node's own.
    #[test]
    fn every_node_config_builds_a_pool_of_its_own() {
        let work = tempfile::tempdir().unwrap();
        let version = KubeVersion::from_server("1", "37").unwrap();
        let features = ServerFeatures {
            partitionable: true,
            consumable_capacity: true,
            device_taints: true,
        };
        let mut uuids = std::collections::BTreeSet::new();
        for node in fleet(8) {
            let m = model(&node, "580.65.06", work.path()).unwrap();
            assert_eq!(m.gpus.len(), 8, "{}", node.name);
            uuids.extend(m.gpus.iter().map(|g| g.gpu.uuid.clone()));
            let pool = m.pool("gpu.tessera.dev", &node.name, version, features);
            let devices: usize = pool
                .iter()
                .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                .sum();
            match node.kind {
                NodeKind::H100Mig => assert!(devices > 100, "{}: {devices}", node.name),
                _ => assert_eq!(devices, 8, "{}", node.name),
            }
        }
        assert_eq!(uuids.len(), 64, "every GPU has a UUID of its own");
    }
}
