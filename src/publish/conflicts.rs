//! Start-up guard against a second owner of the same GPUs: the NVIDIA device plugin
//! (the node advertises `nvidia.com/gpu` as an extended resource) or another DRA
//! driver publishing devices with our GPUs' UUIDs on this node. Two allocators handing
//! out one GPU means two tenants on a device each thinks is exclusive. Tessera reports
//! the conflict loudly at start-up; it cannot stop the other component.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

/// The device plugin's resource names, as advertised in `node.status.allocatable`.
const DEVICE_PLUGIN_RESOURCES: &[&str] = &["nvidia.com/gpu", "nvidia.com/mig-"];

/// A conflict found, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict(pub String);

/// The node advertises GPUs as extended resources (the NVIDIA device plugin runs).
/// `DRAExtendedResource` makes the scheduler map `nvidia.com/gpu` to Tessera's class
/// only when no device plugin advertises it, so a non-zero count is a conflict.
pub fn device_plugin(node: &Node) -> Option<Conflict> {
    let alloc = node.status.as_ref()?.allocatable.as_ref()?;
    let found: Vec<String> = alloc
        .iter()
        .filter(|(k, v)| {
            DEVICE_PLUGIN_RESOURCES.iter().any(|p| k.starts_with(p)) && v.0.trim() != "0"
        })
        .map(|(k, v)| format!("{k}={}", v.0))
        .collect();
    (!found.is_empty()).then(|| {
        Conflict(format!(
            "the node advertises {} (the NVIDIA device plugin is running): it and Tessera would both hand out these GPUs; remove the device plugin from GPU nodes Tessera manages",
            found.join(", ")
        ))
    })
}

/// Devices of other drivers on this node whose `uuid` or `parentUUID` attribute (any
/// domain) is one of our GPUs.
pub fn other_dra_drivers(
    slices: &[ResourceSlice],
    our_driver: &str,
    uuids: &[String],
) -> Vec<Conflict> {
    let mut out = Vec::new();
    for s in slices.iter().filter(|s| s.spec.driver != our_driver) {
        for d in s.spec.devices.iter().flatten() {
            let hit = d.attributes.iter().flatten().find_map(|(k, v)| {
                let name = k.rsplit('/').next().unwrap_or(k);
                let val = v.string.as_deref()?;
                ((name == "uuid" || name == "parentUUID") && uuids.iter().any(|u| u == val))
                    .then(|| val.to_string())
            });
            if let Some(uuid) = hit {
                out.push(Conflict(format!(
                    "DRA driver {} publishes device {} for GPU {uuid}, which Tessera also manages",
                    s.spec.driver, d.name
                )));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn a_node_advertising_nvidia_gpus_conflicts() {
        let node = |k: &str, v: &str| Node {
            status: Some(NodeStatus {
                allocatable: Some([(k.to_string(), Quantity(v.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(device_plugin(&node("nvidia.com/gpu", "4")).is_some());
        assert!(device_plugin(&node("nvidia.com/mig-1g.10gb", "7")).is_some());
        assert!(device_plugin(&node("nvidia.com/gpu", "0")).is_none());
        assert!(device_plugin(&node("cpu", "8")).is_none());
        assert!(device_plugin(&Node::default()).is_none());
    }

    #[test]
    fn another_driver_with_our_uuid_conflicts() {
        let slice = |driver: &str, attr: &str, uuid: &str| ResourceSlice {
            spec: ResourceSliceSpec {
                driver: driver.into(),
                devices: Some(vec![Device {
                    name: "gpu-0".into(),
                    attributes: Some(
                        [(
                            attr.to_string(),
                            DeviceAttribute {
                                string: Some(uuid.into()),
                                ..Default::default()
                            },
                        )]
                        .into(),
                    ),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        let ours = vec!["GPU-a".to_string()];
        let slices = [
            slice("gpu.nvidia.com", "uuid", "GPU-a"),
            slice("gpu.nvidia.com", "uuid", "GPU-z"),
            slice("gpu.tessera.dev", "uuid", "GPU-a"),
            slice("other.example.com", "gpu.nvidia.com/parentUUID", "GPU-a"),
        ];
        let c = other_dra_drivers(&slices, "gpu.tessera.dev", &ours);
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(
            c[0].0
                .contains("gpu.nvidia.com publishes device gpu-0 for GPU GPU-a")
        );
    }
}
