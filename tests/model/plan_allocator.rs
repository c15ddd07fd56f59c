//! The scheduling simulator behind `tessera plan`, on handcrafted slices: first fit,
//! selectors, constraints with backtracking, firstAvailable, All, counters, consumable
//! capacity, invalid pools, failure reasons, and the default node's inventory.

use std::collections::BTreeMap;

use k8s_model::allocator::{AllocError, Allocator};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements, Counter, CounterSet,
    Device, DeviceAttribute, DeviceCapacity, DeviceClaim, DeviceConstraint,
    DeviceCounterConsumption, DeviceRequest, DeviceSubRequest, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const D: &str = "gpu.tessera.dev";

fn s(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    }
}

fn gpu(name: &str, product: &str, root: &str) -> Device {
    Device {
        name: name.into(),
        attributes: Some(BTreeMap::from([
            ("type".to_string(), s("gpu")),
            ("productName".to_string(), s(product)),
            ("resource.kubernetes.io/pcieRoot".to_string(), s(root)),
        ])),
        capacity: Some(BTreeMap::from([(
            "memory".to_string(),
            DeviceCapacity {
                value: Quantity("80Gi".into()),
                request_policy: None,
            },
        )])),
        ..Default::default()
    }
}

fn slice(name: &str, devices: Vec<Device>, counters: Option<Vec<CounterSet>>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: D.into(),
            node_name: Some("node-a".into()),
            pool: ResourcePool {
                name: "node-a".into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: (!devices.is_empty()).then_some(devices),
            shared_counters: counters,
            ..Default::default()
        },
    }
}

fn gates(v: u32) -> FeatureGates {
    FeatureGates::defaults(KubeVersion::new(v).unwrap())
}

fn classes() -> Vec<k8s_openapi::api::resource::v1::DeviceClass> {
    tessera::device_classes::read(None).unwrap()
}

fn request(name: &str, class: &str, count: i64, selectors: &[&str]) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            count: Some(count),
            selectors: sel(selectors),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sel(exprs: &[&str]) -> Option<Vec<k8s_openapi::api::resource::v1::DeviceSelector>> {
    (!exprs.is_empty()).then(|| {
        exprs
            .iter()
            .map(|e| k8s_openapi::api::resource::v1::DeviceSelector {
                cel: Some(k8s_openapi::api::resource::v1::CELDeviceSelector {
                    expression: e.to_string(),
                }),
            })
            .collect()
    })
}

fn claim(
    name: &str,
    requests: Vec<DeviceRequest>,
    constraints: Vec<DeviceConstraint>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: (!constraints.is_empty()).then_some(constraints),
                config: None,
            }),
        }),
        status: None,
    }
}

fn devices_of(r: &k8s_openapi::api::resource::v1::AllocationResult) -> Vec<(String, String)> {
    r.devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()
        .iter()
        .map(|x| (x.request.clone(), x.device.clone()))
        .collect()
}

fn names(r: &k8s_openapi::api::resource::v1::AllocationResult) -> Vec<String> {
    devices_of(r).into_iter().map(|(_, d)| d).collect()
}

fn three_gpus() -> Vec<ResourceSlice> {
    vec![slice(
        "s0",
        vec![
            gpu("gpu-0", "NVIDIA H100 80GB HBM3", "pci0000:00"),
            gpu("gpu-1", "Tesla T4", "pci0000:80"),
            gpu("gpu-2", "Tesla T4", "pci0000:80"),
        ],
        None,
    )]
}

