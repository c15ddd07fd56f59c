//! Fixtures for the Kubernetes API rules in `k8s_model::validation`: each case states on
//! which releases an object is accepted or refused, and with which field path and kind.
//! Slice fixtures are checked twice: by the pure validator and by the fake API server
//! over HTTP (Status 422 with the cause's field path).

use std::collections::BTreeMap;

use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::validation::{
    FieldError, FieldErrorKind, PoolProblem, drop_disabled_fields, dropped_fields,
    dropped_fields_with_gates, validate_pool, validate_pool_for, validate_resource_claim,
    validate_resource_claim_status, validate_resource_slice,
};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements, Counter, CounterSet,
    Device, DeviceAttribute, DeviceCapacity, DeviceClaim, DeviceCounterConsumption, DeviceRequest,
    DeviceRequestAllocationResult, DeviceTaint, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use testkit::claims::ClaimBuilder;
use testkit::fakeapi::{FakeApiConfig, FakeApiServer};

const DRIVER: &str = "gpu.tessera.dev";

fn q(s: &str) -> Q {
    Q(s.to_string())
}

fn v(minor: u32) -> KubeVersion {
    KubeVersion::new(minor).expect("supported version")
}

fn all() -> Vec<u32> {
    vec![34, 35, 36, 37]
}

fn gates(minor: u32, overrides: &str) -> FeatureGates {
    FeatureGates::parse(v(minor), overrides).expect("valid gates")
}

/// Gates with every slice feature these fixtures use turned on.
const FEATURES: &str =
    "DRAPartitionableDevices=true,DRADeviceTaints=true,DRAConsumableCapacity=true";

fn string_attr(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    }
}

fn version_attr(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(s.to_string()),
        ..Default::default()
    }
}

fn int_attr(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}

fn capacity(value: &str) -> DeviceCapacity {
    DeviceCapacity {
        value: q(value),
        request_policy: None,
    }
}

fn plain_device(name: &str) -> Device {
    Device {
        name: name.to_string(),
        attributes: Some(BTreeMap::from([("type".to_string(), string_attr("gpu"))])),
        ..Default::default()
    }
}

/// A whole GPU as Tessera publishes it.
fn gpu(i: u32) -> Device {
    let attributes = BTreeMap::from([
        ("type".to_string(), string_attr("gpu")),
        (
            "uuid".to_string(),
            string_attr(&format!("GPU-4f2c9a1e-7d3b-4c8e-9a0f-1b2c3d4e5f{i:02}")),
        ),
        (
            "productName".to_string(),
            string_attr("NVIDIA A100-SXM4-80GB"),
        ),
        ("brand".to_string(), string_attr("Nvidia")),
        ("architecture".to_string(), string_attr("Ampere")),
        ("driverVersion".to_string(), version_attr("580.65.6")),
        ("cudaDriverVersion".to_string(), version_attr("13.0.0")),
        ("cudaComputeCapability".to_string(), version_attr("8.0.0")),
        ("index".to_string(), int_attr(i64::from(i))),
        (
            "resource.kubernetes.io/pciBusID".to_string(),
            string_attr(&format!("0000:{:02x}:00.0", 0x3b + i)),
        ),
    ]);
    let capacity = BTreeMap::from([
        ("memory".to_string(), capacity("80Gi")),
        ("multiprocessors".to_string(), capacity("108")),
    ]);
    Device {
        name: format!("gpu-{i}"),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

fn slice_with(
    devices: Option<Vec<Device>>,
    counter_sets: Option<Vec<CounterSet>>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("node-a-{DRIVER}-x7k2p")),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_string(),
            pool: ResourcePool {
                name: "node-a".to_string(),
                generation: 1,
                resource_slice_count: 1,
            },
            node_name: Some("node-a".to_string()),
            devices,
            shared_counters: counter_sets,
            ..Default::default()
        },
    }
}

fn slice(devices: Vec<Device>) -> ResourceSlice {
    slice_with(Some(devices), None)
}

fn counters(names: &[&str]) -> BTreeMap<String, Counter> {
    names
        .iter()
        .map(|n| (n.to_string(), Counter { value: q("1Gi") }))
        .collect()
}

