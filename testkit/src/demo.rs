//! `tessera-demo`: the whole node path in seconds, with no cluster, GPU or root.
//!
//! It starts the fake API server (Kubernetes 1.37, default gates) and the plugin on
//! the embedded mock node in a temp dir, then acts as the kubelet over the real
//! sockets: registration, then DRA v1. Each phase's claims are created, allocated,
//! prepared and unprepared, and the demo shows that no file is left behind.
//!
//! Phases (the claim table is a contract; tests assert it):
//!
//! | phase | claim | asks for | gets |
//! |---|---|---|---|
//! | whole GPUs | `w1` | one GPU whose product is an H100 | `gpu-0` |
//! | whole GPUs | `w2` | two Tesla T4 | `gpu-2`, `gpu-3` |
//! | MIG | `m1`, `m2`, `m3` | a `1g.10gb` each | `gpu-0-mig-1g10gb-19-6`, `-5`, `-4` |
//! | MIG | `m4` | a `3g.40gb` | `gpu-0-mig-3g40gb-9-0` |
//! | shared | `s1` | 20 GiB and 25 % compute of a shared H100 | `gpu-1` (share) |
//! | shared | `s2` | 30 GiB and 40 % compute of a shared H100 | `gpu-1` (share) |
//!
//! The MIG phase shows the instances the plugin created through the backend, and that
//! unprepare destroyed them and switched MIG mode off again. The shared phase shows
//! each claim's budget (from the allocation's `consumedCapacity`) and the paths of its
//! `limits`, `control` and `region` files, which the interception library enforces.
//!
//! Claims are allocated by the `tessera plan` allocator against the slices the plugin
//! actually published, as the scheduler would.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::fakeapi::{FakeApiConfig, FakeApiServer};
use crate::kubelet_standin::{self, DraClient, DraVersion, KubeletClaim};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule;
use tessera::inventory::mock::StateAccess;
use tessera::node::{BackendPaths, BackendSpec, load_node};
use tessera::plugin::{self, PluginOptions, PluginPaths};
use tessera::prepare::failpoints::FailPoints;

pub const DRIVER: &str = "gpu.tessera.dev";
pub const NODE: &str = "demo-node";
pub const NAMESPACE: &str = "demo";

/// One demo claim: a name, a DeviceClass, a CEL selector, and a count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoClaim {
    pub name: &'static str,
    pub class: &'static str,
    /// Attribute `productName` (whole GPUs) or `profile` (MIG) must equal/contain this.
    pub wants: &'static str,
    pub count: usize,
    /// For a shared GPU: (memory, compute percent) to consume.
    pub share: Option<(&'static str, u32)>,
}

impl DemoClaim {
    fn selector(&self) -> String {
        if self.class == "mig.tessera.dev" {
            format!(
                "device.attributes[\"{DRIVER}\"].profile == \"{}\"",
                self.wants
            )
        } else {
            format!(
                "device.attributes[\"{DRIVER}\"].productName.contains(\"{}\")",
                self.wants
            )
        }
    }
}

/// A phase of the demo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub title: &'static str,
    pub claims: Vec<DemoClaim>,
}

/// The demo's phases, in order.
pub fn phases() -> Vec<Phase> {
    let c = |name, class, wants, count| DemoClaim {
        name,
        class,
        wants,
        count,
        share: None,
    };
    let shared = |name, memory, compute| DemoClaim {
        name,
        class: "shared.tessera.dev",
        wants: "H100",
        count: 1,
        share: Some((memory, compute)),
    };
    vec![
        Phase {
            title: "whole GPUs",
            claims: vec![
                c("w1", "gpu.tessera.dev", "H100", 1),
                c("w2", "gpu.tessera.dev", "T4", 2),
            ],
        },
        Phase {
            title: "MIG partitions, created on demand on gpu-0",
            claims: vec![
                c("m1", "mig.tessera.dev", "1g.10gb", 1),
                c("m2", "mig.tessera.dev", "1g.10gb", 1),
                c("m3", "mig.tessera.dev", "1g.10gb", 1),
                c("m4", "mig.tessera.dev", "3g.40gb", 1),
            ],
        },
        Phase {
            title: "shared GPU gpu-1: a light and a heavier inference worker",
            claims: vec![shared("s1", "20Gi", 25), shared("s2", "30Gi", 40)],
        },
    ]
}

/// What the demo did, for the printed summary and for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DemoReport {
    /// (claim name, devices it got, CDI IDs, spec path).
    pub prepared: Vec<(String, Vec<String>, Vec<String>, PathBuf)>,
    /// Files left in the CDI dir after the last unprepare (must be empty).
    pub leftover_files: Vec<String>,
    /// MIG devices left after the MIG phase's unprepare (must be 0).
    pub mig_left: usize,
    /// Shared claims: (claim name, its `limits` file's contents).
    pub shared_limits: Vec<(String, String)>,
    /// Entries left in the run dir's `claims/` after the last unprepare (must be empty).
    pub leftover_claim_dirs: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("demo set-up failed: {0}")]
    Setup(String),
    #[error("demo step failed: {0}")]
    Step(String),
}

