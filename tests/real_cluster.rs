//! Tessera on a real Kubernetes cluster, as a specification: the real kube-apiserver,
//! kube-controller-manager, kube-scheduler and kubelet of each supported release, built
//! from their pinned Go modules (`tests/cluster/k8s/v1.*`), with etcd, containerd 1.7,
//! runc and the CNI plugins from Debian, on loopback only. Tessera is installed as users
//! install it (its image built locally and imported, `kubectl apply -k` of the test
//! overlay), then `tests/cluster/tessera-e2e.sh` runs the scenarios against real
//! objects: the inventory equals the slices the API server stores, the one-GPU workload
//! runs with its device and is unprepared when deleted, every example workload runs
//! with the devices it promises (and shared GPUs' budgets hold inside its pods), and the
//! allocations the real scheduler makes agree with `tessera plan`. `tests/cluster/tessera-helm-e2e.sh` does
//! the same with the Helm chart (`deploy/helm/tessera`), on a cluster of its own.
//!
//! One test per release, one cluster at a time. Prerequisites (`.ci/run` installs and
//! builds them): root, Go, debootstrap, openssl, curl, unshare, nsenter, python3 and
//! the Debian mirror; the first run builds the Kubernetes binaries (about 6 min a
//! release on 2 idle cores, cached under `target/k8s/<version>/`; a build under way,
//! such as CI's in the background, is waited for) and the chroot.
//! Without them the tests are skipped, unless `CI` is set. The image's artifacts are
//! built first (`cargo build --release -p tessera -p tessera-cuda`).

#[path = "support/e2e.rs"]
mod e2e;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

/// One cluster at a time: two would halve each one's share of the machine.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd` with its output on the test's terminal (minutes of progress a person
/// wants to see); panics with `what` unless it succeeds.
fn run(cmd: &mut Command, what: &str) {
    let t = Instant::now();
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    e2e::report(format_args!("{what}: {status} after {:.0?}", t.elapsed()));
    assert!(status.success(), "{what} failed ({status})");
}

/// The release artifacts the image is made of: the plugin alone (no dev-dependency,
/// so no fail points) and the interception libraries. Cargo's own freshness check: a
/// no-op when they are current (`.ci/run` builds them in a phase before the tests).
fn build_release() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(repo())
        .args(["build", "--release", "-p", "tessera", "-p", "tessera-cuda"]);
    // Without what `cargo test` adds to a test's environment: a build script that
    // watches one of them (ring's watches `OUT_DIR`) would otherwise rebuild half the
    // tree here, and again in the next plain `cargo build`.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if (k.starts_with("CARGO_") && k != "CARGO_HOME")
            || ["OUT_DIR", "RUST_RECURSION_COUNT", "LD_LIBRARY_PATH"].contains(&&*k)
        {
            cmd.env_remove(&*k);
        }
    }
    run(&mut cmd, "cargo build --release -p tessera -p tessera-cuda");
}

/// Prints the end of each log of a failed run (the cluster's dir is kept).
fn dump_logs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("logs")) else {
        return;
    };
    let mut logs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(25).collect();
        eprintln!("----- {} (last {} lines)", log.display(), tail.len());
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
    }
}

/// Builds (or finds cached) the release's binaries, then runs an end-to-end script on a
/// fresh cluster: up, install, the scenarios, down.
fn e2e_on(script: &str, version: &str) {
    e2e_with(script, version, &[]);
}

/// `e2e_on` with more environment for the scripts: `TESSERA_CLUSTER_GATES` (every
/// component's feature gates; empty: the release's defaults, instead of Tessera's DRA
/// gates all on), `TESSERA_E2E_BENCH` (`quick`: the pod start-up benchmark too).
fn e2e_with(script: &str, version: &str, env: &[(&str, &str)]) {
    let suite = format!(
        "{script} {version}{}",
        env.iter()
            .map(|(k, v)| format!(" {k}='{v}'"))
            .collect::<String>()
    );
    if e2e::prerequisites(
        &suite,
        &[
            "go",
            "debootstrap",
            "openssl",
            "curl",
            "unshare",
            "nsenter",
            "python3",
            // The scenarios read manifests and compare objects with PyYAML.
            "python3:yaml",
            "flock",
        ],
    )
    .is_err()
    {
        return;
    }
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = repo().join("tests/cluster");
    build_release();
    run(
        Command::new(cluster.join("build.sh")).arg(version),
        &format!("tests/cluster/build.sh {version}"),
    );
    // Short: the kubelet's plugin sockets live under it (a Unix socket path has 107
    // bytes at most).
    let tmp = tempfile::Builder::new()
        .prefix(&format!("k{}-", version.replace('.', "")))
        .tempdir_in("/tmp")
        .unwrap();
    let dir = tmp.path().to_path_buf();
    let t = Instant::now();
    let mut cmd = Command::new(cluster.join(script));
    cmd.arg(version).arg(&dir);
    cmd.envs(env.iter().copied());
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("tests/cluster/{script}: {e}"));
    e2e::report(format_args!("{suite}: {status} after {:.0?}", t.elapsed()));
    if !status.success() {
        dump_logs(&dir);
        let kept = tmp.keep();
        panic!(
            "{suite} failed ({status}); its dir is kept: {}",
            kept.display()
        );
    }
}

/// The oldest release Tessera supports: the combined slice layout, and consumable
/// capacity an alpha gate (the harness turns it on, so shared GPUs are published in
/// the layout that avoids that scheduler's capacity-index bug).
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn tessera_runs_on_kubernetes_1_34() {
    e2e_on("tessera-e2e.sh", "1.34");
}

/// The oldest release with its default gates, as most 1.34 clusters run: no consumable
/// capacity and no partitionable devices, so the plugin publishes the shared GPU as
/// fallback slots (examples/workloads/08, examples/claims/shared-slots.yaml) and no MIG
/// partitions; the examples needing either are reported as not applicable.
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn tessera_runs_on_kubernetes_1_34_with_its_default_gates() {
    e2e_with("tessera-e2e.sh", "1.34", &[("TESSERA_CLUSTER_GATES", "")]);
}

/// The newest release the module proxy serves that builds with this machine's Go; with
/// the pod start-up benchmark in its quick mode (tests/cluster/bench-startup.py).
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn tessera_runs_on_kubernetes_1_37() {
    e2e_with("tessera-e2e.sh", "1.37", &[("TESSERA_E2E_BENCH", "quick")]);
}

/// The Helm chart on 1.34: server-side dry runs of every mode, `helm install` with the
/// mock backend and the one-GPU workload through it, `helm upgrade` to a new image tag
/// while pods are created (none fails to prepare), `helm uninstall` leaving no object.
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn the_helm_chart_installs_upgrades_and_uninstalls_on_kubernetes_1_34() {
    e2e_on("tessera-helm-e2e.sh", "1.34");
}

/// The same on the newest release.
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn the_helm_chart_installs_upgrades_and_uninstalls_on_kubernetes_1_37() {
    e2e_on("tessera-helm-e2e.sh", "1.37");
}
