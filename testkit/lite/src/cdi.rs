//! CDI fixtures for `tessera-cdi`'s tests and the plugin's: the shared reference
//! directory, the CDI JSON schema validator, and a realistic GPU spec.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_cdi::{ContainerEdits, Device, DeviceNode, Mount, Spec};

/// The `shared/` directory beside the repository. Panics (fails the test) when it is
/// missing: these tests must not silently skip.
pub fn shared_dir() -> PathBuf {
    let dir = crate::repo_root().join("../shared");
    assert!(
        dir.join("schemas/cdi/schema.json").is_file(),
        "shared reference dir not found beside the repository (looked for {})",
        dir.display()
    );
    dir
}

/// `shared/schemas/cdi`.
pub fn schema_dir() -> PathBuf {
    shared_dir().join("schemas/cdi")
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Serves `defs.json` to the schema's `$ref: "defs.json#/..."` from memory; refuses
/// everything else, so validation never touches the network.
struct DefsRetriever(Value);

impl jsonschema::Retrieve for DefsRetriever {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        if uri.as_str().ends_with("/defs.json") {
            Ok(self.0.clone())
        } else {
            Err(format!("unexpected schema reference {}", uri.as_str()).into())
        }
    }
}

/// A validator for `schema.json`, with its references into `defs.json` resolved.
pub fn schema_validator() -> jsonschema::Validator {
    let dir = schema_dir();
    let schema = read_json(&dir.join("schema.json"));
    let defs = read_json(&dir.join("defs.json"));
    jsonschema::options()
        .with_retriever(DefsRetriever(defs))
        .build(&schema)
        .unwrap_or_else(|e| panic!("compiling the CDI schema: {e}"))
}

/// The schema errors of `instance`, as `path: message` lines (empty when valid).
pub fn schema_errors(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The files of `shared/schemas/cdi/testdata/<kind>`, sorted; fails when there are none.
pub fn testdata(kind: &str) -> Vec<PathBuf> {
    let dir = schema_dir().join("testdata").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no test data in {}", dir.display());
    files
}

/// A per-claim spec for one real-looking GPU: the GPU node, the control nodes,
/// read-only driver libraries and binaries, and env. Uses only device nodes (with
/// `hostPath`), mounts and env.
pub fn gpu_spec(claim_uid: &str) -> Spec {
    let lib = "/usr/lib/x86_64-linux-gnu";
    let shared = ContainerEdits::default()
        .with_device_node(DeviceNode::char(
            "/dev/nvidiactl",
            "/dev/nvidiactl",
            195,
            255,
        ))
        .with_device_node(DeviceNode::char(
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm",
            508,
            0,
        ))
        .with_device_node(DeviceNode::char(
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-uvm-tools",
            508,
            1,
        ))
        .with_mount(Mount::bind_ro(
            format!("{lib}/libcuda.so.550.54.15"),
            format!("{lib}/libcuda.so.1"),
        ))
        .with_mount(Mount::bind_ro(
            format!("{lib}/libnvidia-ml.so.550.54.15"),
            format!("{lib}/libnvidia-ml.so.1"),
        ))
        .with_mount(Mount::bind_ro(
            format!("{lib}/libnvidia-ptxjitcompiler.so.550.54.15"),
            format!("{lib}/libnvidia-ptxjitcompiler.so.1"),
        ))
        .with_mount(Mount::bind_ro("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"))
        .with_env("NVIDIA_VISIBLE_DEVICES", "void");
    let gpu = ContainerEdits::default()
        .with_device_node(DeviceNode::char("/dev/nvidia0", "/dev/nvidia0", 195, 0))
        .with_env(
            "TESSERA_GPU_UUID",
            "GPU-8f1c9d0e-5b2a-4c3d-9e8f-0a1b2c3d4e5f",
        )
        .with_env("CUDA_VISIBLE_DEVICES", "0");
    Spec::new(
        "auto",
        "tessera.dev/gpu",
        vec![Device::new(format!("{claim_uid}-gpu-0"), gpu)],
    )
    .with_container_edits(shared)
}
