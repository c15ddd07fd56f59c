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
//! One test per suite. Each cluster has its own ports (reserved machine-wide by
//! `lib.sh`), bridge, cgroup root and directory, so several run at once:
//! `TESSERA_CLUSTERS` of them (default 1, which gives each the whole machine; CI runs
//! 3, with `--test-threads` at least that). A test waits for its release's build before
//! it takes a cluster slot, so a suite whose binaries are ready never queues behind one
//! whose are still compiling. Prerequisites (`.ci/run` installs and
//! builds them): root, Go, debootstrap, openssl, curl, unshare, nsenter, python3 and
//! the Debian mirror; the first run builds the Kubernetes binaries (about 6 min a
//! release on 2 idle cores, cached under `target/k8s/<version>-<key>/`; a build under
//! way, such as CI's in the background, is waited for) and the chroot.
//! Without them the tests are skipped, unless `CI` is set. The image's artifacts are
//! built first (`cargo build --release -p tessera -p tessera-interpose -p tessera-cdi-hook && cargo preload --release`).
//!
//! A crate of its own (`tests/cluster/Cargo.toml`, depending only on libc, tempfile and
//! `tessera-testkit-lite`, none of them Tessera's plugin):
//! it builds in seconds, so CI starts the clusters as soon as the release artifacts
//! and a release's binaries are there, beside the rest of the test build and suite.

use testkit_lite::prereq as e2e;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// How many clusters run at once: `TESSERA_CLUSTERS` (default 1).
fn cluster_slots() -> usize {
    match std::env::var("TESSERA_CLUSTERS") {
        Err(_) => 1,
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("TESSERA_CLUSTERS must be a positive number, not '{v}'")),
    }
}

/// Clusters running now, against `cluster_slots()`.
static RUNNING: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();

/// A cluster slot, held while a suite's cluster is up; given back on drop (a panic too).
struct Slot;

impl Slot {
    fn take() -> Slot {
        let slots = cluster_slots();
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= slots {
            running = SLOT_FREED.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        SLOT_FREED.notify_one();
    }
}

/// The repository root (this crate is `tests/cluster`).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
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
    cargo_release(&[
        (
            &[
                "build",
                "--release",
                "-p",
                "tessera",
                "-p",
                "tessera-interpose",
                "-p",
                "tessera-cdi-hook",
            ][..],
            "cargo build --release -p tessera -p tessera-interpose -p tessera-cdi-hook",
        ),
        (&["preload", "--release"][..], "cargo preload --release"),
    ]);
}

/// Runs each cargo command (arguments, what) at the repository root.
fn cargo_release(commands: &[(&[&str], &str)]) {
    for (args, what) in commands.iter().copied() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo()).args(args);
        // Without what `cargo test` adds to a test's environment: a build script that
        // watches one of them (ring's watches `OUT_DIR`) would otherwise rebuild half
        // the tree here, and again in the next plain `cargo build`.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if (k.starts_with("CARGO_") && k != "CARGO_HOME")
                || ["OUT_DIR", "RUST_RECURSION_COUNT", "LD_LIBRARY_PATH"].contains(&&*k)
            {
                cmd.env_remove(&*k);
            }
        }
        run(&mut cmd, what);
    }
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
/// gates all on), `TESSERA_E2E_BENCH` (`quick`: the pod start-up benchmark too),
/// `TESSERA_CLUSTER_BACKEND` (the node: `mock`, or `nvml:MODEL`).
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
            "jq",
        ],
    )
    .is_err()
    {
        return;
    }
    let cluster = repo().join("tests/cluster");
    build_release();
    // The release's binaries (or the wait for the build under way) before a slot: a
    // suite waiting for its compiler holds no slot that a ready one could use.
    run(
        Command::new(cluster.join("build.sh")).arg(version),
        &format!("tests/cluster/build.sh {version}"),
    );
    let waited = Instant::now();
    let _slot = Slot::take();
    e2e::report(format_args!(
        "{suite}: a cluster slot after {:.0?} ({} at once)",
        waited.elapsed(),
        cluster_slots()
    ));
    // Short: the kubelet's plugin sockets live under it (a Unix socket path has 107
    // bytes at most).
    run_in_fresh_dir(&suite, &format!("k{}-", version.replace('.', "")), |dir| {
        let mut cmd = Command::new(cluster.join(script));
        cmd.arg(version).arg(dir).envs(env.iter().copied());
        cmd
    });
}