/// Claims take the first free devices in slice order; taken devices stay taken until
/// released.
#[test]
fn first_fit_in_order_and_release() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let r = a
        .allocate(&claim(
            "a",
            vec![request("gpu", "gpu.tessera.dev", 1, &[])],
            vec![],
        ))
        .unwrap();
    assert_eq!(names(&r), ["gpu-0"]);
    let r = a
        .allocate(&claim(
            "b",
            vec![request("gpu", "gpu.tessera.dev", 2, &[])],
            vec![],
        ))
        .unwrap();
    assert_eq!(names(&r), ["gpu-1", "gpu-2"]);
    let err = a
        .allocate(&claim(
            "c",
            vec![request("gpu", "gpu.tessera.dev", 1, &[])],
            vec![],
        ))
        .unwrap_err();
    assert!(matches!(err, AllocError::Unsatisfiable(_)), "{err}");
    assert!(a.release("default", "a"));
    let r = a
        .allocate(&claim(
            "c",
            vec![request("gpu", "gpu.tessera.dev", 1, &[])],
            vec![],
        ))
        .unwrap();
    assert_eq!(names(&r), ["gpu-0"]);
    assert_eq!(
        r.node_selector.unwrap().node_selector_terms[0]
            .match_fields
            .as_ref()
            .unwrap()[0]
            .values
            .as_ref()
            .unwrap()[0],
        "node-a"
    );
}

/// Request selectors narrow the candidates; the class selector applies too.
#[test]
fn selectors_pick_matching_devices() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let r = a
        .allocate(&claim(
            "t4",
            vec![request(
                "gpu",
                "gpu.tessera.dev",
                1,
                &[r#"device.attributes["gpu.tessera.dev"].productName == "Tesla T4""#],
            )],
            vec![],
        ))
        .unwrap();
    assert_eq!(names(&r), ["gpu-1"]);
    // The MIG class matches nothing here (no device has type mig).
    let err = a
        .allocate(&claim(
            "mig",
            vec![request("p", "mig.tessera.dev", 1, &[])],
            vec![],
        ))
        .unwrap_err();
    assert!(err.to_string().contains("0 device(s) match"), "{err}");
}

/// A two-GPU claim on one PCIe root: naive first fit takes gpu-0 and fails; the
/// backtracking search finds gpu-1 + gpu-2, as the scheduler does.
#[test]
fn match_attribute_needs_backtracking() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let c = claim(
        "pair",
        vec![request("gpus", "gpu.tessera.dev", 2, &[])],
        vec![DeviceConstraint {
            match_attribute: Some("resource.kubernetes.io/pcieRoot".into()),
            requests: None,
            distinct_attribute: None,
        }],
    );
    assert_eq!(names(&a.allocate(&c).unwrap()), ["gpu-1", "gpu-2"]);
}

/// distinctAttribute forces different values across requests.
#[test]
fn distinct_attribute_spreads_devices() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let c = claim(
        "spread",
        vec![
            request("a", "gpu.tessera.dev", 1, &[]),
            request(
                "b",
                "gpu.tessera.dev",
                1,
                &[r#"device.attributes["gpu.tessera.dev"].productName == "Tesla T4""#],
            ),
        ],
        vec![DeviceConstraint {
            distinct_attribute: Some("gpu.tessera.dev/productName".into()),
            requests: Some(vec!["a".into(), "b".into()]),
            match_attribute: None,
        }],
    );
    assert_eq!(
        devices_of(&a.allocate(&c).unwrap()),
        [
            ("a".to_string(), "gpu-0".to_string()),
            ("b".to_string(), "gpu-1".to_string())
        ]
    );
}

