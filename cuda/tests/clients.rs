//! The real Python clients against the fake driver through the library: the pinned
//! cuda-bindings versions (both loader generations) get CUDA_ERROR_OUT_OF_MEMORY over
//! budget and see the virtual total; the pinned nvidia-ml-py versions see the
//! budget as the GPU's memory. The clients are installed by `cuda/ci-setup.sh`
//! (TESSERA_CUDA_TEST_PY names the directory).

use testkit::interpose as support;

use std::path::{Path, PathBuf};

use support::*;

fn clients(test: &str) -> Option<PathBuf> {
    if !require(test) {
        return None;
    }
    match python_clients() {
        Some(d) => Some(d),
        None if in_ci() => {
            panic!("{test}: TESSERA_CUDA_TEST_PY unset or empty; run cuda/ci-setup.sh")
        }
        None => {
            skip(format!(
                "{test}: TESSERA_CUDA_TEST_PY unset (run cuda/ci-setup.sh)"
            ));
            None
        }
    }
}

const CUDA_SCRIPT: &str = r#"
from cuda.bindings import driver as d
def call(r):
    return (int(r[0]),) + tuple(r[1:])
err, = call(d.cuInit(0))
err, dev = call(d.cuDeviceGet(0))
err, ctx = call(d.cuDevicePrimaryCtxRetain(dev))
err, = call(d.cuCtxSetCurrent(ctx))
err, free, total = call(d.cuMemGetInfo())
print("meminfo", err, free, total)
err, total = call(d.cuDeviceTotalMem(dev))
print("total", err, total)
err, p = call(d.cuMemAlloc(6 << 20))
print("alloc", err)
err, q = call(d.cuMemAlloc(4 << 20))
print("alloc", err)
print("name", d.CUresult(err).name)
"#;

/// cuda-bindings 12.9.4 and 13.0.3 (dlsym loader) and 13.5.0 (pathfinder loader).
#[test]
#[ignore = "needs root and the cuda/ci-setup.sh venv"]
fn cuda_bindings_get_out_of_memory_and_the_virtual_total() {
    let Some(dir) = clients("cuda-bindings") else {
        return;
    };
    for v in ["12.9.4", "13.0.3", "13.5.0"] {
        let sb = Sandbox::new(
            &[(GPU0, 80 << 30)],
            vec![ClaimSpec::new("claim-a", &[(GPU0, 8 * MIB)])],
        );
        let out = python(&sb, &dir, &format!("cuda-bindings-{v}"), CUDA_SCRIPT, &[]);
        assert_eq!(
            out,
            [
                format!("meminfo 0 {} {}", 8 * MIB, 8 * MIB),
                format!("total 0 {}", 8 * MIB),
                "alloc 0".to_string(),
                "alloc 2".to_string(),
                "name CUDA_ERROR_OUT_OF_MEMORY".to_string(),
            ],
            "cuda-bindings {v}"
        );
        assert!(sb.ledger().peak[0] <= 8 * MIB, "cuda-bindings {v}");
    }
}

const NVML_SCRIPT: &str = r#"
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
print("v1", m.total, m.used, m.free)
m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
print("v2", m.total, m.used, m.free)
n.nvmlShutdown()
"#;

/// nvidia-ml-py 12.575.51 and 13.615.71 see the budget as total, the claim's usage
/// (here another process's 4 MiB) as used, and the rest as free.
#[test]
#[ignore = "needs root and the cuda/ci-setup.sh venv"]
fn nvidia_ml_py_sees_the_virtual_total() {
    let Some(dir) = clients("nvidia-ml-py") else {
        return;
    };
    for v in ["12.575.51", "13.615.71"] {
        let sb = Sandbox::new(
            &[(GPU0, 80 << 30)],
            vec![ClaimSpec::new("claim-a", &[(GPU0, 10 * MIB)])],
        );
        let (holder, got) = sb.spawn_client(&opts(), &["ctx", "0", "alloc", "4194304", "hold"], 3);
        assert_eq!(got, ["ok", "ok 0", "holding"]);
        let state = sb.dir.path().join("nvml-state");
        fake_nvml(&state, &sb.devices);
        let env = [("TESSERA_FAKE_NVML_STATE_DIR", state.display().to_string())];
        let out = python(&sb, &dir, &format!("nvidia-ml-py-{v}"), NVML_SCRIPT, &env);
        drop(holder);
        let (t, u, f) = (10 * MIB, 4 * MIB, 6 * MIB);
        assert_eq!(
            out,
            [format!("v1 {t} {u} {f}"), format!("v2 {t} {u} {f}")],
            "nvidia-ml-py {v}"
        );
    }
}

fn python(
    sb: &Sandbox,
    dir: &Path,
    pkg: &str,
    script: &str,
    env: &[(&str, String)],
) -> Vec<String> {
    let mut o = opts();
    o.env
        .push(("PYTHONPATH".into(), dir.join(pkg).display().to_string()));
    for (k, v) in env {
        o.env.push((k.to_string(), v.clone()));
    }
    let out = sb
        .command(&o, &dir.join("venv/bin/python"), &["-c", script])
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{pkg}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    lines(&out.stdout)
}
