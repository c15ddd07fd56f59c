//! Two plugin instances on one node (a rolling update) share the node-wide lock: their
//! prepares and unprepares never lose each other's checkpoint updates.

use testkit::harness;

use std::sync::Arc;

use tessera::plugin;
use tessera::prepare::state::UnknownMig;

fn claim(uid: &str, device: &str) -> k8s_openapi::api::resource::v1::ResourceClaim {
    harness::allocated_claim_object(uid, "gpu", device)
}

/// Two `DeviceState`s over the same directories (two plugin processes during a rolling
/// update) prepare and unprepare claims concurrently; every update survives, because
/// each step holds the flock and re-reads the checkpoint under it.
#[test]
fn two_instances_never_lose_each_others_updates() {
    let root = tempfile::tempdir().unwrap();
    harness::make_driver_root(root.path());
    let model = harness::model(root.path());
    let opts = harness::options(root.path());
    let a = Arc::new(plugin::open_state(&opts, &model, UnknownMig::Destroy).unwrap());
    let b = Arc::new(plugin::open_state(&opts, &model, UnknownMig::Destroy).unwrap());
    let rounds = 40;
    let run = |state: Arc<tessera::prepare::state::DeviceState>, device: &'static str, tag: u32| {
        std::thread::spawn(move || {
            for i in 0..rounds {
                let uid = format!("00000000-0000-4000-8{tag:03}-{i:012}");
                state.prepare(&claim(&uid, device), &uid).unwrap();
                // Prepare twice (idempotent), then free the device for the next round.
                state.prepare(&claim(&uid, device), &uid).unwrap();
                state.unprepare(&uid).unwrap();
            }
            // Leave one claim per instance prepared.
            let uid = format!("00000000-0000-4000-8{tag:03}-999999999999");
            state.prepare(&claim(&uid, device), &uid).unwrap();
            uid
        })
    };
    let ta = run(a.clone(), "gpu-2", 1);
    let tb = run(b.clone(), "gpu-3", 2);
    let (ua, ub) = (ta.join().unwrap(), tb.join().unwrap());
    let mut left = harness::checkpoint_claims(&opts.paths.state_dir);
    left.sort();
    let mut want = vec![ua.clone(), ub.clone()];
    want.sort();
    assert_eq!(left, want, "both instances' last claims are recorded");
    assert_eq!(harness::list_files(&opts.paths.cdi_dir).len(), 2);
    // Each instance sees the other's claim as holding its device.
    let err = a.prepare(
        &claim("00000000-0000-4000-8000-00000000beef", "gpu-3"),
        "00000000-0000-4000-8000-00000000beef",
    );
    assert!(err.unwrap_err().chain().contains(&ub));
}
