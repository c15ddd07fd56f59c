//! Regenerates the seed corpora of the fuzz targets (`fuzz/corpus/<target>/`) from the
//! examples: the mock node, its published slices, the example claims allocated by the
//! scheduler model. `cargo run -p tessera-fuzz --example write_seeds`; then commit them.
//! (`fuzz/tests/corpus.rs` replays them in `cargo test`.)

use std::path::{Path, PathBuf};

use k8s_model::release::{FeatureGates, KubeVersion};
use k8s_model::schedule::{self, Outcome, Step};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use prost::Message;
use tessera::config::{GpuMode, ManagedGpu};
use tessera::kubelet::proto::{dra_v1, dra_v1beta1};
use tessera::publish::slices::{PoolParams, ServerFeatures, build_pool};
use tessera_fuzz::{DRIVER, NODE, fixture};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn the_pool() -> Vec<ResourceSlice> {
    pool_for(&FeatureGates::defaults(KubeVersion::NEWEST), |_| true)
}

/// The slices the mock node publishes to a server with `gates`, of the GPUs `keep`
/// picks.
fn pool_for(gates: &FeatureGates, keep: impl Fn(&ManagedGpu) -> bool) -> Vec<ResourceSlice> {
    let f = fixture();
    let gpus: Vec<ManagedGpu> = f.gpus.iter().filter(|g| keep(g)).cloned().collect();
    build_pool(
        &PoolParams {
            driver: DRIVER,
            node_name: NODE,
            version: gates.version(),
            features: ServerFeatures::from_gates(gates),
            layout: f.config.slice_layout,
            shared_slots: f.config.shared_slots,
        },
        &f.node.inventory(),
        &gpus,
        &Default::default(),
    )
}

fn yaml_stream(slices: &[ResourceSlice]) -> String {
    let mut stream = String::new();
    for s in slices {
        stream.push_str(&serde_yaml_ng::to_string(s).unwrap());
        stream.push_str("---\n");
    }
    stream
}

/// The example claims, allocated by the scheduler model on the mock node's pool, with
/// UIDs.
fn allocated() -> Vec<ResourceClaim> {
    // The first two claims of each example file.
    let mut steps = Vec::new();
    for f in ["whole-gpus", "shared-gpus", "mig-partitions"] {
        let path = root().join(format!("../examples/claims/{f}.yaml"));
        let claims = schedule::read_steps(&[path]).unwrap();
        steps.extend(
            claims
                .into_iter()
                .filter(|s| matches!(s, Step::Allocate(_)))
                .take(2),
        );
    }
    let classes = tessera::device_classes::read(None).unwrap();
    let gates = FeatureGates::defaults(KubeVersion::NEWEST);
    let mut out = Vec::new();
    // One plan per claim, on an empty node: each is allocated.
    for (i, s) in steps.iter().enumerate() {
        let r = schedule::run(&the_pool(), &classes, std::slice::from_ref(s), &gates).unwrap();
        if let Some(Outcome::Allocated(c)) = r.outcomes.into_iter().next() {
            let mut c = *c;
            c.metadata.uid = Some(format!("0b5c6e2a-1f3d-4c8e-9a7b-{i:012}"));
            out.push(c);
        }
    }
    out
}