/// Runs the command `make` builds for a fresh directory under /tmp (named `prefix…`),
/// reporting its time. On failure it prints the end of every log in that directory,
/// keeps the directory and panics. The caller holds a cluster slot.
fn run_in_fresh_dir(suite: &str, prefix: &str, make: impl FnOnce(&Path) -> Command) {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let dir = tmp.path().to_path_buf();
    let mut cmd = make(&dir);
    let t = Instant::now();
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", cmd.get_program().to_string_lossy()));
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

/// The node of the newest release's suites: the shipped backend (`--backend nvml`) on
/// NVIDIA's model of a DGX H100 (tests/nvml-models as the driver root's
/// `libnvidia-ml.so.1`, MIG on, its state outliving plugin pods; mock-node-root.sh). The
/// 1.34 suites keep the mock node, with the checks only it can simulate (XID events, the
/// memory watchdog's processes, a T4).
const NVML_NODE: (&str, &str) = ("TESSERA_CLUSTER_BACKEND", "nvml:dgxh100");

/// The newest release the module proxy serves that builds with this machine's Go, on
/// the shipped NVML backend ([`NVML_NODE`]); with the pod start-up benchmark in its
/// quick mode (tests/cluster/bench-startup.py).
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn tessera_runs_on_kubernetes_1_37() {
    e2e_with(
        "tessera-e2e.sh",
        "1.37",
        &[("TESSERA_E2E_BENCH", "quick"), NVML_NODE],
    );
}

/// The Helm chart on 1.34: server-side dry runs of every mode, `helm install` with the
/// mock backend and the one-GPU workload through it, `helm upgrade` to a new image tag
/// while pods are created (none fails to prepare), `helm uninstall` leaving no object.
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn the_helm_chart_installs_upgrades_and_uninstalls_on_kubernetes_1_34() {
    e2e_on("tessera-helm-e2e.sh", "1.34");
}

/// The same on the newest release, with the chart's default `--backend nvml` on
/// NVIDIA's DGX H100 model ([`NVML_NODE`]; `tessera doctor` passes in the plugin's pod).
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn the_helm_chart_installs_upgrades_and_uninstalls_on_kubernetes_1_37() {
    e2e_with("tessera-helm-e2e.sh", "1.37", &[NVML_NODE]);
}

/// Tessera at cluster scale, quick (issue #44; `tests/cluster/scale/run.sh`): 48
/// simulated GPU nodes (the four node configs) against the real control plane of 1.37
/// without kubelets, each published by Tessera's own publisher. Asserts only hard
/// properties: every node's slices are stored, no slice is written while nothing
/// changes, and a restart storm writes each slice of a changed pool at most once (none
/// of an unchanged one). The figures (publish time, requests per node, etcd bytes,
/// scheduling latency) are printed.
#[test]
#[ignore = "needs root, Go and debootstrap (a real cluster)"]
fn simulated_gpu_nodes_publish_once_and_stay_quiet_on_kubernetes_1_37() {
    let suite = "scale/run.sh 1.37 --nodes 48";
    if e2e::prerequisites(
        suite,
        &["go", "debootstrap", "openssl", "curl", "unshare", "flock"],
    )
    .is_err()
    {
        return;
    }
    let cluster = repo().join("tests/cluster");
    cargo_release(&[(
        &["build", "--release", "--bin", "tessera-scale"][..],
        "cargo build --release --bin tessera-scale",
    )]);
    run(
        Command::new(cluster.join("build.sh")).arg("1.37"),
        "tests/cluster/build.sh 1.37",
    );
    let _slot = Slot::take();
    run_in_fresh_dir(suite, "s137-", |dir| {
        let mut cmd = Command::new(cluster.join("scale/run.sh"));
        cmd.arg("1.37")
            .arg(dir)
            .args(["--nodes", "48", "--steady-secs", "20", "--fill", "0.3"]);
        cmd
    });
}