/// firstAvailable tries subrequests in order and reports `req/sub`.
#[test]
fn first_available_falls_back_in_order() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let fa = |name: &str| DeviceRequest {
        name: name.into(),
        first_available: Some(vec![
            DeviceSubRequest {
                name: "h100".into(),
                device_class_name: "gpu.tessera.dev".into(),
                selectors: sel(&[
                    r#"device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100")"#,
                ]),
                ..Default::default()
            },
            DeviceSubRequest {
                name: "t4".into(),
                device_class_name: "gpu.tessera.dev".into(),
                selectors: sel(&[
                    r#"device.attributes["gpu.tessera.dev"].productName == "Tesla T4""#,
                ]),
                count: Some(2),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let r = a.allocate(&claim("x", vec![fa("gpu")], vec![])).unwrap();
    assert_eq!(
        devices_of(&r),
        [("gpu/h100".to_string(), "gpu-0".to_string())]
    );
    let r = a.allocate(&claim("y", vec![fa("gpu")], vec![])).unwrap();
    assert_eq!(
        devices_of(&r),
        [
            ("gpu/t4".to_string(), "gpu-1".to_string()),
            ("gpu/t4".to_string(), "gpu-2".to_string())
        ]
    );
}

/// allocationMode All takes every matching device, and fails if one is taken.
#[test]
fn allocation_mode_all() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let all_t4 = |n: &str| {
        let mut r = request(
            "t4s",
            "gpu.tessera.dev",
            1,
            &[r#"device.attributes["gpu.tessera.dev"].productName == "Tesla T4""#],
        );
        let e = r.exactly.as_mut().unwrap();
        e.allocation_mode = Some("All".into());
        e.count = None;
        claim(n, vec![r], vec![])
    };
    assert_eq!(
        names(&a.allocate(&all_t4("one")).unwrap()),
        ["gpu-1", "gpu-2"]
    );
    assert!(a.allocate(&all_t4("two")).is_err());
}

fn counter_set(name: &str, slices: u32) -> CounterSet {
    CounterSet {
        name: name.into(),
        counters: (0..slices)
            .map(|i| {
                (
                    format!("memory-slice-{i}"),
                    Counter {
                        value: Quantity("1".into()),
                    },
                )
            })
            .collect(),
    }
}

fn partition(name: &str, set: &str, slices: std::ops::Range<u32>) -> Device {
    Device {
        name: name.into(),
        attributes: Some(BTreeMap::from([("type".to_string(), s("mig"))])),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: set.into(),
            counters: slices
                .map(|i| {
                    (
                        format!("memory-slice-{i}"),
                        Counter {
                            value: Quantity("1".into()),
                        },
                    )
                })
                .collect(),
            compatibility_groups: None,
        }]),
        ..Default::default()
    }
}

/// Devices consuming the same counters exclude one another, in both slice layouts.
#[test]
fn counters_exclude_overlapping_partitions() {
    let devices = vec![
        partition("big", "c", 0..4),
        partition("left", "c", 0..2),
        partition("right", "c", 2..4),
    ];
    let split = vec![
        {
            let mut s0 = slice("s0", vec![], Some(vec![counter_set("c", 4)]));
            s0.spec.pool.resource_slice_count = 2;
            s0
        },
        {
            let mut s1 = slice("s1", devices.clone(), None);
            s1.spec.pool.resource_slice_count = 2;
            s1
        },
    ];
    let combined = vec![slice("s0", devices, Some(vec![counter_set("c", 4)]))];
    for (slices, v) in [(split, 37), (combined, 34)] {
        let mut a = Allocator::new(&slices, &classes(), &gates(v)).unwrap();
        assert!(a.skipped_pools().is_empty(), "{:?}", a.skipped_pools());
        let one = |n: &str| claim(n, vec![request("p", "mig.tessera.dev", 1, &[])], vec![]);
        assert_eq!(names(&a.allocate(&one("a")).unwrap()), ["big"], "1.{v}");
        let err = a.allocate(&one("b")).unwrap_err();
        assert!(
            err.to_string().contains("3 device(s) match, 0 available"),
            "{err}"
        );
        a.release("default", "a");
        let r = a
            .allocate(&claim(
                "c",
                vec![request("p", "mig.tessera.dev", 2, &[])],
                vec![],
            ))
            .unwrap();
        assert_eq!(names(&r), ["left", "right"], "1.{v}");
    }
}

fn shared_gpu() -> Device {
    let policy = |default: &str, min: &str, step: &str, max: Option<&str>| CapacityRequestPolicy {
        default: Some(Quantity(default.into())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity(min.into()),
            max: max.map(|m| Quantity(m.into())),
            step: Some(Quantity(step.into())),
        }),
        valid_values: None,
    };
    Device {
        name: "gpu-1".into(),
        allow_multiple_allocations: Some(true),
        attributes: Some(BTreeMap::from([("type".to_string(), s("gpu-shared"))])),
        capacity: Some(BTreeMap::from([
            (
                "memory".to_string(),
                DeviceCapacity {
                    value: Quantity("80Gi".into()),
                    request_policy: Some(policy("80Gi", "1Mi", "1Mi", None)),
                },
            ),
            (
                "compute".to_string(),
                DeviceCapacity {
                    value: Quantity("100".into()),
                    request_policy: Some(policy("0", "0", "1", Some("100"))),
                },
            ),
        ])),
        ..Default::default()
    }
}

