//! The fuzz targets' checks, one function per input boundary. Each takes the fuzzer's
//! bytes, feeds them where Tessera reads untrusted input, and asserts invariants (a
//! panic is a finding): not only "no panic", but what the output must satisfy.
//!
//! * [`claim_plan`]: a ResourceClaim (JSON, as the API server sends it) through
//!   `plan_claim` (GpuConfig decoding, device checks) on the default mock node; an
//!   accepted claim renders a CDI spec that the cdi crate validates.
//! * [`node_prepare`]: NodePrepareResources/NodeUnprepareResources requests (protobuf
//!   bytes, DRA v1 and v1beta1) through the gRPC services and the driver, with a fake
//!   API server serving claims from the input and the state in a temp dir; a prepared
//!   claim has a valid spec file naming its devices, a refused or unprepared one none.
//! * [`node_config`]: node config YAML and mock node YAML; what is accepted publishes
//!   slices the API server model accepts, on every release.
//! * [`plan`]: `tessera plan` inputs (slices, classes, claims with CEL), for the
//!   release and gates a first `# gates:` line names; every allocation is checked
//!   independently of the allocator.
//! * [`abi_files`]: the `limits`, `control` and `region` parsers (the plugin's reads and
//!   the library's mapping); what parses round-trips.
//! * [`cdi_spec`]: the CDI validator and writer; what validates is written and reads
//!   back valid and equal.
//! * [`quantity_semver`]: quantity and semver parsing, and the CEL libraries over them.

#![deny(clippy::unwrap_used)]

mod node_prepare;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::LazyLock;

use k8s_model::cel::{DeviceInput, DeviceSelector};
use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule::{self, Outcome, Step};
use k8s_model::validation::ParsedQuantity;
use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};
use tessera::config::{ManagedGpu, NodeConfig};
use tessera::inventory::mock::MockNode;
use tessera::prepare::cdi_spec::{self, CdiContext, DriverFile};
use tessera::prepare::claim_plan::{Held, NodeView, plan_claim};
use tessera::publish::slices::{PoolParams, ServerFeatures, build_pool};

pub use node_prepare::node_prepare;

/// The driver name every target uses.
pub const DRIVER: &str = "gpu.tessera.dev";
/// The mock node's name (its pool).
pub const NODE: &str = "fuzz-node";

/// The default mock node, resolved with its embedded config.
pub struct Fixture {
    pub node: MockNode,
    pub config: NodeConfig,
    pub gpus: Vec<ManagedGpu>,
    pub cdi: CdiContext,
}

fn build_fixture() -> Fixture {
    let node = MockNode::embedded_default().expect("the embedded mock node parses");
    let config = NodeConfig::embedded_in(&node)
        .expect("its config decodes")
        .unwrap_or_default();
    let inventory = node.inventory();
    let gpus = config
        .resolve(&inventory, "fuzz")
        .expect("its config resolves");
    let cdi = CdiContext {
        host_dev_root: PathBuf::from("/"),
        majors: inventory.char_majors,
        driver_files: vec![DriverFile {
            host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
            container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        }],
        host_run_dir: PathBuf::from("/run/tessera"),
        interception: Some("0.1.0-fuzz".into()),
    };
    Fixture {
        node,
        config,
        gpus,
        cdi,
    }
}

/// The default mock node (built once per process).
pub fn fixture() -> &'static Fixture {
    static F: LazyLock<Fixture> = LazyLock::new(build_fixture);
    &F
}

