//! The kubelet's requests through the plugin's gRPC services and driver.
//!
//! Input: a sequence of records `kind (1 byte) | length (2 bytes, big-endian) | body`:
//! kind 0 puts a ResourceClaim (JSON body) into the fake API server; 1 and 2 are DRA v1
//! NodePrepareResources / NodeUnprepareResources requests, 3 and 4 the v1beta1 ones
//! (protobuf bodies). The state (checkpoint, CDI dir, claim files, the mock node's
//! state) lives in a directory made once per process, on `/dev/shm` where there is one
//! ([`world_dir`]); after every input each claim still prepared is unprepared, so
//! inputs do not leak into one another.
//!
//! The interception library is installed (stand-in files), so shared claims are
//! prepared through to their claim files. Checked after every request: one answer per
//! claim UID asked for; a claim prepared without error has a spec file that validates,
//! holds every CDI device ID the answer gives and mounts only run-dir files that exist
//! (a shared claim's limits, control and region); a claim whose prepare failed and that was not prepared before has no
//! spec file and no claim directory; an unprepared claim has neither.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use prost::Message;
use tessera::inventory::GpuBackend;
use tessera::inventory::mock::{MockBackend, StateAccess};
use tessera::kubelet::proto::{dra_v1, dra_v1beta1};
use tessera::kubelet::{DraV1, DraV1beta1, Driver};
use tessera::prepare::cdi_spec;
use tessera::prepare::state::{DeviceState, StateConfig, UnknownMig};

use crate::{DRIVER, NODE, fixture};

/// An answered claim: UID, error, CDI device IDs.
type Answer = (String, String, Vec<String>);

type Store = Arc<Mutex<HashMap<(String, String), Bytes>>>;

struct World {
    rt: tokio::runtime::Runtime,
    store: Store,
    state: Arc<DeviceState>,
    v1: DraV1,
    v1beta1: DraV1beta1,
    cdi_dir: PathBuf,
    run_dir: PathBuf,
}

const NOT_FOUND: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"not found","reason":"NotFound","code":404}"#;

fn fake_api(store: Store) -> kube::Client {
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let store = store.clone();
        async move {
            // /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>
            let parts: Vec<&str> = req.uri().path().split('/').collect();
            let found = match parts.as_slice() {
                [.., "namespaces", ns, "resourceclaims", name] => store
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&((*ns).to_string(), (*name).to_string()))
                    .cloned(),
                _ => None,
            };
            let (status, body) = match found {
                Some(b) => (200, b),
                None => (404, Bytes::from_static(NOT_FOUND.as_bytes())),
            };
            http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(body))
        }
    });
    kube::Client::new(svc, "default")
}

/// The world's directory, `tessera-fuzz-<pid>` under `/dev/shm` where it is a directory
/// (a tmpfs on Linux), else under the temp dir. The target checks the plugin's logic,
/// not the disk: a prepare and its clean-up fsync about 35 times, and on a disk that
/// cost ten times the rest of the input (10 ms against 1 ms per seed here).
///
/// The world lives as long as its process (a static is never dropped), so each new
/// world first removes those of processes that are gone: a fuzzer's restarted
/// children, earlier `cargo test` runs. A live process's world is never touched.
fn world_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    if let Ok(entries) = std::fs::read_dir(&parent) {
        for e in entries.flatten() {
            let name = e.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_prefix("tessera-fuzz-"))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new("/proc").join(pid.to_string()).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = parent.join(format!("tessera-fuzz-{}", std::process::id()));
    // A dead process's world under this reused PID: start empty.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("world dir");
    dir
}

fn build_world() -> World {
    let dir = world_dir();
    let root = dir.as_path();
    let f = fixture();
    let backend: Arc<dyn GpuBackend> = Arc::new(MockBackend::new(
        f.node.clone(),
        root.join("mock"),
        StateAccess::ReadWrite,
    ));
    let cfg = StateConfig {
        driver: DRIVER.into(),
        pool: NODE.into(),
        cdi_dir: root.join("cdi"),
        plugin_dir: root.join("plugin"),
        state_dir: root.join("state"),
        boot_id: "fuzz-boot".into(),
        fail_points: Default::default(),
        unknown_mig: UnknownMig::Destroy,
        run_dir: root.join("run"),
        shared_slots: f.config.shared_slots,
        interception_source: Some(fake_library(&root.join("lib-src"))),
        device_metadata: false,
    };
    // Specs name the run dir as the host sees it: here, this temp dir's.
    let cdi = tessera::prepare::cdi_spec::CdiContext {
        host_run_dir: cfg.run_dir.clone(),
        ..f.cdi.clone()
    };
    let (state, _) =
        DeviceState::open(cfg.clone(), f.gpus.clone(), backend, cdi).expect("state opens");
    let state = Arc::new(state);
    let store: Store = Arc::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt.block_on(async { fake_api(store.clone()) });
    let driver = Driver::new(state.clone(), client);
    World {
        rt,
        store,
        state,
        v1: DraV1(driver.clone()),
        v1beta1: DraV1beta1(driver),
        cdi_dir: cfg.cdi_dir,
        run_dir: cfg.run_dir,
    }
}

