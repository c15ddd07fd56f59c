use super::*;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_cdi::{ContainerEdits, Device};

const DRIVER: &str = "gpu.tessera.dev";

fn claim(name: &str, pod_claim: Option<&str>, results: &[(&str, &str)]) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            annotations: pod_claim.map(|p| {
                [(POD_CLAIM_NAME_ANNOTATION.to_string(), p.to_string())]
                    .into_iter()
                    .collect()
            }),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .iter()
                            .map(|(request, device)| DeviceRequestAllocationResult {
                                request: request.to_string(),
                                driver: DRIVER.into(),
                                pool: "node-a".into(),
                                device: device.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn device(request: &str, name: &str) -> PreparedDevice {
    PreparedDevice {
        request_names: vec![request.into()],
        pool_name: "node-a".into(),
        device_name: name.into(),
        cdi_device_ids: vec![format!("tessera.dev/gpu=u-1-{name}")],
        share_id: None,
        gpu_uuid: "GPU-1".into(),
        config: Default::default(),
        mig: None,
        budget: None,
    }
}

fn uuid_attr(d: &PreparedDevice) -> BTreeMap<String, DeviceAttribute> {
    BTreeMap::from([(
        "uuid".to_string(),
        DeviceAttribute {
            string: Some(format!("uuid-of-{}", d.device_name)),
            ..Default::default()
        },
    )])
}

/// The file is the Go helper's JSON stream: v1beta1 then v1alpha1, each indented by
/// two spaces and ended by a newline, fields in Go's order.
#[test]
fn a_direct_claims_file_is_the_helpers_stream() {
    let c = claim("c", None, &[("gpu", "gpu-2")]);
    let files = render(
        DRIVER,
        &ClaimIdentity::of(&c, "u-1"),
        &[device("gpu", "gpu-2")],
        &uuid_attr,
    )
    .unwrap();
    let one = |v: &str| {
        format!(
            r#"{{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/{v}",
  "metadata": {{
    "name": "c",
    "namespace": "ns",
    "uid": "u-1",
    "generation": 1
  }},
  "requests": [
    {{
      "name": "gpu",
      "devices": [
        {{
          "driver": "gpu.tessera.dev",
          "pool": "node-a",
          "name": "gpu-2",
          "attributes": {{
            "uuid": {{
              "string": "uuid-of-gpu-2"
            }}
          }}
        }}
      ]
    }}
  ]
}}
"#
        )
    };
    assert_eq!(files.len(), 1);
    assert_eq!(
        String::from_utf8(files[0].bytes.clone()).unwrap(),
        one("v1beta1") + &one("v1alpha1")
    );
    assert_eq!(
        files[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/gpu/gpu.tessera.dev-metadata.json"
    );
    assert_eq!(files[0].cdi_device, "u-1-gpu-2");
}

/// A claim made from a template is found under its pod claim name, which the file also
/// names; a subrequest keeps its full name in the file and its base name in the path;
/// each request gets its own file, mounted on its first device only.
#[test]
fn template_claims_subrequests_and_requests_each_have_their_place() {
    let c = claim(
        "pod-gpus-x7k2p",
        Some("gpus"),
        &[
            ("big/h100", "gpu-0"),
            ("big/h100", "gpu-1"),
            ("small", "gpu-2"),
        ],
    );
    let devices = [
        device("big", "gpu-0"),
        device("big", "gpu-1"),
        device("small", "gpu-2"),
    ];
    let files = render(DRIVER, &ClaimIdentity::of(&c, "u-1"), &devices, &uuid_attr).unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f.container_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/big/gpu.tessera.dev-metadata.json",
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/small/gpu.tessera.dev-metadata.json",
        ]
    );
    let first: serde_json::Value = serde_json::Deserializer::from_slice(&files[0].bytes)
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(first["podClaimName"], "gpus");
    assert_eq!(first["metadata"]["name"], "pod-gpus-x7k2p");
    assert_eq!(first["requests"][0]["name"], "big/h100");
    assert_eq!(first["requests"][0]["devices"].as_array().unwrap().len(), 2);

    let mut spec = Spec::new(
        "auto",
        "tessera.dev/gpu",
        devices
            .iter()
            .map(|d| Device::new(format!("u-1-{}", d.device_name), ContainerEdits::default()))
            .collect(),
    );
    add_mounts(&mut spec, &files, DRIVER, Path::new("/run/tessera"), "u-1");
    let mounts: Vec<(String, Vec<String>)> = spec
        .devices
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                d.container_edits
                    .mounts
                    .iter()
                    .map(|m| format!("{} -> {}", m.host_path, m.container_path))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (
                "u-1-gpu-0".to_string(),
                vec![format!(
                    "/run/tessera/metadata/u-1/big/gpu.tessera.dev-metadata.json -> {}",
                    paths[0]
                )]
            ),
            ("u-1-gpu-1".to_string(), vec![]),
            (
                "u-1-gpu-2".to_string(),
                vec![format!(
                    "/run/tessera/metadata/u-1/small/gpu.tessera.dev-metadata.json -> {}",
                    paths[1]
                )]
            ),
        ]
    );
}

/// Names that would be path segments must be DNS labels; otherwise nothing is rendered.
#[test]
fn names_that_are_not_dns_labels_are_refused() {
    let cases = [
        (claim("../etc", None, &[]), "gpu"),
        (claim("c", Some("A_B"), &[]), "gpu"),
        (claim("c", None, &[]), ".."),
    ];
    for (c, request) in cases {
        let r = render(
            DRIVER,
            &ClaimIdentity::of(&c, "u-1"),
            &[device(request, "gpu-0")],
            &uuid_attr,
        );
        assert!(
            matches!(r, Err(MetadataError::Name { .. })),
            "{:?} {request}: {r:?}",
            c.metadata.name
        );
    }
}

/// Create writes each request's file read-only (a retry replaces the directory);
/// remove and sweep leave nothing, sweep keeping the known claims.
#[test]
fn create_remove_and_sweep() {
    let run = tempfile::tempdir().unwrap();
    let c = claim("c", None, &[("gpu", "gpu-2")]);
    let files = render(
        DRIVER,
        &ClaimIdentity::of(&c, "u-1"),
        &[device("gpu", "gpu-2")],
        &uuid_attr,
    )
    .unwrap();
    let d = create(run.path(), "u-1", DRIVER, &files).unwrap();
    let f = d.join("gpu").join(file_name(DRIVER));
    assert_eq!(fs::read(&f).unwrap(), files[0].bytes);
    assert_eq!(
        fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o444
    );
    create(run.path(), "u-1", DRIVER, &files).unwrap();
    fs::create_dir(run.path().join("metadata/.u-2.tmp")).unwrap();
    fs::create_dir(run.path().join("metadata/u-3")).unwrap();
    let mut swept = sweep(run.path(), &BTreeSet::from(["u-1".to_string()])).unwrap();
    swept.sort();
    assert_eq!(swept, [".u-2.tmp", "u-3"]);
    remove(run.path(), "u-1").unwrap();
    remove(run.path(), "u-1").unwrap();
    assert_eq!(
        fs::read_dir(run.path().join("metadata")).unwrap().count(),
        0
    );
}