/// A claim (JSON) through the planner; an accepted one must render a CDI spec that
/// validates, with one device per planned device, named after the claim.
pub fn claim_plan(data: &[u8]) {
    let Ok(claim) = serde_json::from_slice::<ResourceClaim>(data) else {
        return;
    };
    let f = fixture();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let node = NodeView {
        driver: DRIVER,
        pool: NODE,
        gpus: &f.gpus,
        shared_slots: f.config.shared_slots,
    };
    let Ok(plan) = plan_claim(&claim, &uid, node, &Held::default()) else {
        return;
    };
    assert!(
        !plan.devices.is_empty(),
        "an accepted claim plans no device"
    );
    let keys: BTreeSet<String> = plan.devices.iter().map(|d| d.hold_key()).collect();
    assert_eq!(keys.len(), plan.devices.len(), "a device planned twice");
    for d in &plan.devices {
        let gpu = f.gpus.iter().find(|g| g.gpu.minor == d.gpu_minor);
        assert!(
            gpu.is_some(),
            "planned device on unknown GPU {}",
            d.gpu_minor
        );
        assert_eq!(d.pool, NODE);
        assert!(!d.request.contains('/'));
    }
    // Budgets of one GPU stay within it (the planner's last line of defence).
    for (uuid, b) in plan.budgets_by_uuid() {
        assert!(b.compute_percent <= 100, "{uuid}: compute {b:?}");
    }
    let caps: Vec<_> = plan
        .devices
        .iter()
        .map(|d| d.mig.map(|m| (m.gi_id, 0, None)))
        .collect();
    let spec = cdi_spec::render_claim_spec(&plan, &f.cdi, &caps)
        .unwrap_or_else(|e| panic!("an accepted claim's spec does not render: {e}"));
    let names = cdi_spec::spec_file_names(&plan.uid)
        .unwrap_or_else(|e| panic!("an accepted claim's UID names no spec file: {e}"));
    let rendered =
        tessera_cdi::writer::render_spec(&spec, cdi_spec::VERSION_POLICY, names.file_name())
            .unwrap_or_else(|e| panic!("an accepted claim's spec does not validate: {e}"));
    let back: serde_json::Value =
        serde_json::from_slice(&rendered.bytes).expect("the rendered spec is JSON");
    let parsed = tessera_cdi::validate::validate_json(&back)
        .unwrap_or_else(|e| panic!("the written spec does not validate as read: {e}"));
    for d in &plan.devices {
        assert!(
            parsed.device(&d.cdi_name(&plan.uid)).is_some(),
            "spec lacks device {}",
            d.cdi_name(&plan.uid)
        );
    }
}

/// Every release the model knows.
fn versions() -> impl Iterator<Item = KubeVersion> {
    KubeVersion::ALL.into_iter()
}