/// Stand-ins for the interception library and the files installed beside it (the
/// front, the soname shims, the CDI hook): ELF magic and a name, which is all the
/// install checks. With them the plugin installs a library version, so that shared
/// claims are prepared through to their claim files, as on a node.
fn fake_library(dir: &Path) -> PathBuf {
    use tessera::prepare::library as lib;
    std::fs::create_dir_all(dir).expect("library dir");
    for f in [
        lib::LIB_FILE,
        lib::FRONT_FILE,
        lib::SHIM_CUDA_FILE,
        lib::SHIM_NVML_FILE,
        lib::HOOK_FILE,
    ] {
        std::fs::write(dir.join(f), [b"\x7fELF".as_slice(), f.as_bytes()].concat())
            .expect("library file");
    }
    dir.join(lib::LIB_FILE)
}

fn world() -> &'static World {
    static W: LazyLock<World> = LazyLock::new(build_world);
    &W
}

fn spec_path(cdi_dir: &Path, uid: &str) -> Option<PathBuf> {
    cdi_spec::spec_file_names(uid)
        .ok()
        .map(|n| cdi_dir.join(n.file_name()))
}

fn has_claim_dir(run_dir: &Path, uid: &str) -> bool {
    !uid.is_empty()
        && !uid.contains('/')
        && uid != "."
        && uid != ".."
        && tessera::prepare::claim_files::claim_dir(run_dir, uid).exists()
}

/// Asserts a prepared claim's spec file: valid, with every CDI device ID answered.
fn check_prepared(w: &World, uid: &str, cdi_ids: &[String]) {
    let path = spec_path(&w.cdi_dir, uid).expect("a prepared claim has a valid spec name");
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("prepared claim {uid}: no spec file {path:?}: {e}"));
    let json: serde_json::Value = serde_json::from_slice(&bytes).expect("spec is JSON");
    let spec = tessera_cdi::validate::validate_json(&json)
        .unwrap_or_else(|e| panic!("prepared claim {uid}: invalid spec: {e}"));
    for id in cdi_ids {
        let name = id
            .strip_prefix(&format!("{}=", cdi_spec::CDI_KIND))
            .unwrap_or_else(|| panic!("CDI ID {id} not of kind {}", cdi_spec::CDI_KIND));
        assert!(spec.device(name).is_some(), "{uid}: spec lacks {id}");
    }
    // Every file the spec mounts from the run dir (a shared claim's limits, control and
    // region; the installed library) is there: else the container could not start.
    let edits = std::iter::once(&json["containerEdits"]).chain(
        json["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| &d["containerEdits"]),
    );
    let mut from_run_dir = 0;
    for m in edits.flat_map(|e| e["mounts"].as_array().into_iter().flatten()) {
        let host = Path::new(m["hostPath"].as_str().unwrap_or_default());
        if host.starts_with(&w.run_dir) {
            from_run_dir += 1;
            assert!(
                host.exists(),
                "prepared claim {uid}: its spec mounts {host:?}, which is missing"
            );
        }
    }
    // With the library installed every spec mounts its shims and its directory.
    assert!(
        from_run_dir > 0,
        "prepared claim {uid}: its spec mounts nothing of the run dir {:?}",
        w.run_dir
    );
}

fn check_absent(w: &World, uid: &str, what: &str) {
    if let Some(p) = spec_path(&w.cdi_dir, uid) {
        assert!(!p.exists(), "{what} claim {uid:?} left its spec {p:?}");
    }
    assert!(
        !has_claim_dir(&w.run_dir, uid),
        "{what} claim {uid:?} left its claim directory"
    );
}

