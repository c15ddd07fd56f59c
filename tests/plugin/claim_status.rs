//! `ResourceClaim.status.devices` (KEP-4817) as the plugin writes it, against the fake
//! API server enforcing the shipped ClusterRole and, on 1.37, the per-driver
//! authorization of `status.devices` (`resourceclaims/driver`, `associated-node:`).

use testkit::harness;

use std::time::Duration;

use harness::{Harness, NODE};
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use serde_json::Value;
use tessera::inventory::mock::inject_xid;
use testkit::kubelet_standin::{DraClient, KubeletClaim};

const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/rbac.yaml");

async fn prepare(k: &DraClient, c: &KubeletClaim) {
    let resp = k.prepare_v1(std::slice::from_ref(c)).await.unwrap();
    assert_eq!(resp.claims[&c.uid].error, "", "prepare {}", c.name);
}

async fn stored(h: &Harness, name: &str) -> ResourceClaim {
    h.claims().get(name).await.unwrap()
}

/// The claim's `status.devices`, once it has `n` entries (waits up to 10 s).
async fn devices_when(h: &Harness, name: &str, n: usize) -> Vec<AllocatedDeviceStatus> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = stored(h, name)
            .await
            .status
            .and_then(|s| s.devices)
            .unwrap_or_default();
        if d.len() == n {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: status.devices never had {n} entries: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn data(d: &AllocatedDeviceStatus) -> &Value {
    &d.data.as_ref().expect("data").0
}

fn ready(d: &AllocatedDeviceStatus) -> (String, String) {
    let c = d
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone())
}

/// Under the shipped RBAC on 1.37: a whole GPU, a MIG device created on demand and a
/// share each get one `Ready` entry whose data names the GPU's UUID, the product, the
/// MIG instance's UUID and placement, the share's budget and the CDI device IDs; an
/// XID turns the whole GPU's entry not ready; unprepare removes every entry.
#[tokio::test]
async fn prepared_claims_report_their_devices_and_unprepare_removes_them() {
    let h = Harness::new().await;
    let gpus = &h.model.gpus;
    let uuid = |minor: u32| {
        gpus.iter()
            .find(|g| g.gpu.minor == minor)
            .unwrap()
            .gpu
            .uuid
            .clone()
    };
    let whole = h
        .allocated_claim("whole", &[("gpu", NODE, "gpu-2", None)], &[])
        .await;
    let mig = h
        .allocated_claim("mig", &[("mig", NODE, "gpu-0-mig-1g10gb-19-6", None)], &[])
        .await;
    let share_id = "11111111-1111-4111-8111-111111111111";
    let share = h
        .allocated_claim_with(
            "share",
            vec![harness::shared_result(
                "gpu", "gpu-1", share_id, "20Gi", "25",
            )],
            &[],
        )
        .await;
    // From here on every request is the plugin's, as its ClusterRole allows.
    h.api.enforce_rbac(testkit::rbac::allowed_by_cluster_role(
        std::path::Path::new(RBAC),
    ));
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    for c in [&whole, &mig, &share] {
        prepare(&k, c).await;
    }

    let d = devices_when(&h, "whole", 1).await;
    assert_eq!(
        (
            d[0].driver.as_str(),
            d[0].pool.as_str(),
            d[0].device.as_str()
        ),
        (harness::DRIVER, NODE, "gpu-2")
    );
    assert_eq!(ready(&d[0]), ("True".into(), "Prepared".into()));
    assert_eq!(data(&d[0])["gpuUUID"], uuid(2).as_str());
    assert!(
        data(&d[0])["productName"]
            .as_str()
            .unwrap()
            .starts_with("Tesla")
    );
    assert!(
        data(&d[0])["cdiDeviceIDs"][0]
            .as_str()
            .unwrap()
            .contains(&whole.uid),
        "{:?}",
        data(&d[0])
    );
    assert!(data(&d[0]).get("mig").is_none() && data(&d[0]).get("budget").is_none());

    let d = devices_when(&h, "mig", 1).await;
    let m = &data(&d[0])["mig"];
    assert_eq!(data(&d[0])["gpuUUID"], uuid(0).as_str());
    assert!(m["uuid"].as_str().unwrap().starts_with("MIG-"), "{m}");
    assert_eq!(
        (&m["profile"], &m["placement"], &m["createdOnDemand"]),
        (
            &Value::from("1g.10gb"),
            &serde_json::json!({"start": 6, "size": 1}),
            &Value::from(true)
        )
    );

    let d = devices_when(&h, "share", 1).await;
    assert_eq!(d[0].share_id.as_deref(), Some(share_id));
    assert_eq!(data(&d[0])["gpuUUID"], uuid(1).as_str());
    assert_eq!(data(&d[0])["budget"]["computePercent"], 25);
    assert_eq!(data(&d[0])["budget"]["memoryBytes"], 20u64 << 30);

    inject_xid(&h.opts.paths.state_dir, 2, 79).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = devices_when(&h, "whole", 1).await;
        if ready(&d[0]) == ("False".into(), "DeviceUnhealthy".into()) {
            let msg = &d[0].conditions.as_ref().unwrap()[0].message;
            assert!(msg.contains("XID 79"), "{msg}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "gpu-2 stayed ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for c in [&whole, &mig, &share] {
        k.unprepare_v1(std::slice::from_ref(c)).await.unwrap();
        devices_when(&h, &c.name, 0).await;
    }
    p.stop().await;
}

/// A status write the API server refuses does not fail the prepare, which answers at
/// once; the write is retried and lands once the server accepts it.
#[tokio::test]
async fn a_failing_status_write_does_not_fail_the_prepare_and_is_retried() {
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let k = h.kubelet().await;
    let c = h
        .allocated_claim("retried", &[("gpu", NODE, "gpu-3", None)], &[])
        .await;
    h.api.fail("update", "resourceclaims", 500);
    prepare(&k, &c).await;
    harness::wait_until("a refused status write", || {
        h.api
            .requests()
            .iter()
            .any(|r| r.subresource.as_deref() == Some("status") && r.status == 500)
    })
    .await;
    assert!(
        stored(&h, "retried")
            .await
            .status
            .and_then(|s| s.devices)
            .is_none()
    );
    h.api.clear_faults();
    let d = devices_when(&h, "retried", 1).await;
    assert_eq!(ready(&d[0]), ("True".into(), "Prepared".into()));
    p.stop().await;
}