fn shared_claim(name: &str, caps: &[(&str, &str)]) -> ResourceClaim {
    let mut r = request("gpu", "shared.tessera.dev", 1, &[]);
    if !caps.is_empty() {
        r.exactly.as_mut().unwrap().capacity = Some(CapacityRequirements {
            requests: Some(
                caps.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
        });
    }
    claim(name, vec![r], vec![])
}

/// Several claims share one multi-allocatable GPU until memory runs out; requests are
/// rounded by the policy and reported in consumedCapacity with a shareID.
#[test]
fn consumable_capacity_shares_and_rounds() {
    let slices = vec![slice("s0", vec![shared_gpu()], None)];
    let mut a = Allocator::new(&slices, &classes(), &gates(37)).unwrap();
    let r = a
        .allocate(&shared_claim("a", &[("memory", "20Gi"), ("compute", "25")]))
        .unwrap();
    let res = &r.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    let cc = res.consumed_capacity.as_ref().unwrap();
    assert_eq!(
        (cc["memory"].0.as_str(), cc["compute"].0.as_str()),
        ("20Gi", "25")
    );
    let sid = res.share_id.clone().unwrap();
    assert_eq!(sid.len(), 36);
    let r = a
        .allocate(&shared_claim("b", &[("memory", "1500Ki")]))
        .unwrap();
    let res = &r.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    let cc = res.consumed_capacity.as_ref().unwrap();
    assert_eq!(
        (cc["memory"].0.as_str(), cc["compute"].0.as_str()),
        ("2Mi", "0")
    );
    assert_ne!(res.share_id.as_ref().unwrap(), &sid);
    // 80Gi - 20Gi - 2Mi left: 60Gi does not fit, 59Gi does.
    assert!(
        a.allocate(&shared_claim("c", &[("memory", "60Gi")]))
            .is_err()
    );
    assert!(
        a.allocate(&shared_claim("d", &[("memory", "59Gi")]))
            .is_ok()
    );
    // A claim asking for nothing takes the whole GPU: impossible while others share it.
    assert!(a.allocate(&shared_claim("e", &[])).is_err());
    for n in ["a", "b", "d"] {
        a.release("default", n);
    }
    let r = a.allocate(&shared_claim("e", &[])).unwrap();
    let cc = r.devices.unwrap().results.unwrap()[0]
        .consumed_capacity
        .clone()
        .unwrap();
    assert_eq!(cc["memory"].0, "80Gi");
}

/// Pools with cross-slice problems are skipped with the reason.
#[test]
fn invalid_pools_are_skipped_with_the_reason() {
    let mut dup = vec![
        slice("s0", vec![gpu("gpu-0", "x", "r")], None),
        slice("s1", vec![gpu("gpu-0", "x", "r")], None),
    ];
    for s in &mut dup {
        s.spec.pool.resource_slice_count = 2;
    }
    let unknown_set = vec![slice("s0", vec![partition("p", "nope", 0..1)], None)];
    let incomplete = {
        let mut s = three_gpus();
        s[0].spec.pool.resource_slice_count = 2;
        s
    };
    for (slices, want) in [
        (dup, "gpu-0"),
        (unknown_set, "nope"),
        (incomplete, "incomplete pool"),
    ] {
        let mut a = Allocator::new(&slices, &classes(), &gates(37)).unwrap();
        let skipped = a.skipped_pools();
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].reason.contains(want), "{}", skipped[0].reason);
        assert!(
            a.allocate(&claim(
                "a",
                vec![request("gpu", "gpu.tessera.dev", 1, &[])],
                vec![]
            ))
            .is_err()
        );
    }
}