fn record(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![kind];
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = root().join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

fn main() {
    let claims = allocated();
    assert!(claims.len() >= 4, "{} claims allocated", claims.len());
    for (i, c) in claims.iter().enumerate().take(6) {
        let json = serde_json::to_vec(c).unwrap();
        write("claim_plan", &format!("claim-{i}.json"), &json);
        let cref = |c: &ResourceClaim| dra_v1::Claim {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
        };
        let prep = dra_v1::NodePrepareResourcesRequest {
            claims: vec![cref(c)],
        }
        .encode_to_vec();
        let unprep = dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![cref(c)],
        }
        .encode_to_vec();
        let b = cref(c);
        let prep_b = dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: b.namespace,
                uid: b.uid,
                name: b.name,
            }],
        }
        .encode_to_vec();
        let mut input = record(0, &json);
        input.extend(record(1, &prep));
        input.extend(record(if i % 2 == 0 { 2 } else { 4 }, &unprep));
        input.extend(record(3, &prep_b));
        write("node_prepare", &format!("claim-{i}.bin"), &input);
        // The CDI spec that claim gets.
        let f = fixture();
        let plan = tessera::prepare::claim_plan::plan_claim(
            c,
            c.metadata.uid.as_deref().unwrap(),
            tessera::prepare::claim_plan::NodeView {
                driver: DRIVER,
                pool: NODE,
                gpus: &f.gpus,
                shared_slots: f.config.shared_slots,
            },
            &Default::default(),
        )
        .unwrap();
        let caps: Vec<_> = plan
            .devices
            .iter()
            .map(|d| d.mig.map(|m| (m.gi_id, 0, None)))
            .collect();
        let spec = tessera::prepare::cdi_spec::render_claim_spec(&plan, &f.cdi, &caps).unwrap();
        write(
            "cdi_spec",
            &format!("claim-{i}.json"),
            &serde_json::to_vec_pretty(&spec).unwrap(),
        );
    }
    let mock = std::fs::read(root().join("../examples/mock-node.yaml")).unwrap();
    write("node_config", "mock-node.yaml", &mock);
    let text = String::from_utf8(mock).unwrap();
    let config = &text[text.find("config:\n").unwrap() + "config:\n".len()..];
    let config: String = config
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    write("node_config", "node-config.yaml", config.as_bytes());
    // plan: the published pool (YAML stream) and the example claims.
    let stream = yaml_stream(&the_pool());
    let claims_of = |f: &str| {
        std::fs::read_to_string(root().join(format!("../examples/claims/{f}.yaml"))).unwrap()
    };
    for f in ["whole-gpus", "shared-gpus", "mig-partitions"] {
        write(
            "plan",
            &format!("{f}.yaml"),
            format!("{stream}{}", claims_of(f)).as_bytes(),
        );
    }
    // plan, for every server (a `# gates:` first line, as `tessera plan --k8s-version
    // --gates`): a shared and a whole GPU with the whole and shared examples (a fifth to
    // a seventh of the full pool's size, so that many times the executions), and the MIG
    // GPU alone with the MIG examples (nearly the full pool's size where partitionable
    // devices are on: the MIG partitions are most of the pool).
    for (tag, header) in [
        ("1.34", "1.34"),
        (
            "1.34-dra-alpha",
            "1.34 DRAPartitionableDevices=true,DRAConsumableCapacity=true",
        ),
        ("1.35", "1.35"),
        (
            "1.35-dra-alpha",
            "1.35 DRAPartitionableDevices=true,DRAConsumableCapacity=true",
        ),
        ("1.36", "1.36"),
        ("1.37", "1.37"),
    ] {
        let gates = tessera_fuzz::plan_gates(&format!("# gates: {header}\n")).unwrap();
        let small = yaml_stream(&pool_for(&gates, |g| {
            g.mode == GpuMode::Shared || g.gpu.index == 2
        }));
        write(
            "plan",
            &format!("small-{tag}.yaml"),
            format!(
                "# gates: {header}\n{small}{}---\n{}",
                claims_of("whole-gpus"),
                claims_of("shared-gpus")
            )
            .as_bytes(),
        );
        let mig = yaml_stream(&pool_for(&gates, |g| g.mode == GpuMode::Mig));
        write(
            "plan",
            &format!("mig-{tag}.yaml"),
            format!("# gates: {header}\n{mig}{}", claims_of("mig-partitions")).as_bytes(),
        );
    }
    // abi: a limits, control and region file as the plugin writes them.
    let uuids = [
        "GPU-9a7e3b21-0c4d-4f8e-b6a5-2d1c0e9f8a73",
        "GPU-1c5b8e4a-7d3f-4a2b-9c61-8e0f4d7a2b95",
    ];
    let limits = tessera_abi::limits::Limits::merged(
        "0b5c6e2a-1f3d-4c8e-9a7b-2d4f6e8a0c1e",
        true,
        uuids.iter().map(|u| (u.to_string(), 21474836480)),
    )
    .unwrap();
    let mut l = vec![0u8];
    l.extend(limits.render().into_bytes());
    write("abi_files", "limits", &l);
    let control = tessera_abi::control::initial_bytes(
        &uuids
            .iter()
            .map(|u| tessera_abi::control::GpuControl {
                uuid: u.to_string(),
                share: 25,
                compute_limit: 100,
                block_rate: 0,
                updates: 0,
                burst_ns: 0,
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let mut c = vec![1u8];
    c.extend(control);
    write("abi_files", "control", &c);
    let mut r = vec![2u8];
    r.extend(tessera_abi::region::initial_bytes(&uuids, 4).unwrap());
    write("abi_files", "region", &r);
    for (i, s) in [
        "20Gi",
        "1.5",
        "100m",
        "1e3",
        "0.1Ki",
        "580.65.06",
        "1.2.3-rc.1+b",
        "v9.0",
        "-5",
    ]
    .iter()
    .enumerate()
    {
        write("quantity_semver", &format!("s{i}"), s.as_bytes());
    }
}
