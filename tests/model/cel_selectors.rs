//! Specification of the DRA CEL environment: selectors evaluate against ResourceSlice
//! devices as the kube-scheduler evaluates them.

use std::collections::BTreeMap;

use k8s_model::cel::{CelError, DeviceInput, DeviceSelector, MAX_EXPRESSION_LEN};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const DRIVER: &str = "gpu.tessera.dev";

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    }
}

fn capacity(q: &str) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(q.to_owned()),
        ..Default::default()
    }
}

/// A full H100 as Tessera publishes it.
fn h100() -> Device {
    let attributes = BTreeMap::from([
        ("type".to_owned(), string("gpu")),
        (
            "uuid".to_owned(),
            string("GPU-4c8f6d2a-1b3e-4f5a-9c7d-8e9f0a1b2c3d"),
        ),
        ("productName".to_owned(), string("NVIDIA H100 80GB HBM3")),
        (
            "driverVersion".to_owned(),
            DeviceAttribute {
                version: Some("550.54.15".to_owned()),
                ..Default::default()
            },
        ),
        (
            "index".to_owned(),
            DeviceAttribute {
                int: Some(0),
                ..Default::default()
            },
        ),
        (
            "migCapable".to_owned(),
            DeviceAttribute {
                bool: Some(true),
                ..Default::default()
            },
        ),
        (
            "resource.kubernetes.io/pcieRoot".to_owned(),
            string("pci0000:00"),
        ),
    ]);
    let capacity = BTreeMap::from([
        ("memory".to_owned(), capacity("85520809984")),
        ("multiprocessors".to_owned(), capacity("132")),
    ]);
    Device {
        name: "gpu-0".to_owned(),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

fn input(device: &Device) -> DeviceInput<'_> {
    DeviceInput {
        driver: DRIVER,
        device,
        consumable_capacity: false,
    }
}

fn eval(expression: &str, device: &Device) -> Result<bool, CelError> {
    DeviceSelector::compile(expression)?.matches(&input(device))
}

fn eval_err(expression: &str, device: &Device) -> String {
    match eval(expression, device) {
        Err(CelError::Eval(message)) => message,
        other => panic!("{expression}: expected an evaluation error, got {other:?}"),
    }
}

/// The quantity examples of the Kubernetes CEL documentation hold.
#[test]
fn kubernetes_quantity_examples_hold() {
    let device = h100();
    for expression in [
        r#"quantity("1.5G").isGreaterThan(quantity("1G"))"#,
        r#"quantity("50k").add(20).asInteger() == 50020"#,
        r#"quantity("10Gi").compareTo(quantity("10G")) == 1"#,
        r#"quantity("200M").compareTo(quantity("0.2G")) == 0"#,
        r#"quantity("50M").isLessThan(quantity("100M"))"#,
        r#"quantity("50k").sub(20000) == quantity("30k")"#,
        r#"quantity("1Gi") == quantity("1024Mi")"#,
        r#"quantity("50000000G").isInteger()"#,
        r#"!quantity("1.5").isInteger()"#,
        r#"quantity("50.703k").asApproximateFloat() == 50703.0"#,
        r#"sign(quantity("-3")) == -1 && quantity("3").sign() == 1"#,
        r#"isQuantity("1.3Gi") && !isQuantity("1,3G") && !isQuantity("200K")"#,
    ] {
        assert_eq!(eval(expression, &device), Ok(true), "{expression}");
    }
}

/// Quantities have no `<`/`>` (a "no matching overload" error, as in Kubernetes), an
/// invalid quantity is an evaluation error, and `asInteger` refuses non-integers.
#[test]
fn quantity_misuse_is_an_evaluation_error() {
    let device = h100();
    let cases = [
        (
            r#"quantity("2Gi") > quantity("1Gi")"#,
            "no matching overload for '_>_'",
        ),
        (
            r#"quantity("2Gi") < quantity("1Gi")"#,
            "no matching overload for '_<_'",
        ),
        (
            r#"quantity("Three") == quantity("3")"#,
            "quantities must match the regular expression",
        ),
        (
            r#"quantity("1.5").asInteger() == 1"#,
            "cannot convert value to integer",
        ),
        (
            r#"quantity("9999999999999999999999999999999999999G").asInteger() == 1"#,
            "cannot convert value to integer",
        ),
    ];
    for (expression, want) in cases {
        let message = eval_err(expression, &device);
        assert!(message.contains(want), "{expression}: {message}");
    }
}

/// The semver examples of the Kubernetes CEL documentation hold, normalization included.
#[test]
fn kubernetes_semver_examples_hold() {
    let device = h100();
    for expression in [
        r#"semver("1.2.3").isLessThan(semver("1.10.0"))"#,
        r#"semver("01.01.01", true) == semver("1.1.1")"#,
        r#"semver("v1.0", true) == semver("1.0.0")"#,
        r#"semver("1.2.3").compareTo(semver("2.0.0")) == -1"#,
        r#"semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3"#,
        r#"isSemver("1.0.0") && !isSemver("v1.0") && isSemver("v1.0", true)"#,
        r#"semver("2.0.0").isGreaterThan(semver("2.0.0-rc.1"))"#,
    ] {
        assert_eq!(eval(expression, &device), Ok(true), "{expression}");
    }
    let message = eval_err(r#"semver("v1.0.0") == semver("1.0.0")"#, &device);
    assert!(message.contains("semver"), "{message}");
}

/// A DeviceClass selector matches Tessera's GPUs and no other driver's devices.
#[test]
fn device_class_selector_matches_by_driver_and_type() {
    let expression = r#"device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu""#;
    let selector = DeviceSelector::compile(expression).unwrap();
    assert_eq!(selector.expression(), expression);
    let device = h100();
    assert_eq!(selector.matches(&input(&device)), Ok(true));
    let other = DeviceInput {
        driver: "nic.example.com",
        device: &device,
        consumable_capacity: false,
    };
    assert_eq!(selector.matches(&other), Ok(false));
}

/// Request selectors see the GPU's product name, memory, version, index and PCIe root.
#[test]
fn request_selectors_see_a_realistic_gpu() {
    let device = h100();
    let cases = [
        (
            r#"device.attributes["gpu.tessera.dev"].productName.matches("H100") && device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0"#,
            true,
        ),
        (
            r#"device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("80Gi")) >= 0"#,
            false,
        ),
        (
            r#"device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("79Gi"))"#,
            true,
        ),
        (
            r#"device.capacity["gpu.tessera.dev"].memory == quantity("85520809984")"#,
            true,
        ),
        (
            r#"device.capacity["gpu.tessera.dev"].multiprocessors.asInteger() >= 132"#,
            true,
        ),
        (
            r#"device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("550.0.0"))"#,
            true,
        ),
        (
            r#"device.attributes["gpu.tessera.dev"].driverVersion == semver("550.54.15")"#,
            true,
        ),
        (
            r#"device.attributes["gpu.tessera.dev"].driverVersion.major() == 550"#,
            true,
        ),
        (r#"device.attributes["gpu.tessera.dev"].index == 0"#, true),
        (r#"device.attributes["gpu.tessera.dev"].migCapable"#, true),
        (
            r#"device.attributes["gpu.tessera.dev"].uuid.startsWith("GPU-")"#,
            true,
        ),
        (
            r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#,
            true,
        ),
        (
            r#"has(device.attributes["gpu.tessera.dev"].pcieRoot)"#,
            false,
        ),
        (r#""gpu.tessera.dev" in device.attributes"#, true),
        (r#""other.com" in device.attributes"#, false),
        (r#"size(device.attributes["gpu.tessera.dev"]) == 6"#, true),
    ];
    for (expression, want) in cases {
        assert_eq!(eval(expression, &device), Ok(want), "{expression}");
    }
}

/// An unknown domain is an empty map: its keys are missing, `has()` is false.
#[test]
fn unknown_domain_is_an_empty_map() {
    let device = h100();
    assert_eq!(
        eval(r#"has(device.attributes["other.com"].x)"#, &device),
        Ok(false)
    );
    assert_eq!(
        eval(r#"has(device.capacity["other.com"].memory)"#, &device),
        Ok(false)
    );
    assert_eq!(
        eval(r#"size(device.attributes["other.com"]) == 0"#, &device),
        Ok(true)
    );
    let message = eval_err(r#"device.attributes["other.com"].x == 1"#, &device);
    assert!(
        message.to_lowercase().contains("no such key: x"),
        "{message}"
    );
    let message = eval_err(
        r#"device.capacity["other.com"].memory == quantity("1")"#,
        &device,
    );
    assert!(message.to_lowercase().contains("no such key"), "{message}");
}

/// An unknown key in a known domain is a runtime error, not `false`.
#[test]
fn unknown_key_in_known_domain_is_an_error() {
    let device = h100();
    let message = eval_err(
        r#"device.attributes["gpu.tessera.dev"].missing == "x""#,
        &device,
    );
    assert!(
        message.to_lowercase().contains("no such key: missing"),
        "{message}"
    );
    let message = eval_err(
        r#"device.capacity["gpu.tessera.dev"].cores.sign() == 1"#,
        &device,
    );
    assert!(
        message.to_lowercase().contains("no such key: cores"),
        "{message}"
    );
}

/// Optional field selection falls back to the default for missing keys and domains.
#[test]
fn optionals_fall_back_to_defaults() {
    let device = h100();
    for expression in [
        r#"device.attributes["gpu.tessera.dev"].?missing.orValue("d") == "d""#,
        r#"device.attributes["gpu.tessera.dev"].?productName.orValue("d") == "NVIDIA H100 80GB HBM3""#,
        r#"device.attributes["other.com"].?x.orValue(7) == 7"#,
        r#"!device.attributes["gpu.tessera.dev"].?missing.hasValue()"#,
        r#"device.capacity["gpu.tessera.dev"].?memory.orValue(quantity("0")).isGreaterThan(quantity("1Gi"))"#,
    ] {
        assert_eq!(eval(expression, &device), Ok(true), "{expression}");
    }
}

/// `cel.bind` names a domain once for a whole expression.
#[test]
fn cel_bind_names_a_domain_once() {
    let device = h100();
    let expression = r#"cel.bind(gpu, device.attributes["gpu.tessera.dev"], gpu.type == "gpu" && gpu.index == 0 && gpu.migCapable)"#;
    assert_eq!(eval(expression, &device), Ok(true));
    let expression = r#"cel.bind(mem, device.capacity["gpu.tessera.dev"].memory, mem.isGreaterThan(quantity("40Gi")) && mem.isLessThan(quantity("80Gi")))"#;
    assert_eq!(eval(expression, &device), Ok(true));
    assert!(matches!(
        DeviceSelector::compile(r#"cel.bind("gpu", 1, true)"#),
        Err(CelError::Compile(message)) if message.contains("simple identifiers")
    ));
}

/// `device.allowMultipleAllocations` is visible only with DRAConsumableCapacity,
/// defaulting to false when the device does not set it.
#[test]
fn allow_multiple_allocations_follows_the_gate() {
    let mut device = h100();
    let expression = "has(device.allowMultipleAllocations)";
    assert_eq!(eval(expression, &device), Ok(false));
    let gated = |device: &Device, expression: &str| {
        DeviceSelector::compile(expression)
            .unwrap()
            .matches(&DeviceInput {
                driver: DRIVER,
                device,
                consumable_capacity: true,
            })
    };
    assert_eq!(gated(&device, expression), Ok(true));
    assert_eq!(gated(&device, "device.allowMultipleAllocations"), Ok(false));
    device.allow_multiple_allocations = Some(true);
    assert_eq!(gated(&device, "device.allowMultipleAllocations"), Ok(true));
    assert!(matches!(
        eval("device.allowMultipleAllocations", &device),
        Err(CelError::Eval(_))
    ));
}

/// List attributes are CEL lists, `includes()` works on lists and scalars alike.
#[test]
fn list_attributes_support_includes() {
    let mut device = h100();
    let attributes = device.attributes.as_mut().unwrap();
    attributes.insert(
        "models".to_owned(),
        DeviceAttribute {
            strings: Some(vec!["h100".to_owned(), "h100-sxm".to_owned()]),
            ..Default::default()
        },
    );
    attributes.insert(
        "cudaVersions".to_owned(),
        DeviceAttribute {
            versions: Some(vec!["12.4.0".to_owned(), "12.2.1".to_owned()]),
            ..Default::default()
        },
    );
    attributes.insert(
        "nvlinkPeers".to_owned(),
        DeviceAttribute {
            ints: Some(vec![1, 2, 3]),
            ..Default::default()
        },
    );
    for expression in [
        r#"device.attributes["gpu.tessera.dev"].models.includes("h100-sxm")"#,
        r#"!device.attributes["gpu.tessera.dev"].models.includes("a100")"#,
        r#"device.attributes["gpu.tessera.dev"].productName.includes("NVIDIA H100 80GB HBM3")"#,
        r#"device.attributes["gpu.tessera.dev"].cudaVersions.includes(semver("12.2.1"))"#,
        r#"device.attributes["gpu.tessera.dev"].cudaVersions.exists(v, v.isGreaterThan(semver("12.3.0")))"#,
        r#"device.attributes["gpu.tessera.dev"].nvlinkPeers.all(p, p > 0) && size(device.attributes["gpu.tessera.dev"].nvlinkPeers) == 3"#,
        r#"2 in device.attributes["gpu.tessera.dev"].nvlinkPeers"#,
    ] {
        assert_eq!(eval(expression, &device), Ok(true), "{expression}");
    }
}

/// A malformed attribute fails every selector on the device, as in Kubernetes.
#[test]
fn malformed_attribute_fails_evaluation() {
    let mut device = h100();
    device.attributes.as_mut().unwrap().insert(
        "firmware".to_owned(),
        DeviceAttribute {
            version: Some("v1.0".to_owned()),
            ..Default::default()
        },
    );
    let message = eval_err("true", &device);
    assert!(
        message.starts_with("attribute firmware: parse semantic version"),
        "{message}"
    );
    device
        .attributes
        .as_mut()
        .unwrap()
        .insert("firmware".to_owned(), DeviceAttribute::default());
    assert_eq!(
        eval_err("true", &device),
        "attribute firmware: unsupported attribute value"
    );
}

/// A non-bool result is `NotBool`, reported with its CEL type.
#[test]
fn non_bool_result_is_not_bool() {
    let device = h100();
    let err = eval(r#"device.attributes["gpu.tessera.dev"].index"#, &device).unwrap_err();
    assert_eq!(err, CelError::NotBool("int".to_owned()));
    assert!(
        err.to_string().contains("expression must return bool"),
        "{err}"
    );
    assert_eq!(
        eval(r#"device.capacity["gpu.tessera.dev"].memory"#, &device),
        Err(CelError::NotBool("kubernetes.Quantity".to_owned()))
    );
}

/// Expressions over 10 KiB are refused before parsing; syntax errors carry the parser's
/// position.
#[test]
fn compile_refuses_oversized_and_malformed_expressions() {
    let long = format!("device.driver == \"{}\"", "x".repeat(MAX_EXPRESSION_LEN));
    assert_eq!(
        DeviceSelector::compile(&long).unwrap_err(),
        CelError::TooLong { len: long.len() }
    );
    let err = DeviceSelector::compile(r#"device.driver == "gpu.tessera.dev" &&"#).unwrap_err();
    let CelError::Compile(message) = &err else {
        panic!("expected a compile error, got {err:?}");
    };
    assert!(message.starts_with("ERROR: <input>:1:"), "{message}");
    assert!(
        err.to_string()
            .starts_with("CEL compile error: compilation failed: ")
    );
}

/// One compiled selector evaluates many devices without re-parsing, each on its own.
#[test]
fn one_selector_evaluates_many_devices() {
    let selector = DeviceSelector::compile(
        r#"device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0"#,
    )
    .unwrap();
    let big = h100();
    let mut small = h100();
    small
        .capacity
        .as_mut()
        .unwrap()
        .insert("memory".to_owned(), capacity("20Gi"));
    let results: Vec<_> = [&big, &small, &big]
        .into_iter()
        .map(|device| selector.matches(&input(device)))
        .collect();
    assert_eq!(results, [Ok(true), Ok(false), Ok(true)]);
}