fn counter_set(name: &str, names: &[&str]) -> CounterSet {
    CounterSet {
        name: name.to_string(),
        counters: counters(names),
    }
}

fn consuming(name: &str, set: &str) -> Device {
    Device {
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: set.to_string(),
            counters: counters(&["memory"]),
            compatibility_groups: None,
        }]),
        ..plain_device(name)
    }
}

fn taint() -> DeviceTaint {
    DeviceTaint {
        key: "gpu.tessera.dev/unhealthy".to_string(),
        value: Some("xid-79".to_string()),
        effect: "NoSchedule".to_string(),
        time_added: None,
    }
}

fn tainted(name: &str) -> Device {
    Device {
        taints: Some(vec![taint()]),
        ..plain_device(name)
    }
}

fn many(n: usize, make: impl Fn(&str) -> Device) -> Vec<Device> {
    (0..n).map(|i| make(&format!("gpu-{i}"))).collect()
}

/// A shared GPU whose memory can be requested in 2Gi steps from 2Gi.
fn shared_gpu(default: &str, max: Option<&str>) -> Device {
    let policy = CapacityRequestPolicy {
        default: Some(q(default)),
        valid_range: Some(CapacityRequestPolicyRange {
            min: q("2Gi"),
            max: max.map(q),
            step: Some(q("2Gi")),
        }),
        valid_values: None,
    };
    Device {
        allow_multiple_allocations: Some(true),
        capacity: Some(BTreeMap::from([(
            "memory".to_string(),
            DeviceCapacity {
                value: q("80Gi"),
                request_policy: Some(policy),
            },
        )])),
        ..plain_device("gpu-0")
    }
}

