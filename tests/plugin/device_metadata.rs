//! KEP-5304 device metadata files as the plugin writes and mounts them: per claim and
//! request, in the Go helper library's format, at the KEP's in-container path for a
//! claim the pod names and for one made from a template, removed at unprepare.

use testkit::harness;

use harness::{Harness, NODE};
use kube::api::PostParams;
use serde_json::Value;
use testkit::kubelet_standin::KubeletClaim;

/// The first object of a metadata file (the newest version).
fn first_doc(bytes: &[u8]) -> Value {
    serde_json::Deserializer::from_slice(bytes)
        .into_iter::<Value>()
        .next()
        .expect("one object")
        .expect("JSON")
}

/// The (host path, container path) of every mount in claim `uid`'s CDI spec that is
/// a metadata file.
fn metadata_mounts(h: &Harness, uid: &str) -> Vec<(String, String)> {
    let spec: Value = serde_json::from_slice(
        &std::fs::read(
            h.opts
                .paths
                .cdi_dir
                .join(format!("tessera.dev-gpu-{uid}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["containerEdits"]["mounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|m| {
            m["containerPath"]
                .as_str()
                .unwrap()
                .starts_with("/var/run/kubernetes.io/")
        })
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap().to_string(),
                m["containerPath"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Marks claim `c` as made from a template, named `pod_name` in its pod, as the
/// resource claim controller does.
async fn from_template(h: &Harness, c: &KubeletClaim, pod_name: &str) {
    let api = h.claims();
    let mut claim = api.get(&c.name).await.unwrap();
    claim
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            "resource.kubernetes.io/pod-claim-name".into(),
            pod_name.into(),
        );
    api.replace(&c.name, &PostParams::default(), &claim)
        .await
        .unwrap();
}

/// With `deviceMetadata` on: a claim the pod names gets its file under
/// `resourceclaims/<claim>/<request>/`, a template's under
/// `resourceclaimtemplates/<pod claim name>/<request>/`, each mounted read-only through
/// the claim's CDI spec and naming the device with its slice attributes (the GPU's
/// UUID, product) and, for a MIG device created on demand, the MIG UUID; unprepare
/// removes them.
#[tokio::test]
async fn metadata_files_are_written_mounted_and_removed() {
    let mut h = Harness::new().await;
    h.model.config.device_metadata = true;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let direct = h
        .allocated_claim("direct", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let templ = h
        .allocated_claim(
            "pod-a-mig-x2k9q",
            &[("mig", NODE, "gpu-0-mig-1g10gb-19-6", None)],
            &[],
        )
        .await;
    from_template(&h, &templ, "mig").await;
    harness::wait_until("slices published", || !h.api.resource_slices().is_empty()).await;
    let resp = k
        .prepare_v1(&[direct.clone(), templ.clone()])
        .await
        .unwrap();
    for c in [&direct, &templ] {
        assert_eq!(resp.claims[&c.uid].error, "", "{}", c.name);
    }
    let gpu = |minor: u32| {
        h.model
            .gpus
            .iter()
            .find(|g| g.gpu.minor == minor)
            .unwrap()
            .gpu
            .clone()
    };

    let m = metadata_mounts(&h, &direct.uid);
    assert_eq!(
        m.iter().map(|(_, c)| c.as_str()).collect::<Vec<_>>(),
        [
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/direct/gpu/gpu.tessera.dev-metadata.json"
        ]
    );
    let doc = first_doc(&std::fs::read(&m[0].0).unwrap());
    assert_eq!(doc["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    assert_eq!(doc["metadata"]["uid"], direct.uid.as_str());
    let dev = &doc["requests"][0]["devices"][0];
    assert_eq!(
        (&dev["name"], &dev["pool"]),
        (&Value::from("gpu-2"), &Value::from(NODE))
    );
    assert_eq!(dev["attributes"]["uuid"]["string"], gpu(2).uuid.as_str());
    assert_eq!(
        dev["attributes"]["productName"]["string"],
        gpu(2).product_name.as_str()
    );

    let m = metadata_mounts(&h, &templ.uid);
    assert_eq!(
        m.iter().map(|(_, c)| c.as_str()).collect::<Vec<_>>(),
        [
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/mig/mig/gpu.tessera.dev-metadata.json"
        ]
    );
    let doc = first_doc(&std::fs::read(&m[0].0).unwrap());
    assert_eq!(doc["podClaimName"], "mig");
    let attrs = &doc["requests"][0]["devices"][0]["attributes"];
    assert!(
        attrs["uuid"]["string"]
            .as_str()
            .unwrap()
            .starts_with("MIG-"),
        "{attrs}"
    );
    assert_eq!(attrs["parentUUID"]["string"], gpu(0).uuid.as_str());
    assert_eq!(attrs["profile"]["string"], "1g.10gb");

    k.unprepare_v1(&[direct.clone(), templ.clone()])
        .await
        .unwrap();
    let left = harness::list_files(&h.opts.paths.run_dir.join("metadata"));
    assert_eq!(left, Vec::<String>::new());
    p.stop().await;
}

/// With `deviceMetadata` off (the built-in default), nothing is written or mounted.
#[tokio::test]
async fn without_device_metadata_nothing_is_mounted() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim("plain", &[("gpu", NODE, "gpu-3", None)], &[])
        .await;
    let resp = k.prepare_v1(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(resp.claims[&c.uid].error, "");
    assert_eq!(metadata_mounts(&h, &c.uid), Vec::<(String, String)>::new());
    assert!(!h.opts.paths.run_dir.join("metadata").join(&c.uid).exists());
    p.stop().await;
}