/// Each kind of failure names its cause.
#[test]
fn failures_explain_themselves() {
    let mut a = Allocator::new(&three_gpus(), &classes(), &gates(37)).unwrap();
    let cases: Vec<(ResourceClaim, &str)> = vec![
        (
            claim(
                "noclass",
                vec![request("gpu", "nope.example.com", 1, &[])],
                vec![],
            ),
            "device class nope.example.com does not exist",
        ),
        (
            claim(
                "badcel",
                vec![request("gpu", "gpu.tessera.dev", 1, &["device.driver =="])],
                vec![],
            ),
            "selector #0",
        ),
        (
            claim(
                "toomany",
                vec![request("gpu", "gpu.tessera.dev", 4, &[])],
                vec![],
            ),
            "3 device(s) match, 3 available, 4 needed",
        ),
        (
            claim(
                "nomatch",
                vec![request(
                    "gpu",
                    "gpu.tessera.dev",
                    1,
                    &[r#"device.attributes["gpu.tessera.dev"].productName == "A100""#],
                )],
                vec![],
            ),
            "0 device(s) match",
        ),
        (
            claim(
                "constraint",
                vec![request("gpus", "gpu.tessera.dev", 3, &[])],
                vec![DeviceConstraint {
                    match_attribute: Some("resource.kubernetes.io/pcieRoot".into()),
                    requests: None,
                    distinct_attribute: None,
                }],
            ),
            "cannot be satisfied together",
        ),
    ];
    for (c, want) in cases {
        let err = a.allocate(&c).unwrap_err().to_string();
        assert!(err.contains(want), "{}: {err}", c.metadata.name.unwrap());
    }
}

/// The default node's inventory feeds the planner and the demo's whole-GPU phase
/// allocates as its table says: w1 → gpu-0, w2 → gpu-2 + gpu-3.
#[test]
fn default_inventory_allocates_the_demo_table() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "inventory",
            "--backend",
            "mock",
            "--node-name",
            "demo-node",
            "-o",
            "json",
            "--state-dir",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slices: Vec<ResourceSlice> =
        schedule::documents(&String::from_utf8_lossy(&out.stdout), "inventory")
            .unwrap()
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
    let steps: Vec<schedule::Step> = testkit::demo::phases()[0]
        .claims
        .iter()
        .map(|c| schedule::Step::Allocate(Box::new(testkit::demo::claim_object(c))))
        .collect();
    let result = schedule::run(&slices, &classes(), &steps, &gates(37)).unwrap();
    let got: Vec<Vec<String>> = result
        .outcomes
        .iter()
        .map(|o| match o {
            schedule::Outcome::Allocated(c) => {
                names(c.status.as_ref().unwrap().allocation.as_ref().unwrap())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            vec!["gpu-0".to_string()],
            vec!["gpu-2".to_string(), "gpu-3".to_string()]
        ]
    );
}

/// Runs the `tessera` binary with `args`, `stdin` piped in and `RUST_LOG` set; returns
/// (success, stdout, stderr).
fn tessera(args: &[&str], stdin: &[u8], log: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env("RUST_LOG", log)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The mock node's inventory, as `tessera inventory` prints it for `plan --slices -`.
fn mock_inventory() -> Vec<u8> {
    let (ok, out, err) = tessera(
        &[
            "inventory",
            "--backend",
            "mock",
            "--node-name",
            "ci-node",
            "--state-dir",
            "/nonexistent",
        ],
        b"",
        "warn",
    );
    assert!(ok, "{err}");
    out.into_bytes()
}

/// `tessera plan --classes deploy/deviceclasses`, the folder a user reaches for, reads
/// its DeviceClasses past the kustomization.yaml beside them (noted at debug level) and
/// allocates the whole-GPU example exactly as the built-in classes do.
#[test]
fn plan_reads_the_deviceclasses_folder_past_its_kustomization() {
    let slices = mock_inventory();
    let claims = "examples/claims/whole-gpus.yaml";
    let (ok, folder, err) = tessera(
        &[
            "plan",
            "--slices",
            "-",
            "--classes",
            "deploy/deviceclasses",
            claims,
        ],
        &slices,
        "debug",
    );
    assert!(ok, "plan --classes deploy/deviceclasses failed: {err}");
    assert!(
        err.contains("kustomization.yaml") && err.contains("Kustomization"),
        "the skipped kustomization is noted at debug level: {err}"
    );
    let (ok, builtin, err) = tessera(&["plan", "--slices", "-", claims], &slices, "warn");
    assert!(ok, "{err}");
    assert_eq!(
        folder, builtin,
        "the folder's classes are the built-in ones"
    );
    assert!(
        folder.contains("w1") && folder.contains("gpu-0"),
        "{folder}"
    );
    // The claim folder of the examples and a folder of slices read the same way.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("slices.yaml"), &slices).unwrap();
    std::fs::copy(
        "deploy/deviceclasses/kustomization.yaml",
        dir.path().join("kustomization.yaml"),
    )
    .unwrap();
    let slices_dir = dir.path().to_str().unwrap();
    let (ok, from_dir, err) = tessera(&["plan", "--slices", slices_dir, claims], b"", "warn");
    assert!(ok, "plan --slices <folder with a kustomization>: {err}");
    assert_eq!(from_dir, builtin);
}

/// A DeviceClass that does not decode is a clear error naming file, document and field,
/// however many other documents the folder has; a folder without any DeviceClass is
/// refused rather than read as no classes.
#[test]
fn plan_refuses_a_malformed_device_class_and_a_folder_without_one() {
    let slices = mock_inventory();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        "deploy/deviceclasses/kustomization.yaml",
        dir.path().join("kustomization.yaml"),
    )
    .unwrap();
    let only_kustomization = dir.path().to_str().unwrap().to_string();
    let (ok, _, err) = tessera(
        &[
            "plan",
            "--slices",
            "-",
            "--classes",
            &only_kustomization,
            "examples/claims/whole-gpus.yaml",
        ],
        &slices,
        "warn",
    );
    assert!(!ok);
    assert!(err.contains("no DeviceClass"), "{err}");
    std::fs::write(
        dir.path().join("gpu.tessera.dev.yaml"),
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: gpu.tessera.dev}\nspec:\n  selectors: {cel: 1}\n",
    )
    .unwrap();
    let (ok, _, err) = tessera(
        &[
            "plan",
            "--slices",
            "-",
            "--classes",
            &only_kustomization,
            "examples/claims/whole-gpus.yaml",
        ],
        &slices,
        "warn",
    );
    assert!(!ok);
    assert!(
        err.contains("gpu.tessera.dev.yaml: document 0") && err.contains("spec.selectors"),
        "{err}"
    );
}