/// Expected outcome of one fixture on one release.
#[derive(Debug, Clone, Copy)]
enum Want {
    Accept,
    /// Exactly one error, with this field path and kind.
    Reject(&'static str, FieldErrorKind),
}

fn show(errs: &[FieldError]) -> String {
    errs.iter().map(|e| format!("\n  {e}")).collect()
}

fn check(case: &str, minor: u32, errs: &[FieldError], want: Want) {
    match want {
        Want::Accept => assert!(
            errs.is_empty(),
            "{case} on 1.{minor}: want accepted, got:{}",
            show(errs)
        ),
        Want::Reject(field, kind) => {
            assert!(
                errs.len() == 1 && errs[0].field == field && errs[0].kind == kind,
                "{case} on 1.{minor}: want exactly {kind:?} at {field}, got:{}",
                show(errs)
            );
        }
    }
}

/// A table row: case name, slice, expected outcome per release.
type Row = (&'static str, ResourceSlice, Vec<(u32, Want)>);

/// Runs table rows with [`FEATURES`] gates on: each row through the pure validator and
/// again through the fake API server over HTTP, which must answer 201 or a 422 Status
/// whose single cause names the same field and reason.
fn run_slices(rows: Vec<Row>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for (case, s, wants) in rows {
        for (minor, want) in wants {
            let g = gates(minor, FEATURES);
            let errs = validate_resource_slice(&s, &g);
            check(case, minor, &errs, want);
            // The server first drops the fields of disabled gates (here: binding
            // conditions, which FEATURES leaves off), then validates what is left.
            let mut stored = s.clone();
            drop_disabled_fields(&mut stored, &g);
            let http_want = if stored == s {
                match want {
                    Want::Accept => None,
                    Want::Reject(field, kind) => Some((field.to_string(), kind)),
                }
            } else {
                validate_resource_slice(&stored, &g)
                    .first()
                    .map(|e| (e.field.clone(), e.kind))
            };
            rt.block_on(check_over_http(case, minor, g, &s, http_want));
        }
    }
}

async fn check_over_http(
    case: &str,
    minor: u32,
    g: FeatureGates,
    s: &ResourceSlice,
    want: Option<(String, FieldErrorKind)>,
) {
    let server = FakeApiServer::start(FakeApiConfig { gates: g })
        .await
        .expect("fake API server");
    let api: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    let result = api.create(&PostParams::default(), s).await;
    match (want, result) {
        (None, Ok(_)) => {}
        (None, Err(e)) => panic!("{case} on 1.{minor} over HTTP: want 201, got {e}"),
        (Some((field, kind)), Err(kube::Error::Api(status))) => {
            assert_eq!(status.code, 422, "{case} on 1.{minor}: {status:?}");
            assert_eq!(status.reason, "Invalid", "{case} on 1.{minor}");
            let causes = status.details.map(|d| d.causes).unwrap_or_default();
            assert!(
                causes.len() == 1 && causes[0].field == field && causes[0].reason == kind.reason(),
                "{case} on 1.{minor} over HTTP: want {} at {field}, got {causes:?}",
                kind.reason()
            );
        }
        (Some((field, _)), other) => {
            panic!("{case} on 1.{minor} over HTTP: want 422 at {field}, got {other:?}")
        }
    }
}

fn on(minors: Vec<u32>, want: Want) -> Vec<(u32, Want)> {
    minors.into_iter().map(|m| (m, want)).collect()
}

/// One device over 128 is refused on every release, with Kubernetes' message.
#[test]
fn a_slice_over_128_plain_devices_is_rejected_on_every_release() {
    let s = slice(many(129, plain_device));
    run_slices(vec![
        (
            "129 plain devices",
            s.clone(),
            on(all(), Want::Reject("spec.devices", FieldErrorKind::TooMany)),
        ),
        (
            "128 plain devices",
            slice(many(128, plain_device)),
            on(all(), Want::Accept),
        ),
    ]);
    let errs = validate_resource_slice(&s, &FeatureGates::defaults(v(37)));
    assert_eq!(
        errs[0].to_string(),
        "spec.devices: Too many: 129: must have at most 128 items"
    );
    assert_eq!(errs[0].reason(), "FieldValueTooMany");
}

/// From 1.35 a slice whose devices consume counters or carry taints holds at most 64
/// devices; 1.34 still allows 128.
#[test]
fn counter_consuming_or_tainted_devices_are_limited_to_64_from_1_35() {
    let sets_134 = Some(vec![counter_set("gpu-counters", &["memory"])]);
    let reject = Want::Reject("spec.devices", FieldErrorKind::TooMany);
    run_slices(vec![
        (
            "65 counter-consuming devices, counters in their own slice",
            slice(many(65, |n| consuming(n, "gpu-counters"))),
            on(vec![35, 36, 37], reject),
        ),
        (
            "64 counter-consuming devices",
            slice(many(64, |n| consuming(n, "gpu-counters"))),
            on(vec![35, 36, 37], Want::Accept),
        ),
        (
            "65 counter-consuming devices, 1.34 layout",
            slice_with(Some(many(65, |n| consuming(n, "gpu-counters"))), sets_134),
            on(vec![34], Want::Accept),
        ),
        ("65 tainted devices", slice(many(65, tainted)), {
            let mut w = on(vec![35, 36, 37], reject);
            w.push((34, Want::Accept));
            w
        }),
    ]);
}

/// Attributes and capacities together are limited to 32 per device.
#[test]
fn a_device_with_33_attributes_and_capacities_is_rejected() {
    let mut d = plain_device("gpu-0");
    d.attributes = Some(
        (0..20)
            .map(|i| (format!("attr_{i}"), int_attr(i)))
            .collect(),
    );
    d.capacity = Some(
        (0..13)
            .map(|i| (format!("cap_{i}"), capacity("1")))
            .collect(),
    );
    run_slices(vec![(
        "33 attributes+capacities",
        slice(vec![d]),
        on(
            all(),
            Want::Reject("spec.devices[0]", FieldErrorKind::Invalid),
        ),
    )]);
    let mut d = plain_device("gpu-0");
    d.attributes = Some(
        (0..32)
            .map(|i| (format!("attr_{i}"), int_attr(i)))
            .collect(),
    );
    run_slices(vec![(
        "32 attributes",
        slice(vec![d]),
        on(all(), Want::Accept),
    )]);
}

/// From 1.35 a slice holds at most 8 counter sets; 1.34 only limits the counters in all
/// sets together.
#[test]
fn nine_counter_sets_in_one_slice_are_rejected_from_1_35() {
    let sets: Vec<CounterSet> = (0..9)
        .map(|i| counter_set(&format!("gpu-{i}-counters"), &["memory"]))
        .collect();
    let s = slice_with(None, Some(sets));
    let mut wants = on(
        vec![35, 36, 37],
        Want::Reject("spec.sharedCounters", FieldErrorKind::TooMany),
    );
    wants.push((34, Want::Accept));
    run_slices(vec![("9 counter sets", s, wants)]);
}

/// From 1.35 counter sets must be published in slices without devices.
#[test]
fn shared_counters_and_devices_in_one_slice_are_rejected_from_1_35() {
    let s = slice_with(
        Some(vec![consuming("gpu-0", "gpu-0-counters")]),
        Some(vec![counter_set("gpu-0-counters", &["memory"])]),
    );
    let mut wants = on(
        vec![35, 36, 37],
        Want::Reject("spec", FieldErrorKind::Invalid),
    );
    wants.push((34, Want::Accept));
    run_slices(vec![("devices with their counter set", s, wants)]);
}

/// 1.34 limits the counters of all counter sets of a slice to 32 together.
#[test]
fn more_than_32_counters_in_all_sets_are_rejected_on_1_34() {
    let names: Vec<String> = (0..17).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let sets = vec![
        counter_set("gpu-0-counters", &refs),
        counter_set("gpu-1-counters", &refs),
    ];
    let mut wants = on(vec![35, 36, 37], Want::Accept);
    wants.push((
        34,
        Want::Reject("spec.sharedCounters", FieldErrorKind::Invalid),
    ));
    run_slices(vec![(
        "34 counters in 2 sets",
        slice_with(None, Some(sets)),
        wants,
    )]);
}

/// A capacity request policy is only allowed on devices that allow multiple allocations.
#[test]
fn a_request_policy_needs_allow_multiple_allocations() {
    let mut d = shared_gpu("2Gi", None);
    d.allow_multiple_allocations = None;
    let path = "spec.devices[0].capacity[memory].requestPolicy";
    run_slices(vec![
        (
            "policy without allowMultipleAllocations",
            slice(vec![d]),
            on(all(), Want::Reject(path, FieldErrorKind::Forbidden)),
        ),
        (
            "valid policy",
            slice(vec![shared_gpu("4Gi", Some("80Gi"))]),
            on(all(), Want::Accept),
        ),
    ]);
}

/// A range policy's default and max must both be `min + n·step`.
#[test]
fn range_default_and_max_must_be_min_plus_whole_steps() {
    let path = "spec.devices[0].capacity[memory].requestPolicy.validRange.step";
    let reject = Want::Reject(path, FieldErrorKind::Invalid);
    run_slices(vec![
        (
            "default 3Gi off the 2Gi grid",
            slice(vec![shared_gpu("3Gi", None)]),
            on(all(), reject),
        ),
        (
            "max 79Gi off the 2Gi grid",
            slice(vec![shared_gpu("4Gi", Some("79Gi"))]),
            on(all(), reject),
        ),
    ]);
    let errs = validate_resource_slice(&slice(vec![shared_gpu("3Gi", None)]), &gates(37, FEATURES));
    assert_eq!(errs[0].bad_value.as_deref(), Some("\"3Gi\""));
    assert_eq!(
        errs[0].detail,
        "value is not a multiple of a given step (2Gi) from (2Gi)"
    );
}

/// Device names are unique within a slice; the duplicate is reported at its index.
#[test]
fn device_names_must_be_unique_within_a_slice() {
    let s = slice(vec![gpu(0), gpu(0)]);
    run_slices(vec![(
        "gpu-0 twice",
        s.clone(),
        on(
            all(),
            Want::Reject("spec.devices[1]", FieldErrorKind::Duplicate),
        ),
    )]);
    let errs = validate_resource_slice(&s, &FeatureGates::defaults(v(35)));
    assert_eq!(
        errs[0].to_string(),
        "spec.devices[1]: Duplicate value: \"gpu-0\""
    );
}

/// Device, counter-set and counter names must be DNS labels.
#[test]
fn names_that_are_not_dns_labels_are_rejected() {
    let invalid = |f| Want::Reject(f, FieldErrorKind::Invalid);
    run_slices(vec![
        (
            "upper-case device name",
            slice(vec![plain_device("GPU-0")]),
            on(all(), invalid("spec.devices[0].name")),
        ),
        (
            "dotted device name",
            slice(vec![plain_device("gpu.0")]),
            on(all(), invalid("spec.devices[0].name")),
        ),
        (
            "counter set name with underscore",
            slice_with(None, Some(vec![counter_set("gpu_0", &["memory"])])),
            on(all(), invalid("spec.sharedCounters[0].name")),
        ),
        (
            "counter name with upper case",
            slice_with(None, Some(vec![counter_set("gpu-0", &["Memory"])])),
            vec![
                (34, invalid("spec.sharedCounters[0].counters[Memory]")),
                (35, invalid("spec.sharedCounters[0].counters[Memory]")),
                (36, invalid("spec.sharedCounters[0].counters[Memory]")),
                // 1.37 reports map-key errors on the map (declarative validation).
                (37, invalid("spec.sharedCounters[0].counters")),
            ],
        ),
        (
            "consumed counter set name with underscore",
            slice(vec![consuming("gpu-0", "gpu_0")]),
            on(
                vec![35, 36, 37],
                invalid("spec.devices[0].consumesCounters[0].counterSet"),
            ),
        ),
    ]);
    let errs = validate_resource_slice(
        &slice(vec![plain_device("Gpu")]),
        &FeatureGates::defaults(v(36)),
    );
    assert_eq!(
        errs[0].to_string(),
        "spec.devices[0].name: Invalid value: \"Gpu\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    );
}

/// Version attributes are strict semver: NVIDIA's `580.65.06` must be normalized first.
#[test]
fn a_version_attribute_with_a_leading_zero_is_rejected() {
    let mut d = gpu(0);
    d.attributes
        .get_or_insert_default()
        .insert("driverVersion".into(), version_attr("580.65.06"));
    let path = "spec.devices[0].attributes[driverVersion].version";
    run_slices(vec![(
        "driver version 580.65.06",
        slice(vec![d.clone()]),
        on(all(), Want::Reject(path, FieldErrorKind::Invalid)),
    )]);
    let errs = validate_resource_slice(&slice(vec![d]), &FeatureGates::defaults(v(34)));
    assert_eq!(errs[0].bad_value.as_deref(), Some("\"580.65.06\""));
}

/// String attributes hold at most 64 bytes.
#[test]
fn a_string_attribute_over_64_bytes_is_rejected() {
    let mut d = gpu(0);
    d.attributes
        .get_or_insert_default()
        .insert("productName".into(), string_attr(&"x".repeat(65)));
    let path = "spec.devices[0].attributes[productName].string";
    run_slices(vec![(
        "65-byte product name",
        slice(vec![d.clone()]),
        on(all(), Want::Reject(path, FieldErrorKind::TooLong)),
    )]);
    let errs = validate_resource_slice(&slice(vec![d]), &FeatureGates::defaults(v(37)));
    assert_eq!(
        errs[0].to_string(),
        format!("{path}: Too long: may not be more than 64 bytes")
    );
}

/// A realistic node slice of whole GPUs passes every release with default gates, and the
/// server drops nothing from it.
#[test]
fn a_realistic_gpu_slice_is_accepted_on_every_release() {
    let s = slice((0..8).map(gpu).collect());
    for minor in all() {
        let g = FeatureGates::defaults(v(minor));
        let mut stored = s.clone();
        drop_disabled_fields(&mut stored, &g);
        assert!(dropped_fields(&s, &stored).is_empty(), "1.{minor}");
        let errs = validate_resource_slice(&stored, &g);
        assert!(errs.is_empty(), "1.{minor}:{}", show(&errs));
    }
}

/// With DRAConsumableCapacity off the server drops requestPolicy and
/// allowMultipleAllocations, and `dropped_fields` names both.
#[test]
fn disabled_consumable_capacity_drops_request_policy_and_multiple_allocations() {
    let sent = slice(vec![shared_gpu("4Gi", Some("80Gi"))]);
    for g in [
        gates(37, "DRAConsumableCapacity=false"),
        FeatureGates::defaults(v(34)),
        FeatureGates::defaults(v(35)),
    ] {
        let mut stored = sent.clone();
        drop_disabled_fields(&mut stored, &g);
        let device = &stored.spec.devices.as_ref().expect("devices")[0];
        assert_eq!(device.allow_multiple_allocations, None);
        assert_eq!(
            device.capacity.as_ref().expect("capacity")["memory"].request_policy,
            None
        );
        assert_eq!(
            dropped_fields(&sent, &stored),
            vec![
                "spec.devices[0].allowMultipleAllocations".to_string(),
                "spec.devices[0].capacity[memory].requestPolicy".to_string(),
            ]
        );
        assert!(
            dropped_fields_with_gates(&sent, &stored)
                .iter()
                .all(|d| d.gate == "DRAConsumableCapacity")
        );
        assert!(validate_resource_slice(&stored, &g).is_empty());
    }
    let mut kept = sent.clone();
    drop_disabled_fields(&mut kept, &FeatureGates::defaults(v(36)));
    assert_eq!(kept, sent);
}

fn pool_slice(
    name_suffix: &str,
    devices: Option<Vec<Device>>,
    sets: Option<Vec<CounterSet>>,
    count: i64,
) -> ResourceSlice {
    let mut s = slice_with(devices, sets);
    s.metadata.name = Some(format!("node-a-{DRIVER}-{name_suffix}"));
    s.spec.pool.resource_slice_count = count;
    s
}

/// A device name may occur only once in a whole pool, across slices.
#[test]
fn the_pool_check_catches_a_device_name_repeated_across_slices() {
    let a = pool_slice("a", Some(vec![gpu(0), gpu(1)]), None, 2);
    let b = pool_slice("b", Some(vec![gpu(1)]), None, 2);
    let problems = validate_pool(&[&a, &b]);
    assert_eq!(
        problems,
        vec![PoolProblem::DuplicateDevice {
            device: "gpu-1".into(),
            first_slice: 0,
            slice: 1
        }]
    );
    assert_eq!(
        problems[0].to_string(),
        "device \"gpu-1\" in slice 1 is already defined in slice 0"
    );
}

/// Every counter set a device consumes from must be defined somewhere in the pool.
#[test]
fn the_pool_check_catches_an_unknown_counter_set() {
    let counters = pool_slice(
        "a",
        None,
        Some(vec![counter_set("gpu-0-counters", &["memory"])]),
        2,
    );
    let devices = pool_slice(
        "b",
        Some(vec![
            consuming("gpu-0", "gpu-0-counters"),
            consuming("gpu-1", "gpu-1-counters"),
        ]),
        None,
        2,
    );
    let problems = validate_pool(&[&counters, &devices]);
    assert_eq!(
        problems,
        vec![PoolProblem::UnknownCounterSet {
            slice: 1,
            device: "gpu-1".into(),
            counter_set: "gpu-1-counters".into()
        }]
    );
    // The 1.35 layout is right for 1.35 and wrong for 1.34.
    assert_eq!(validate_pool_for(&[&counters, &devices], v(35)).len(), 1);
    assert!(
        validate_pool_for(&[&counters, &devices], v(34))
            .iter()
            .any(|p| matches!(p, PoolProblem::CounterSetInOtherSlice { slice: 1, .. }))
    );
}

fn claim(requests: Vec<DeviceRequest>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("train-0-gpu".into()),
            namespace: Some("ml".into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

fn request(name: &str, class: &str) -> DeviceRequest {
    DeviceRequest {
        name: name.to_string(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.to_string(),
            ..Default::default()
        }),
        first_available: None,
    }
}

/// Claim specs: unique DNS-label request names, a device class, a positive count.
#[test]
fn claim_specs_follow_the_request_rules() {
    let g = FeatureGates::defaults(v(37));
    let mut zero_class = request("gpu", "");
    zero_class.name = "gpu".into();
    let mut negative = request("gpu", "gpu.tessera.dev");
    negative.exactly.as_mut().expect("exactly").count = Some(-1);
    let cases = [
        (
            "valid",
            claim(vec![request("gpu", "gpu.tessera.dev")]),
            Want::Accept,
        ),
        (
            "duplicate request",
            claim(vec![
                request("gpu", "gpu.tessera.dev"),
                request("gpu", "gpu.tessera.dev"),
            ]),
            Want::Reject("spec.devices.requests[1]", FieldErrorKind::Duplicate),
        ),
        (
            "missing class",
            claim(vec![zero_class]),
            Want::Reject(
                "spec.devices.requests[0].exactly.deviceClassName",
                FieldErrorKind::Required,
            ),
        ),
        (
            "negative count",
            claim(vec![negative]),
            Want::Reject(
                "spec.devices.requests[0].exactly.count",
                FieldErrorKind::Invalid,
            ),
        ),
        (
            "too many requests",
            claim(
                (0..33)
                    .map(|i| request(&format!("r{i}"), "gpu.tessera.dev"))
                    .collect(),
            ),
            Want::Reject("spec.devices.requests", FieldErrorKind::TooMany),
        ),
    ];
    for (case, c, want) in cases {
        check(case, 37, &validate_resource_claim(&c, &g), want);
    }
}

/// A request's `capacity.requests`: stored unchecked up to 1.37; from 1.38 at most 32
/// entries, qualified names and no negative quantity (v1.38.0-beta.0's
/// `validateCapacityRequirements` and its declarative rules).
#[test]
fn capacity_requests_are_checked_from_1_38() {
    let with_capacity = |entries: Vec<(String, &str)>| {
        let mut r = request("gpu", "gpu.tessera.dev");
        r.exactly.as_mut().expect("exactly").capacity = Some(CapacityRequirements {
            requests: Some(
                entries
                    .into_iter()
                    .map(|(k, q)| (k, Q(q.to_string())))
                    .collect(),
            ),
        });
        claim(vec![r])
    };
    let path = "spec.devices.requests[0].exactly.capacity.requests";
    let cases = [
        (
            "memory and compute",
            with_capacity(vec![
                ("memory".into(), "2Gi"),
                ("gpu.tessera.dev/compute".into(), "25"),
            ]),
            Want::Accept,
            Want::Accept,
        ),
        (
            "a name that is not a qualified name",
            with_capacity(vec![("memory!".into(), "2Gi")]),
            Want::Accept,
            Want::Reject(path, FieldErrorKind::Invalid),
        ),
        (
            "a negative quantity",
            with_capacity(vec![("memory".into(), "-1")]),
            Want::Accept,
            Want::Reject(
                "spec.devices.requests[0].exactly.capacity.requests[memory]",
                FieldErrorKind::Invalid,
            ),
        ),
        (
            "33 entries",
            with_capacity((0..33).map(|i| (format!("c{i}"), "1")).collect()),
            Want::Accept,
            Want::Reject(path, FieldErrorKind::TooMany),
        ),
    ];
    for (case, c, on_137, on_138) in cases {
        check(
            case,
            37,
            &validate_resource_claim(&c, &FeatureGates::defaults(v(37))),
            on_137,
        );
        check(
            case,
            38,
            &validate_resource_claim(&c, &FeatureGates::defaults(v(38))),
            on_138,
        );
    }
}

fn allocated(c: &ResourceClaim, request: &str, share_id: Option<&str>) -> ResourceClaim {
    ClaimBuilder::from_claim(c.clone())
        .allocated(DeviceRequestAllocationResult {
            share_id: share_id.map(str::to_string),
            ..testkit::claims::result(request, "node-a", "gpu-0")
        })
        .build()
}

/// Allocation results name a request of the claim, carry lowercase UUID share IDs, and
/// never change once written.
#[test]
fn claim_status_updates_follow_the_allocation_rules() {
    let base = claim(vec![request("gpu", "gpu.tessera.dev")]);
    let ok = allocated(&base, "gpu", Some("ac051fac-2ead-46d9-b8b4-4e0fbeb7455d"));
    let cases = [
        ("valid allocation", ok.clone(), base.clone(), Want::Accept),
        (
            "unknown request",
            allocated(&base, "cpu", None),
            base.clone(),
            Want::Reject(
                "status.allocation.devices.results[0].request",
                FieldErrorKind::Invalid,
            ),
        ),
        (
            "upper-case share ID",
            allocated(&base, "gpu", Some("AC051FAC-2EAD-46D9-B8B4-4E0FBEB7455D")),
            base.clone(),
            Want::Reject(
                "status.allocation.devices.results[0].shareID",
                FieldErrorKind::Invalid,
            ),
        ),
        (
            "allocation rewritten",
            allocated(&base, "gpu", None),
            ok.clone(),
            Want::Reject("status.allocation", FieldErrorKind::Invalid),
        ),
    ];
    for (case, new, old, want) in cases {
        check(case, 37, &validate_resource_claim_status(&new, &old), want);
    }
}

/// Taints, binding conditions, list attributes, discrete request values and 1.34's
/// same-slice counter references follow each release's rules.
#[test]
fn other_device_rules_follow_each_release() {
    let five_taints = Device {
        taints: Some(vec![taint(); 5]),
        ..plain_device("gpu-0")
    };
    let mut none_effect = tainted("gpu-0");
    none_effect.taints.get_or_insert_default()[0].effect = "None".into();
    let mut half_binding = plain_device("gpu-0");
    half_binding.binding_conditions = Some(vec!["gpu.tessera.dev/attached".into()]);
    let mut empty_list = plain_device("gpu-0");
    empty_list.attributes.get_or_insert_default().insert(
        "models".into(),
        DeviceAttribute {
            strings: Some(vec![]),
            ..Default::default()
        },
    );
    let mut discrete = shared_gpu("4Gi", None);
    if let Some(p) = discrete
        .capacity
        .get_or_insert_default()
        .get_mut("memory")
        .and_then(|c| c.request_policy.as_mut())
    {
        p.valid_range = None;
        p.valid_values = Some(vec![q("8Gi"), q("4Gi")]);
    }
    let mut missing_default = discrete.clone();
    if let Some(p) = missing_default
        .capacity
        .get_or_insert_default()
        .get_mut("memory")
        .and_then(|c| c.request_policy.as_mut())
    {
        p.valid_values = Some(vec![q("8Gi"), q("16Gi")]);
    }
    let dangling_134 = slice_with(
        Some(vec![consuming("gpu-0", "gpu-9-counters")]),
        Some(vec![counter_set("gpu-0-counters", &["memory"])]),
    );
    let mut wants_taints = on(vec![35, 36, 37], Want::Accept);
    wants_taints.push((
        34,
        Want::Reject("spec.devices[0].taints", FieldErrorKind::TooMany),
    ));
    let mut wants_none = on(vec![35, 36, 37], Want::Accept);
    wants_none.push((
        34,
        Want::Reject(
            "spec.devices[0].taints[0].effect",
            FieldErrorKind::NotSupported,
        ),
    ));
    let mut wants_list = on(
        vec![36, 37],
        Want::Reject(
            "spec.devices[0].attributes[models].strings",
            FieldErrorKind::Invalid,
        ),
    );
    // Before 1.36 the list field does not exist, so the attribute has no value at all.
    wants_list.extend(on(
        vec![34, 35],
        Want::Reject(
            "spec.devices[0].attributes[models]",
            FieldErrorKind::Invalid,
        ),
    ));
    run_slices(vec![
        ("5 taints", slice(vec![five_taints]), wants_taints),
        ("taint effect None", slice(vec![none_effect]), wants_none),
        (
            "bindingConditions without bindingFailureConditions",
            slice(vec![half_binding]),
            on(
                all(),
                Want::Reject(
                    "spec.devices[0].bindingFailureConditions",
                    FieldErrorKind::Invalid,
                ),
            ),
        ),
        ("empty string list", slice(vec![empty_list]), wants_list),
        (
            "unsorted valid values",
            slice(vec![discrete]),
            on(
                all(),
                Want::Reject(
                    "spec.devices[0].capacity[memory].requestPolicy.validValues[1]",
                    FieldErrorKind::Invalid,
                ),
            ),
        ),
        (
            "default not among valid values",
            slice(vec![missing_default]),
            on(
                all(),
                Want::Reject(
                    "spec.devices[0].capacity[memory].requestPolicy.validValues",
                    FieldErrorKind::Invalid,
                ),
            ),
        ),
        (
            "1.34 reference to a counter set of another slice",
            dangling_134,
            vec![(
                34,
                Want::Reject(
                    "spec.devices[0].consumesCounters[0].counterSet",
                    FieldErrorKind::Invalid,
                ),
            )],
        ),
    ]);
}