fn step<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> DemoError + '_ {
    move |e| DemoError::Step(format!("{what}: {e}"))
}

/// The ResourceClaim a demo claim stands for: one request of its class with a CEL
/// selector on the product name (whole GPUs) or the MIG profile.
pub fn claim_object(c: &DemoClaim) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(c.name.into()),
            namespace: Some(NAMESPACE.into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: c.class.into(),
                        count: Some(c.count as i64),
                        capacity: c.share.map(|(memory, compute)| {
                            k8s_openapi::api::resource::v1::CapacityRequirements {
                                requests: Some(std::collections::BTreeMap::from([
                                    ("memory".to_string(), Quantity(memory.to_string())),
                                    ("compute".to_string(), Quantity(compute.to_string())),
                                ])),
                            }
                        }),
                        selectors: Some(vec![k8s_openapi::api::resource::v1::DeviceSelector {
                            cel: Some(k8s_openapi::api::resource::v1::CELDeviceSelector {
                                expression: c.selector(),
                            }),
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

/// Fake driver files so the CDI specs mount something real.
fn make_driver_root(root: &Path, driver_version: &str) -> std::io::Result<()> {
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib)?;
    std::fs::create_dir_all(root.join("usr/bin"))?;
    for base in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-nvvm.so",
    ] {
        std::fs::write(lib.join(format!("{base}.{driver_version}")), b"")?;
    }
    std::fs::write(root.join("usr/bin/nvidia-smi"), b"")?;
    Ok(())
}

async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> Result<T, DemoError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(DemoError::Step(format!("timed out waiting for {what}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the demo in `workdir` with the interception library at `interception_lib`,
/// writing the readable summary to `out`.
pub async fn run(
    workdir: &Path,
    interception_lib: &Path,
    out: &mut String,
) -> Result<DemoReport, DemoError> {
    let setup = |e: std::io::Error| DemoError::Setup(e.to_string());
    let version = KubeVersion::NEWEST;
    let api = FakeApiServer::start(FakeApiConfig::new(version))
        .await
        .map_err(setup)?;
    api.add_node(NODE);
    let client = api.client().map_err(|e| DemoError::Setup(e.to_string()))?;
    let paths = PluginPaths {
        plugin_registry_dir: workdir.join("plugins_registry"),
        plugin_dir: workdir.join("plugins").join(DRIVER),
        cdi_dir: workdir.join("cdi"),
        state_dir: workdir.join("state"),
        run_dir: workdir.join("run"),
        host_run_dir: workdir.join("run"),
        dev_root: PathBuf::from("/"),
        host_dev_root: PathBuf::from("/"),
        driver_root: workdir.join("driver-root"),
        host_driver_root: workdir.join("driver-root"),
        proc_root: PathBuf::from("/proc"),
    };
    let model = load_node(
        &BackendSpec::Mock(None),
        None,
        &BackendPaths {
            state_dir: paths.state_dir.clone(),
            ..Default::default()
        },
        StateAccess::ReadWrite,
    )
    .map_err(|e| DemoError::Setup(e.to_string()))?;
    make_driver_root(&paths.driver_root, &model.inventory.driver_version).map_err(setup)?;
    let opts = PluginOptions {
        driver_name: DRIVER.into(),
        node_name: NODE.into(),
        paths: paths.clone(),
        rolling_update_pod_uid: None,
        stale_check_interval: Duration::from_secs(600),
        stale_min_age: Duration::from_secs(600),
        publish_debounce: Duration::from_millis(100),
        fail_points: FailPoints::default(),
        adopt_unknown_mig: false,
        interception_lib: Some(interception_lib.to_path_buf()),
        metrics_addr: None,
        watchdog: tessera::watchdog::Mode::Enforce,
        watchdog_tolerance: tessera::watchdog::DEFAULT_TOLERANCE,
    };
    let reg_socket = plugin::registration_socket_path(&paths.plugin_registry_dir, DRIVER, None);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let plugin_task = tokio::spawn(plugin::run(opts, model.clone(), client.clone(), async {
        let _ = stop_rx.await;
    }));

    let _ = writeln!(
        out,
        "Tessera demo: fake API server (Kubernetes {version}) + plugin on the mock node, in {}",
        workdir.display()
    );
    wait_for("the registration socket", || {
        reg_socket.exists().then_some(())
    })
    .await?;
    let (info, dra_version) =
        kubelet_standin::register(&reg_socket, &["v1.DRAPlugin", "v1beta1.DRAPlugin"])
            .await
            .map_err(step("registration"))?;
    let _ = writeln!(
        out,
        "kubelet: registered {} ({}), endpoint {}, versions {:?}, using {}",
        info.name,
        info.r#type,
        info.endpoint,
        info.supported_versions,
        if dra_version == DraVersion::V1 {
            "v1"
        } else {
            "v1beta1"
        }
    );
    let dra = DraClient::connect(Path::new(&info.endpoint))
        .await
        .map_err(step("connect"))?;
    // The whole pool: every slice of the current generation.
    let slices = wait_for("the ResourceSlices", || {
        let s = api.resource_slices();
        let complete = s
            .first()
            .is_some_and(|f| s.len() as i64 == f.spec.pool.resource_slice_count);
        complete.then_some(s)
    })
    .await?;
    let _ = writeln!(
        out,
        "\nnode {NODE}: {} ResourceSlice(s), pool generation {}",
        slices.len(),
        slices[0].spec.pool.generation
    );
    let mut mig_count: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        let attr = |k: &str| {
            d.attributes
                .as_ref()
                .and_then(|a| a.get(k))
                .and_then(|a| a.string.clone())
                .unwrap_or_default()
        };
        if attr("type") == "mig" {
            let parent = d.name.split("-mig-").next().unwrap_or_default().to_string();
            mig_count.entry(parent).or_default().push(attr("profile"));
            continue;
        }
        let mem = d
            .capacity
            .as_ref()
            .and_then(|c| c.get("memory"))
            .and_then(|c| c.value.0.parse::<u64>().ok())
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:<8} type={:<10} {:<24} {:>6.1} GiB  {}",
            d.name,
            attr("type"),
            attr("productName"),
            mem as f64 / (1u64 << 30) as f64,
            attr("resource.kubernetes.io/pcieRoot")
        );
    }
    for (parent, profiles) in &mig_count {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for p in profiles {
            match counts.iter_mut().find(|(n, _)| n == p) {
                Some((_, c)) => *c += 1,
                None => counts.push((p.clone(), 1)),
            }
        }
        let list: Vec<String> = counts.iter().map(|(p, c)| format!("{p}x{c}")).collect();
        let _ = writeln!(
            out,
            "  {parent}: {} MIG partitions (profile x placements): {}",
            profiles.len(),
            list.join(" ")
        );
    }

    let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let mut report = DemoReport::default();
    for phase in phases() {
        let _ = writeln!(out, "\nphase: {}", phase.title);
        let steps: Vec<schedule::Step> = phase
            .claims
            .iter()
            .map(|c| schedule::Step::Allocate(Box::new(claim_object(c))))
            .collect();
        let classes = tessera::device_classes::read(None).map_err(step("device classes"))?;
        let planned = schedule::run(&slices, &classes, &steps, &FeatureGates::defaults(version))
            .map_err(step("plan"))?;
        let mut allocations = Vec::new();
        for o in planned.outcomes {
            match o {
                schedule::Outcome::Allocated(c) => {
                    allocations.push(c.status.and_then(|s| s.allocation).unwrap_or_default())
                }
                schedule::Outcome::Failed { claim, reason } => {
                    return Err(DemoError::Step(format!(
                        "claim {} cannot be allocated: {reason}",
                        claim.metadata.name.unwrap_or_default()
                    )));
                }
                schedule::Outcome::Released { .. } => {}
            }
        }
        let mut kclaims = Vec::new();
        for (c, allocation) in phase.claims.iter().zip(&allocations) {
            let created = claims_api
                .create(&PostParams::default(), &claim_object(c))
                .await
                .map_err(step("create claim"))?;
            let allocated = crate::claims::ClaimBuilder::from_claim(created.clone())
                .allocation(allocation.clone())
                .reserved_for_its_pod()
                .build();
            claims_api
                .replace_status(c.name, &PostParams::default(), &allocated)
                .await
                .map_err(step("allocate claim"))?;
            kclaims.push(KubeletClaim {
                namespace: NAMESPACE.into(),
                uid: created.metadata.uid.clone().unwrap_or_default(),
                name: c.name.into(),
            });
        }
        let resp = dra.prepare_v1(&kclaims).await.map_err(step("prepare"))?;
        for (c, kc) in phase.claims.iter().zip(&kclaims) {
            let r = resp
                .claims
                .get(&kc.uid)
                .ok_or_else(|| DemoError::Step(format!("no answer for claim {}", c.name)))?;
            if !r.error.is_empty() {
                return Err(DemoError::Step(format!("prepare {}: {}", c.name, r.error)));
            }
            let devices: Vec<String> = r.devices.iter().map(|d| d.device_name.clone()).collect();
            let ids: Vec<String> = r
                .devices
                .iter()
                .flat_map(|d| d.cdi_device_ids.clone())
                .collect();
            let spec = paths
                .cdi_dir
                .join(format!("tessera.dev-gpu-{}.json", kc.uid));
            let _ = writeln!(
                out,
                "  claim {} ({} x {}): devices {}",
                c.name,
                c.count,
                c.wants,
                devices.join(", ")
            );
            for id in &ids {
                let _ = writeln!(out, "    CDI {id}");
            }
            let _ = writeln!(
                out,
                "    spec {} ({})",
                spec.display(),
                if spec.exists() { "written" } else { "MISSING" }
            );
            if c.share.is_some() {
                let dir = tessera::prepare::claim_files::claim_dir(&paths.run_dir, &kc.uid);
                let limits = std::fs::read_to_string(dir.join(tessera_abi::LIMITS_FILE))
                    .map_err(step("reading limits"))?;
                let parsed =
                    tessera_abi::limits::Limits::parse(&limits).map_err(step("parsing limits"))?;
                let control = std::fs::read(dir.join(tessera_abi::CONTROL_FILE))
                    .map_err(step("reading control"))?;
                let control =
                    tessera_abi::control::parse(&control).map_err(step("parsing control"))?;
                for (g, ctl) in parsed.gpus.iter().zip(&control) {
                    let _ = writeln!(
                        out,
                        "    budget on {}: {:.1} GiB memory, {} % compute reserved",
                        g.uuid,
                        g.memory_bytes as f64 / (1u64 << 30) as f64,
                        ctl.share
                    );
                }
                for f in [
                    tessera_abi::LIMITS_FILE,
                    tessera_abi::CONTROL_FILE,
                    tessera_abi::REGION_FILE,
                ] {
                    let _ = writeln!(out, "    {f:<8} {}", dir.join(f).display());
                }
                report.shared_limits.push((c.name.to_string(), limits));
            }
            report
                .prepared
                .push((c.name.to_string(), devices, ids, spec));
        }
        let mig_minors: std::collections::BTreeSet<u32> = report.prepared
            [report.prepared.len() - phase.claims.len()..]
            .iter()
            .flat_map(|(_, devs, _, _)| devs.iter())
            .filter_map(|d| match tessera::naming::parse_device_name(d) {
                Some(tessera::naming::DeviceRef::Mig { minor, .. }) => Some(minor),
                _ => None,
            })
            .collect();
        for minor in &mig_minors {
            let st = model
                .backend
                .mig_status(*minor)
                .map_err(step("MIG status"))?;
            let _ = writeln!(
                out,
                "  gpu-{minor}: MIG mode {}, {} MIG device(s):",
                if st.enabled { "on" } else { "off" },
                st.instances.len()
            );
            for i in &st.instances {
                let uuid = i.ci.as_ref().map(|c| c.uuid.as_str()).unwrap_or("-");
                let _ = writeln!(
                    out,
                    "    GI {:>2} profile {:>2} slices {}..{}  {uuid}",
                    i.gi_id,
                    i.profile_id,
                    i.start,
                    i.start + i.size
                );
            }
        }
        let resp = dra
            .unprepare_v1(&kclaims)
            .await
            .map_err(step("unprepare"))?;
        if let Some((uid, r)) = resp.claims.iter().find(|(_, r)| !r.error.is_empty()) {
            return Err(DemoError::Step(format!("unprepare {uid}: {}", r.error)));
        }
        let left: Vec<String> = std::fs::read_dir(&paths.cdi_dir)
            .map_err(setup)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let _ = writeln!(
            out,
            "  unprepared {} claim(s); CDI dir now holds {} file(s)",
            kclaims.len(),
            left.len()
        );
        for minor in &mig_minors {
            let st = model
                .backend
                .mig_status(*minor)
                .map_err(step("MIG status"))?;
            let _ = writeln!(
                out,
                "  gpu-{minor}: MIG mode {}, {} MIG device(s) left",
                if st.enabled { "on" } else { "off" },
                st.instances.len()
            );
            report.mig_left += st.instances.len();
        }
        report.leftover_files = left;
        report.leftover_claim_dirs = std::fs::read_dir(paths.run_dir.join("claims"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if phase.claims.iter().any(|c| c.share.is_some()) {
            let _ = writeln!(
                out,
                "  claim directories left: {}",
                report.leftover_claim_dirs.len()
            );
        }
    }
    let _ = stop_tx.send(());
    plugin_task
        .await
        .map_err(step("plugin task"))?
        .map_err(step("plugin"))?;
    let sockets_left = reg_socket.exists();
    let _ = writeln!(
        out,
        "\nplugin stopped; registration socket {}",
        if sockets_left {
            "still present (BUG)"
        } else {
            "removed"
        }
    );
    Ok(report)
}