/// Every example claim and workload is one the API server stores on every release, with
/// its default gates and with every DRA gate the real-cluster tests turn on
/// (`tests/cluster/up.sh`, each where the release has it), so `tessera plan` plans it
/// rather than refusing it.
#[test]
fn every_example_claim_is_one_the_api_server_would_store() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let steps = schedule::read_steps(&[root.join("claims"), root.join("workloads")])
        .expect("the examples read");
    assert!(steps.len() >= 12, "{} steps", steps.len());
    let cluster_gates = [
        "DRAConsumableCapacity",
        "DRAPartitionableDevices",
        "DRAExtendedResource",
        "DRADeviceTaints",
        "DRADeviceTaintRules",
        "DRAAdminAccess",
    ];
    let gate_sets = KubeVersion::ALL.into_iter().flat_map(|v| {
        let on: Vec<String> = cluster_gates
            .iter()
            .map(|g| format!("{g}=true"))
            .filter(|g| FeatureGates::parse(v, g).is_ok())
            .collect();
        assert!(on.len() >= 2, "{v}: {on:?}");
        [
            FeatureGates::defaults(v),
            FeatureGates::parse(v, &on.join(",")).expect("the cluster's gates"),
        ]
    });
    for gates in gate_sets {
        let version = gates.version();
        let result = schedule::run(&[], &[], &steps, &gates).expect("planned");
        for outcome in &result.outcomes {
            if let schedule::Outcome::Failed { claim, reason } = outcome {
                assert!(
                    !reason.contains("API server would refuse"),
                    "{version}: {:?}: {reason}",
                    claim.metadata.name
                );
            }
        }
    }
}