fn prepared_uids(w: &World) -> BTreeSet<String> {
    w.state
        .prepared()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// A NodePrepareResources request (protobuf `body`) of API `$api` through the world
/// `$w`'s service `$svc`: `None` if the bytes do not decode, else the claim UIDs asked for and
/// (uid, error, CDI IDs) per answered claim. A macro because v1 and v1beta1 have the
/// same messages as distinct types.
macro_rules! prepare_via {
    ($w:expr, $svc:ident, $trait:ident, $api:ident, $body:expr) => {
        $api::NodePrepareResourcesRequest::decode($body)
            .ok()
            .map(|req| {
                let asked: BTreeSet<String> = req.claims.iter().map(|c| c.uid.clone()).collect();
                let resp = $w
                    .rt
                    .block_on($trait::node_prepare_resources(
                        &$w.$svc,
                        tonic::Request::new(req),
                    ))
                    .expect("prepare never fails as a call")
                    .into_inner();
                let answers: Vec<Answer> = resp
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let ids = r
                            .devices
                            .into_iter()
                            .flat_map(|d| d.cdi_device_ids)
                            .collect();
                        (uid, r.error, ids)
                    })
                    .collect();
                (asked, answers)
            })
    };
}

/// As [`prepare_via`] for NodeUnprepareResources: (uid, error) per answered claim.
macro_rules! unprepare_via {
    ($w:expr, $svc:ident, $trait:ident, $api:ident, $body:expr) => {
        $api::NodeUnprepareResourcesRequest::decode($body)
            .ok()
            .map(|req| {
                let asked: BTreeSet<String> = req.claims.iter().map(|c| c.uid.clone()).collect();
                let resp = $w
                    .rt
                    .block_on($trait::node_unprepare_resources(
                        &$w.$svc,
                        tonic::Request::new(req),
                    ))
                    .expect("unprepare never fails as a call")
                    .into_inner();
                let errors: Vec<(String, String)> =
                    resp.claims.into_iter().map(|(u, r)| (u, r.error)).collect();
                (asked, errors)
            })
    };
}

/// One input: see the module documentation.
pub fn node_prepare(data: &[u8]) {
    use dra_v1::dra_plugin_server::DraPlugin as V1;
    use dra_v1beta1::dra_plugin_server::DraPlugin as V1beta1;
    let w = world();
    let mut rest = data;
    let mut ops = 0;
    while rest.len() >= 3 && ops < 16 {
        ops += 1;
        let kind = rest[0];
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let body = &rest[3..3 + len];
        rest = &rest[3 + len..];
        match kind % 5 {
            0 => {
                if let Ok(c) =
                    serde_json::from_slice::<k8s_openapi::api::resource::v1::ResourceClaim>(body)
                {
                    let key = (
                        c.metadata.namespace.clone().unwrap_or_default(),
                        c.metadata.name.clone().unwrap_or_default(),
                    );
                    let json = serde_json::to_vec(&c).expect("claim serializes");
                    w.store
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, Bytes::from(json));
                }
            }
            1 | 3 => {
                let before = prepared_uids(w);
                // (uid, error, CDI IDs) per answered claim, through v1 or v1beta1.
                let answered = if kind % 5 == 1 {
                    prepare_via!(w, v1, V1, dra_v1, body)
                } else {
                    prepare_via!(w, v1beta1, V1beta1, dra_v1beta1, body)
                };
                let Some((asked, answers)) = answered else {
                    continue;
                };
                if std::env::var_os("TESSERA_FUZZ_DEBUG").is_some() {
                    eprintln!("prepare: {answers:?}");
                }
                let answered: BTreeSet<String> = answers.iter().map(|a| a.0.clone()).collect();
                assert_eq!(answered, asked, "one answer per claim asked for");
                for (uid, error, ids) in &answers {
                    if error.is_empty() {
                        check_prepared(w, uid, ids);
                    } else if !before.contains(uid) && !prepared_uids(w).contains(uid) {
                        check_absent(w, uid, "refused");
                    }
                }
            }
            _ => {
                let answered = if kind % 5 == 2 {
                    unprepare_via!(w, v1, V1, dra_v1, body)
                } else {
                    unprepare_via!(w, v1beta1, V1beta1, dra_v1beta1, body)
                };
                let Some((asked, errors)) = answered else {
                    continue;
                };
                let answered: BTreeSet<String> = errors.iter().map(|a| a.0.clone()).collect();
                assert_eq!(answered, asked, "one answer per claim asked for");
                for (uid, error) in &errors {
                    if error.is_empty() {
                        check_absent(w, uid, "unprepared");
                    }
                }
            }
        }
    }
    // Back to an empty node for the next input.
    for uid in prepared_uids(w) {
        w.state
            .unprepare(&uid)
            .unwrap_or_else(|e| panic!("clean-up unprepare of {uid}: {}", e.chain()));
        check_absent(w, &uid, "cleaned-up");
    }
    w.store.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let left: Vec<_> = std::fs::read_dir(&w.cdi_dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "CDI dir not empty after clean-up: {left:?}"
    );
}