/// A node config or a mock node (YAML); an accepted one publishes, on every release,
/// slices that pass the API server's slice and pool validation.
pub fn node_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let f = fixture();
    let (inventory, config) = match MockNode::parse(text, "fuzz") {
        Ok(node) => match NodeConfig::embedded_in(&node) {
            Ok(c) => (node.inventory(), c.unwrap_or_default()),
            Err(_) => return,
        },
        Err(_) => match NodeConfig::from_yaml(text, "fuzz") {
            Ok(c) => (f.node.inventory(), c),
            Err(_) => return,
        },
    };
    let Ok(gpus) = config.resolve(&inventory, "fuzz") else {
        return;
    };
    for version in versions() {
        if config.slice_layout.problem_for(version).is_some() {
            // A layout this release cannot take: the plugin refuses to start with it
            // (plugin::run), and `tessera inventory` too.
            continue;
        }
        let gates = FeatureGates::defaults(version);
        let params = PoolParams {
            driver: DRIVER,
            node_name: NODE,
            version,
            features: ServerFeatures::from_gates(&gates),
            layout: config.slice_layout,
            shared_slots: config.shared_slots,
        };
        let slices = build_pool(&params, &inventory, &gpus, &BTreeMap::new());
        for s in &slices {
            let errs = k8s_model::validation::validate_resource_slice(s, &gates);
            assert!(
                errs.is_empty(),
                "{version}: slice {:?} refused: {}",
                s.metadata.name,
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        let refs: Vec<&ResourceSlice> = slices.iter().collect();
        let problems = k8s_model::validation::validate_pool_for(&refs, version);
        assert!(problems.is_empty(), "{version}: pool refused: {problems:?}");
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Option<T> {
    serde_json::from_value(v).ok()
}

/// The devices of the pools the allocator uses (the highest generation), by id.
fn devices_by_id(slices: &[ResourceSlice]) -> HashMap<(String, String, String), Device> {
    let mut max_gen: HashMap<(String, String), i64> = HashMap::new();
    for s in slices {
        let k = (s.spec.driver.clone(), s.spec.pool.name.clone());
        let g = max_gen.entry(k).or_insert(s.spec.pool.generation);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut out = HashMap::new();
    for s in slices {
        let k = (s.spec.driver.clone(), s.spec.pool.name.clone());
        if max_gen.get(&k) != Some(&s.spec.pool.generation) {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            out.insert((k.0.clone(), k.1.clone(), d.name.clone()), d.clone());
        }
    }
    out
}

fn quantity(s: &str) -> Option<ParsedQuantity> {
    ParsedQuantity::parse(s).ok()
}

/// The server an input of [`plan`] is planned for: a first line `# gates: VERSION` or
/// `# gates: VERSION A=true,B=false` names a release and overrides, as `tessera plan
/// --k8s-version --gates` takes them; without one, the newest release's defaults.
/// `None` for a header that names no known release or gate, and for a first comment
/// that mentions gates without that form (`# Gates 1.34`), so that a mistyped header in
/// a hand-written input is not planned for another release unnoticed.
pub fn plan_gates(text: &str) -> Option<FeatureGates> {
    let first = text.lines().next().unwrap_or_default();
    let Some(rest) = first.strip_prefix("# gates:") else {
        let mentions = first.starts_with('#') && first.to_ascii_lowercase().contains("gates");
        return (!mentions).then(|| FeatureGates::defaults(KubeVersion::NEWEST));
    };
    let line = rest.trim();
    let (version, overrides) = line.split_once(' ').unwrap_or((line, ""));
    FeatureGates::parse(version.parse().ok()?, overrides).ok()
}

/// `tessera plan` inputs (a YAML stream of slices, classes and claims), for the server
/// [`plan_gates`] names: each allocation is checked against the inputs without the
/// allocator: devices exist, a device that is not multi-allocatable is held once, every
/// class and request selector holds, counts are met, `matchAttribute` holds, no counter
/// set and no consumable capacity is exceeded.
pub fn plan(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(gates) = plan_gates(text) else {
        return;
    };
    let Ok(docs) = schedule::documents(text, "fuzz") else {
        return;
    };
    let (mut slices, mut classes, mut claims) = (Vec::new(), Vec::new(), Vec::new());
    for d in docs {
        match d["kind"].as_str() {
            Some("ResourceSlice") => slices.extend(decode::<ResourceSlice>(d)),
            Some("DeviceClass") => classes.extend(decode::<DeviceClass>(d)),
            Some("ResourceClaim") => claims.extend(decode::<ResourceClaim>(d)),
            _ => {}
        }
    }
    if classes.is_empty() {
        static BUILT_IN: LazyLock<Vec<DeviceClass>> =
            LazyLock::new(|| tessera::device_classes::read(None).expect("built-in classes"));
        classes = BUILT_IN.clone();
    }
    let steps: Vec<Step> = claims
        .into_iter()
        .map(|c| Step::Allocate(Box::new(c)))
        .collect();
    let Ok(result) = schedule::run(&slices, &classes, &steps, &gates) else {
        return;
    };
    let skipped: BTreeSet<(String, String)> = result
        .skipped_pools
        .iter()
        .map(|p| (p.driver.clone(), p.pool.clone()))
        .collect();
    let devices = devices_by_id(&slices);
    let class_of: HashMap<String, &DeviceClass> = classes
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();
    let consumable = gates.consumable_capacity();
    // Each expression compiled once (parsing is a quarter of a small input's time).
    let mut compiled: HashMap<String, DeviceSelector> = HashMap::new();
    let mut exclusive: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut multi_counted: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut counters: HashMap<(String, String, String, String), ParsedQuantity> = HashMap::new();
    let mut capacity: HashMap<(String, String, String, String), ParsedQuantity> = HashMap::new();
    for outcome in &result.outcomes {
        let Outcome::Allocated(claim) = outcome else {
            continue;
        };
        let spec_devices = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.clone())
            .unwrap_or_default();
        let requests = spec_devices.requests.clone().unwrap_or_default();
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        let mut per_request: HashMap<String, usize> = HashMap::new();
        // From 1.36 a request's next pick starts after its previous one, so a request
        // never holds a device twice (1.34 and 1.35 rescan: a multi-allocatable device
        // may serve one request twice).
        let mut request_devices: BTreeSet<(String, (String, String, String))> = BTreeSet::new();
        for r in &results {
            let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
            assert!(
                request_devices.insert((r.request.clone(), id.clone()))
                    || gates.version().rescans_each_pick(),
                "request {} holds {id:?} twice on {}",
                r.request,
                gates.version()
            );
            assert!(
                !skipped.contains(&(id.0.clone(), id.1.clone())),
                "device of a skipped pool: {id:?}"
            );
            let dev = devices
                .get(&id)
                .unwrap_or_else(|| panic!("allocated device {id:?} is in no slice"));
            *per_request.entry(r.request.clone()).or_default() += 1;
            // The request (or firstAvailable subrequest) it serves.
            let (parent, sub) = match r.request.split_once('/') {
                Some((p, s)) => (p, Some(s)),
                None => (r.request.as_str(), None),
            };
            let req = requests
                .iter()
                .find(|q| q.name == parent)
                .unwrap_or_else(|| panic!("result for unknown request {}", r.request));
            let (class, sels) = match sub {
                None => {
                    let e = req.exactly.as_ref().expect("a plain request has exactly");
                    (e.device_class_name.clone(), e.selectors.clone())
                }
                Some(s) => {
                    let e = req
                        .first_available
                        .iter()
                        .flatten()
                        .find(|x| x.name == s)
                        .expect("a known subrequest");
                    (e.device_class_name.clone(), e.selectors.clone())
                }
            };
            let class = class_of.get(&class).expect("the request's class exists");
            let input = DeviceInput {
                driver: &r.driver,
                device: dev,
                consumable_capacity: consumable,
            };
            let class_sels = class
                .spec
                .as_ref()
                .and_then(|s| s.selectors.clone())
                .unwrap_or_default();
            for s in class_sels.iter().chain(sels.iter().flatten()) {
                if let Some(cel) = &s.cel {
                    if !compiled.contains_key(&cel.expression) {
                        let sel =
                            DeviceSelector::compile(&cel.expression).expect("compiled before");
                        compiled.insert(cel.expression.clone(), sel);
                    }
                    let sel = &compiled[&cel.expression];
                    assert_eq!(
                        sel.matches(&input),
                        Ok(true),
                        "{id:?} allocated against selector {:?}",
                        cel.expression
                    );
                }
            }
            let multi = consumable && dev.allow_multiple_allocations == Some(true);
            if multi {
                for (name, q) in r.consumed_capacity.iter().flatten() {
                    let q = quantity(&q.0).expect("consumedCapacity parses");
                    let e = capacity
                        .entry((id.0.clone(), id.1.clone(), id.2.clone(), name.clone()))
                        .or_insert_with(|| ParsedQuantity::from_i64(0));
                    *e = e.checked_add(&q).expect("no overflow");
                    let total = dev
                        .capacity
                        .as_ref()
                        .and_then(|c| c.get(name))
                        .and_then(|c| quantity(&c.value.0))
                        .unwrap_or_else(|| panic!("{id:?} consumed unknown capacity {name}"));
                    assert!(
                        *e <= total,
                        "{id:?}: capacity {name} exceeded: {e} > {total}"
                    );
                }
            } else {
                assert!(exclusive.insert(id.clone()), "{id:?} allocated twice");
            }
            if !multi || multi_counted.insert(id.clone()) {
                for cc in dev.consumes_counters.iter().flatten() {
                    for (n, v) in &cc.counters {
                        let Some(v) = quantity(&v.value.0) else {
                            continue;
                        };
                        let key = (
                            id.0.clone(),
                            id.1.clone(),
                            cc.counter_set.clone(),
                            n.clone(),
                        );
                        let e = counters
                            .entry(key)
                            .or_insert_with(|| ParsedQuantity::from_i64(0));
                        *e = e.checked_add(&v).expect("no overflow");
                    }
                }
            }
        }
        // Exact counts.
        for req in &requests {
            let alts: Vec<(String, Option<i64>, Option<String>)> =
                match (&req.exactly, &req.first_available) {
                    (Some(e), _) => vec![(req.name.clone(), e.count, e.allocation_mode.clone())],
                    (None, Some(subs)) => subs
                        .iter()
                        .map(|s| {
                            (
                                format!("{}/{}", req.name, s.name),
                                s.count,
                                s.allocation_mode.clone(),
                            )
                        })
                        .collect(),
                    _ => vec![],
                };
            let served: Vec<_> = alts
                .iter()
                .filter(|a| per_request.contains_key(&a.0))
                .collect();
            assert!(
                served.len() == 1,
                "request {} served by {} alternatives",
                req.name,
                served.len()
            );
            let (name, count, mode) = served[0];
            if mode.as_deref() != Some("All") {
                let want = usize::try_from(count.unwrap_or(1).max(1)).unwrap_or(usize::MAX);
                assert_eq!(per_request[name], want, "request {name}: count");
            }
        }
        // matchAttribute / distinctAttribute.
        for c in spec_devices.constraints.iter().flatten() {
            let applies = |req: &str| {
                c.requests.as_ref().is_none_or(|rs| {
                    rs.is_empty()
                        || rs
                            .iter()
                            .any(|x| x == req || req.split('/').next() == Some(x.as_str()))
                })
            };
            let vals: Vec<_> = results
                .iter()
                .filter(|r| applies(&r.request))
                .map(|r| {
                    let dev = &devices[&(r.driver.clone(), r.pool.clone(), r.device.clone())];
                    let name = c
                        .match_attribute
                        .as_ref()
                        .or(c.distinct_attribute.as_ref())
                        .expect("one attribute");
                    let attrs = dev.attributes.clone().unwrap_or_default();
                    let v = attrs.get(name).cloned().or_else(|| {
                        name.split_once('/')
                            .filter(|(d, _)| *d == r.driver)
                            .and_then(|(_, n)| attrs.get(n).cloned())
                    });
                    serde_json::to_string(&v.expect("the constrained attribute exists"))
                        .expect("json")
                })
                .collect();
            if c.match_attribute.is_some() {
                assert!(
                    vals.windows(2).all(|w| w[0] == w[1]),
                    "matchAttribute broken: {vals:?}"
                );
            } else {
                let set: BTreeSet<_> = vals.iter().collect();
                assert_eq!(set.len(), vals.len(), "distinctAttribute broken: {vals:?}");
            }
        }
    }
    // Counter sets.
    for ((driver, pool, set, name), used) in counters {
        let total = slices
            .iter()
            .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
            .flat_map(|s| s.spec.shared_counters.iter().flatten())
            .filter(|cs| cs.name == set)
            .filter_map(|cs| cs.counters.get(&name))
            .filter_map(|c| quantity(&c.value.0))
            .max()
            .unwrap_or_else(|| panic!("counter {set}/{name} of {driver}/{pool} not declared"));
        assert!(used <= total, "counter {set}/{name}: {used} > {total}");
    }
}

/// The per-claim files both sides read: `limits` (text), `control` and `region`
/// (binary; the plugin reads them with `read(2)`, the library maps them). Whatever
/// parses round-trips or agrees between the readers.
pub fn abi_files(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 3 {
        0 => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            if let Ok(l) = tessera_abi::limits::Limits::parse(text) {
                let again = tessera_abi::limits::Limits::parse(&l.render())
                    .unwrap_or_else(|e| panic!("rendered limits do not parse: {e}"));
                assert_eq!(again, l, "limits do not round-trip");
                for g in &l.gpus {
                    assert_eq!(l.budget(&g.uuid), Some(g.memory_bytes));
                }
            }
        }
        1 => {
            if let Ok(gpus) = tessera_abi::control::parse(body) {
                if let Ok(bytes) = tessera_abi::control::initial_bytes(&gpus) {
                    let again = tessera_abi::control::parse(&bytes).expect("fresh control parses");
                    assert_eq!(again.len(), gpus.len());
                    for (a, b) in again.iter().zip(&gpus) {
                        assert_eq!(a.uuid, b.uuid);
                    }
                }
                let dir = scratch();
                let path = dir.join("control");
                std::fs::write(&path, body).expect("write");
                let file = std::fs::File::options()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .expect("open");
                if let Ok(c) = tessera_abi::control::Control::map(&file, true) {
                    assert_eq!(c.gpu_count(), gpus.len());
                    for g in 0..c.gpu_count() {
                        let _ = c.rate(g);
                        let _ = c.cells(g).map(|cells| cells.read(2));
                    }
                    let _ = c.repair_sequence();
                    let _ = c.read();
                }
            }
        }
        _ => {
            let snap = tessera_abi::region::Snapshot::parse(body);
            if let Ok(s) = &snap {
                assert_eq!(s.gpus.len(), s.layout.gpu_count);
                assert!(s.layout.file_size <= body.len());
            }
            let dir = scratch();
            let path = dir.join("region");
            std::fs::write(&path, body).expect("write");
            // The plugin's reader agrees with the parse.
            match (tessera_abi::region::read_gpu_stats(&path), &snap) {
                (Ok(stats), Ok(s)) => assert_eq!(stats.len(), s.gpus.len()),
                (Err(_), Err(_)) => {}
                (a, b) => panic!("read_gpu_stats {:?} vs parse {:?}", a.is_ok(), b.is_ok()),
            }
            // The library's mapping.
            let file = std::fs::File::options()
                .read(true)
                .write(true)
                .open(&path)
                .expect("open");
            if let Ok(r) = tessera_abi::region::Region::map(&file, true) {
                let mapped = r.snapshot().expect("a mapped region snapshots");
                assert_eq!(
                    Some(&mapped),
                    snap.as_ref().ok(),
                    "mapping and parse disagree"
                );
                for g in 0..r.layout().gpu_count + 1 {
                    let _ = r.context_bytes(g);
                    for s in 0..r.layout().slot_count.min(4) + 1 {
                        let _ = r.pool(s, g);
                    }
                }
            }
        }
    }
}

/// A per-process scratch directory (the fuzzer runs one input at a time).
fn scratch() -> &'static std::path::Path {
    static DIR: LazyLock<tempfile::TempDir> =
        LazyLock::new(|| tempfile::tempdir().expect("a temp dir"));
    DIR.path()
}

/// A CDI spec document: what the validator accepts is rendered by the writer, which
/// must accept it too, and the written file reads back valid and equal.
pub fn cdi_spec(data: &[u8]) {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(spec) = tessera_cdi::validate::validate_json(&json) else {
        return;
    };
    let names =
        tessera_cdi::writer::SpecFileNames::new("fuzz.json", ".fuzz.tmp").expect("valid names");
    for policy in [
        tessera_cdi::writer::VersionPolicy::Declared,
        tessera_cdi::writer::VersionPolicy::Minimum,
    ] {
        let rendered = tessera_cdi::writer::render_spec(&spec, policy, names.file_name())
            .unwrap_or_else(|e| panic!("a valid spec does not render ({policy:?}): {e}"));
        let back: serde_json::Value = serde_json::from_slice(&rendered.bytes).expect("JSON");
        let again = tessera_cdi::validate::validate_json(&back)
            .unwrap_or_else(|e| panic!("the rendered spec does not validate ({policy:?}): {e}"));
        assert_eq!(again.devices, spec.devices);
        assert_eq!(again.kind, spec.kind);
    }
    let writer = tessera_cdi::writer::SpecWriter::new(scratch());
    writer
        .write(&names, &spec, tessera_cdi::writer::VersionPolicy::Declared)
        .unwrap_or_else(|e| panic!("a valid spec is not written: {e}"));
    let bytes = std::fs::read(writer.path_of(&names)).expect("the written file");
    let back: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    let written = tessera_cdi::validate::validate_json(&back)
        .unwrap_or_else(|e| panic!("the written file does not validate: {e}"));
    assert!(written == spec, "the written file differs from the spec");
    writer.remove(&names).expect("removed");
}

/// A string as a quantity and as a version: a parsed quantity's canonical form parses
/// to the same value, and is a fixed point from its second round (as in Go: `62.5Ki`
/// prints `64000`, a bare integer that parses as DecimalSI and prints `64k`); the CEL
/// libraries agree with the parsers
/// (`isQuantity`, `quantity`, `isSemver`, `semver`); a normalized driver version is
/// strict semver.
pub fn quantity_semver(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = ParsedQuantity::parse(s);
    if let Ok(q) = &parsed {
        let canon = q.to_string();
        let again = ParsedQuantity::parse(&canon)
            .unwrap_or_else(|e| panic!("canonical {canon:?} of {s:?} does not parse: {e:?}"));
        assert!(again == *q, "{s:?} -> {canon:?} changes value");
        let second = again.to_string();
        let third = ParsedQuantity::parse(&second)
            .unwrap_or_else(|e| panic!("canonical {second:?} of {canon:?} does not parse: {e:?}"));
        assert!(third == *q, "{canon:?} -> {second:?} changes value");
        assert_eq!(
            third.to_string(),
            second,
            "canonical form is not a fixed point from its second round"
        );
        let _ = q.to_decimal_string();
    }
    let strict = semver::Version::parse(s).is_ok();
    assert_eq!(k8s_model::attribute_version::is_semver(s), strict);
    if let Some(n) = k8s_model::attribute_version::normalize_semver(s) {
        assert!(
            k8s_model::attribute_version::is_semver(&n),
            "{s:?} -> {n:?}"
        );
    }
    // The CEL libraries, with the string as a device attribute.
    if s.len() > k8s_model::validation::DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH {
        return;
    }
    let device: Device = serde_json::from_value(serde_json::json!({
        "name": "d", "attributes": {"s": {"string": s}}}))
    .expect("device");
    let input = DeviceInput {
        driver: DRIVER,
        device: &device,
        consumable_capacity: false,
    };
    static SELS: LazyLock<[DeviceSelector; 4]> = LazyLock::new(|| {
        let a = format!(r#"device.attributes["{DRIVER}"].s"#);
        [
            format!("isQuantity({a})"),
            format!("quantity({a}).sign() >= -1"),
            format!("isSemver({a})"),
            format!("semver({a}) == semver({a})"),
        ]
        .map(|e| DeviceSelector::compile(&e).expect("compiles"))
    });
    let is_q = SELS[0].matches(&input);
    assert_eq!(is_q, Ok(parsed.is_ok()), "isQuantity({s:?}) vs parse");
    assert_eq!(
        SELS[1].matches(&input).is_ok(),
        parsed.is_ok(),
        "quantity({s:?})"
    );
    let is_v = SELS[2].matches(&input);
    assert_eq!(is_v, Ok(strict), "isSemver({s:?}) vs semver");
    assert_eq!(SELS[3].matches(&input).is_ok(), strict, "semver({s:?})");
}
