//! The simulated node the kit runs against with `--simulated`: one directory holding
//! what a GPU host has where the kit looks for it. Owns the layout only; the fake
//! libraries (`tests/fakes/fake_nvml.c`, `cuda/tests/fakes/fake_cuda.c`) are built by
//! `tests/gpu/pack.sh`.
//!
//! | path | what |
//! |---|---|
//! | `node.yaml` | the mock node (`tests/gpu/sim-node.yaml`) |
//! | `state/` | its state file, which the fake NVML reads (`TESSERA_FAKE_NVML_STATE_DIR`) |
//! | `proc/devices`, `sys/` | the driver's majors, each GPU's sysfs entry |
//! | `root/usr/lib/x86_64-linux-gnu`, `root/usr/bin` | the driver files the CDI specs bind |
//! | `dev/` | `nvidia*` and `nvidia-caps/nvidia-cap*` device nodes with the node's majors (character devices as root, else empty files) |

use std::path::{Path, PathBuf};

use tessera::inventory::GpuBackend;
use tessera::inventory::NodeInventory;
use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};

/// Errors laying out the simulated host, each naming the step and path.
#[derive(Debug, thiserror::Error)]
pub enum SimHostError {
    #[error("reading the mock node {path}")]
    Node {
        path: PathBuf,
        #[source]
        source: tessera::inventory::BackendError,
    },
    #[error("writing the simulated state in {path}")]
    State {
        path: PathBuf,
        #[source]
        source: tessera::inventory::BackendError,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), SimHostError> {
    let w = |source| SimHostError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(w)?;
    }
    std::fs::write(path, bytes).map_err(w)
}

/// The fake driver libraries the simulated driver root holds as
/// `libnvidia-ml.so.<version>` and `libcuda.so.<version>` (empty files when absent).
#[derive(Debug, Clone, Default)]
pub struct DriverFakes {
    pub nvml: Option<PathBuf>,
    pub cuda: Option<PathBuf>,
}

/// Lays out the simulated host for `node_yaml` in `dir` (created). Owns side effects:
/// writes the files above; device nodes are made with `mknod` when it may (root).
/// Returns the node's inventory.
///
/// # Errors
/// The first step that failed.
pub fn create(
    dir: &Path,
    node_yaml: &Path,
    fakes: &DriverFakes,
) -> Result<NodeInventory, SimHostError> {
    let node = MockNode::from_file(node_yaml).map_err(|e| SimHostError::Node {
        path: node_yaml.to_path_buf(),
        source: e,
    })?;
    let text = std::fs::read(node_yaml).map_err(|source| SimHostError::Write {
        path: node_yaml.to_path_buf(),
        source,
    })?;
    write(&dir.join("node.yaml"), &text)?;
    let state = dir.join("state");
    std::fs::create_dir_all(&state).map_err(|source| SimHostError::Write {
        path: state.clone(),
        source,
    })?;
    let inv = MockBackend::new(node, state.clone(), StateAccess::ReadWrite)
        .discover()
        .map_err(|source| SimHostError::State {
            path: state,
            source,
        })?;
    crate::fake_nvml::write_proc_devices(&dir.join("proc"), &inv);
    for gpu in &inv.gpus {
        crate::fake_nvml::write_sysfs_device(&dir.join("sys"), gpu);
    }
    let lib = dir.join("root/usr/lib/x86_64-linux-gnu");
    for base in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-nvvm.so",
    ] {
        let fake = match base {
            "libcuda.so" => fakes.cuda.as_deref(),
            "libnvidia-ml.so" => fakes.nvml.as_deref(),
            _ => None,
        };
        let bytes = match fake {
            Some(f) => std::fs::read(f).map_err(|source| SimHostError::Write {
                path: f.to_path_buf(),
                source,
            })?,
            None => Vec::new(),
        };
        let file = format!("{base}.{}", inv.driver_version);
        write(&lib.join(&file), &bytes)?;
        let link = lib.join(format!("{base}.1"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).map_err(|source| SimHostError::Write {
            path: link.clone(),
            source,
        })?;
    }
    write(&dir.join("root/usr/bin/nvidia-smi"), b"")?;
    let dev = dir.join("dev");
    let majors = &inv.char_majors;
    let mut nodes: Vec<(String, u32, u32)> = vec![
        ("nvidiactl".into(), majors.nvidia, 255),
        ("nvidia-uvm".into(), majors.nvidia_uvm, 0),
        ("nvidia-uvm-tools".into(), majors.nvidia_uvm, 1),
    ];
    nodes.extend(
        inv.gpus
            .iter()
            .map(|g| (format!("nvidia{}", g.minor), majors.nvidia, g.minor)),
    );
    // MIG capabilities (`/dev/nvidia-caps/nvidia-cap<minor>`), which a MIG device's
    // CDI edits name: every minor the driver may use, as nvidia-modprobe makes them.
    if let Some(caps) = majors.nvidia_caps {
        nodes.extend((0..=255).map(|m| (format!("nvidia-caps/nvidia-cap{m}"), caps, m)));
    }
    std::fs::create_dir_all(&dev).map_err(|source| SimHostError::Write {
        path: dev.clone(),
        source,
    })?;
    for (name, major, minor) in nodes {
        let path = dev.join(&name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| SimHostError::Write {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        if testkit_lite::sys::mknod_char(&path, major, minor).is_err() {
            write(&path, b"")?;
        }
    }
    Ok(inv)
}
