//! `tessera-kit`: the GPU acceptance kit's driver (`tests/gpu/run.sh` calls it; packed
//! by `tests/gpu/pack.sh`). Each check subcommand prints one [`CheckReport`] as JSON;
//! `report` merges them into the verdict table. A dev tool: it lives in the test kit so
//! that no test double is linked into the shipped `tessera` binary.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tessera::inventory::GpuBackend;
use tessera::inventory::mock::{MockBackend, MockNode, StateAccess};
use tessera::node::{BackendPaths, BackendSpec, open_backend};
use testkit::kit::{CheckReport, discovery, mig_mode, prepare, sim_host};

#[derive(Parser)]
#[command(
    name = "tessera-kit",
    about = "The GPU acceptance kit's checks (tests/gpu/run.sh)"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Node {
    /// GPU backend: nvml or nvml:LIBPATH.
    #[arg(long, default_value = "nvml")]
    backend: BackendSpec,
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    #[arg(long, default_value = "/sys")]
    sys_root: PathBuf,
}

impl Node {
    fn paths(&self, state_dir: PathBuf) -> BackendPaths {
        BackendPaths {
            state_dir,
            proc_root: self.proc_root.clone(),
            sys_root: self.sys_root.clone(),
        }
    }
}

/// What every check that runs the plugin takes: its node, roots, library and work dir.
#[derive(clap::Args)]
struct PluginArgs {
    #[command(flatten)]
    node: Node,
    /// Where the device nodes are (<dev-root>/dev).
    #[arg(long, default_value = "/")]
    dev_root: PathBuf,
    #[arg(long, default_value = "/")]
    driver_root: PathBuf,
    #[arg(long)]
    interception_lib: PathBuf,
    #[arg(long)]
    workdir: PathBuf,
    /// Device nodes may be plain files.
    #[arg(long)]
    simulated: bool,
}

impl PluginArgs {
    /// The plugin's setup (its backend state in `<workdir>/backend-state`), and the work dir.
    fn setup(self) -> (prepare::PrepareSetup, PathBuf) {
        let setup = prepare::PrepareSetup {
            backend: self.node.backend.clone(),
            backend_paths: self.node.paths(self.workdir.join("backend-state")),
            dev_root: self.dev_root,
            driver_root: self.driver_root,
            interception_lib: self.interception_lib,
            simulated: self.simulated,
        };
        (setup, self.workdir)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Lays out the simulated node in DIR (see `testkit::kit::sim_host`).
    SimHost {
        dir: PathBuf,
        node_yaml: PathBuf,
        /// The fake NVML, copied into the driver root.
        #[arg(long)]
        nvml_lib: Option<PathBuf>,
        /// The fake CUDA driver, copied into the driver root.
        #[arg(long)]
        cuda_lib: Option<PathBuf>,
    },
    /// Discovery through the backend against `nvidia-smi -q -x` (--reference-xml) or
    /// the simulated node's state (--reference-mock NODE_YAML --state-dir DIR).
    Discovery {
        #[command(flatten)]
        node: Node,
        #[arg(long)]
        reference_xml: Option<PathBuf>,
        #[arg(long)]
        reference_mock: Option<PathBuf>,
        #[arg(long, default_value = "/var/lib/tessera")]
        state_dir: PathBuf,
        /// With MIG on: the ResourceSlices Tessera publishes (`tessera inventory -o
        /// json`), whose MIG partitions are compared with --nvml-profiles.
        #[arg(long, requires = "nvml_profiles")]
        inventory_json: Option<PathBuf>,
        /// `kit_nvml mig-profiles`'s output: NVML's MIG profiles and placements.
        #[arg(long, requires = "inventory_json")]
        nvml_profiles: Option<PathBuf>,
    },
    /// A whole-GPU claim and two shared claims through the plugin's gRPC.
    Prepare {
        #[command(flatten)]
        plugin: PluginArgs,
    },
    /// Prepares shared claims (2 GiB each, one per --compute percent) and leaves them
    /// prepared; prints each one's CDI spec path.
    Share {
        #[command(flatten)]
        plugin: PluginArgs,
        #[arg(long, value_delimiter = ',', default_value = "25")]
        compute: Vec<u32>,
    },
    /// The watchdog check's plugin: a 2 GiB shared claim reserved for the pod
    /// --pod-uid, the watchdog enforcing; prints `ready`, runs until stdin ends.
    Watch {
        #[command(flatten)]
        plugin: PluginArgs,
        #[arg(long)]
        pod_uid: String,
    },
    /// The MIG check (on a GPU already in MIG mode): one claim of each profile
    /// published, prepared and unprepared; the GPU's MIG state must be as found. With
    /// --switch-mig-on (run.sh's --allow-mig-changes, GPUs with MIG off): the full
    /// lifecycle, MIG mode switched on for the check and back to the mode found.
    Mig {
        #[command(flatten)]
        plugin: PluginArgs,
        /// `kit_nvml mig-profiles`'s output, to compare the partitions published with.
        #[arg(long, conflicts_with = "switch_mig_on")]
        nvml_profiles: Option<PathBuf>,
        /// Switch MIG mode on for the check, recording the modes found in this file
        /// (which `mig-restore` reads), and back after.
        #[arg(long, requires = "kit_nvml")]
        switch_mig_on: Option<PathBuf>,
        /// The kit's NVML reader (progs/kit_nvml), for --switch-mig-on.
        #[arg(long)]
        kit_nvml: Option<PathBuf>,
        /// Where kit_nvml's libnvidia-ml.so.1 is, when not the system's.
        #[arg(long)]
        nvml_lib_dir: Option<PathBuf>,
    },
    /// On a GPU in MIG mode, the prepare check: one MIG claim of the smallest profile
    /// that fits, prepared and held (printing `spec`, `mig-uuid`, `memory-mib`,
    /// `ready`) until stdin ends, then unprepared; its report last.
    MigClaim {
        #[command(flatten)]
        plugin: PluginArgs,
    },
    /// Puts each GPU back in the MIG mode a file of `MINOR on|off` lines records (the
    /// one `mig --switch-mig-on` wrote): run.sh's exit trap. Changes only GPUs that
    /// differ; exits 1 if any is not as found.
    MigRestore {
        #[command(flatten)]
        node: Node,
        found: PathBuf,
    },
    /// A CDI spec's container edits as lines for tests/gpu/sandbox.sh: `mount HOST
    /// CONTAINER OPTIONS` and `env KEY=VALUE`, the spec's and then its devices'.
    CdiEdits { spec: PathBuf },
    /// Judges `tessera doctor -o json`'s report (a file) on the node's own checks.
    Doctor { report: PathBuf },
    /// Merges check reports (JSON files) into the verdict table on stdout and one JSON
    /// document at --json; exits 1 if any check failed.
    Report {
        #[arg(long)]
        json: PathBuf,
        reports: Vec<PathBuf>,
    },
}

fn print(r: &CheckReport) -> Result<()> {
    println!("{}", serde_json::to_string(r)?);
    Ok(())
}

fn main() -> Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Args::parse().command {
        Command::SimHost {
            dir,
            node_yaml,
            nvml_lib,
            cuda_lib,
        } => {
            let fakes = sim_host::DriverFakes {
                nvml: nvml_lib,
                cuda: cuda_lib,
            };
            let inv = sim_host::create(&dir, &node_yaml, &fakes)?;
            eprintln!(
                "simulated node in {}: {} GPU(s)",
                dir.display(),
                inv.gpus.len()
            );
        }
        Command::Discovery {
            node,
            reference_xml,
            reference_mock,
            state_dir,
            inventory_json,
            nvml_profiles,
        } => {
            let partitions = inventory_json.zip(nvml_profiles);
            let report = match discover(&node, reference_xml, reference_mock, state_dir, partitions)
            {
                Ok(r) => r,
                Err(e) => CheckReport::could_not_run("discovery", format!("{e:#}")),
            };
            print(&report)?;
        }
        Command::Prepare { plugin } => {
            let (setup, workdir) = plugin.setup();
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            print(&rt.block_on(prepare::run(&setup, &workdir)))?;
        }
        Command::Share { plugin, compute } => {
            let (setup, workdir) = plugin.setup();
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let specs = rt
                .block_on(prepare::prepare_shared(&setup, &workdir, "2Gi", &compute))
                .map_err(anyhow::Error::msg)?;
            for s in specs {
                println!("{}", s.display());
            }
        }
        Command::Watch { plugin, pod_uid } => {
            let (setup, workdir) = plugin.setup();
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            rt.block_on(prepare::watch(&setup, &workdir, &pod_uid))
                .map_err(anyhow::Error::msg)?;
        }
        Command::Mig {
            plugin,
            nvml_profiles,
            switch_mig_on,
            kit_nvml,
            nvml_lib_dir,
        } => {
            let (setup, workdir) = plugin.setup();
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let report = match (switch_mig_on, kit_nvml, nvml_profiles) {
                (Some(found), Some(program), _) => {
                    let reader = mig_mode::KitNvml {
                        program,
                        lib_dir: nvml_lib_dir,
                    };
                    rt.block_on(mig_mode::mig_lifecycle(&setup, &workdir, &found, &reader))
                }
                (_, _, Some(file)) => match read_profiles(&file) {
                    Ok(p) => rt.block_on(prepare::mig(&setup, &workdir, Some(p))),
                    Err(e) => CheckReport::could_not_run("mig", format!("{e:#}")),
                },
                _ => rt.block_on(prepare::mig(&setup, &workdir, None)),
            };
            print(&report)?;
        }
        Command::MigClaim { plugin } => {
            let (setup, workdir) = plugin.setup();
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            print(&rt.block_on(prepare::mig_claim(&setup, &workdir)))?;
        }
        Command::MigRestore { node, found } => {
            let text = std::fs::read_to_string(&found)
                .with_context(|| format!("reading {}", found.display()))?;
            let modes = mig_mode::parse(&text).map_err(anyhow::Error::msg)?;
            let (backend, _) = open_backend(
                &node.backend,
                &node.paths(std::env::temp_dir()),
                StateAccess::ReadWrite,
            )?;
            let (lines, all) = mig_mode::restore(&*backend, &modes);
            for l in lines {
                eprintln!("mig-restore: {l}");
            }
            if !all {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
        Command::CdiEdits { spec } => {
            let text = std::fs::read_to_string(&spec)
                .with_context(|| format!("reading {}", spec.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)?;
            print!("{}", testkit::kit::sandbox_edits(&json));
        }
        Command::Doctor { report } => {
            let r = std::fs::read_to_string(&report)
                .map_err(anyhow::Error::from)
                .and_then(|t| Ok(serde_json::from_str::<serde_json::Value>(&t)?));
            print(&match r {
                Ok(doc) => testkit::kit::doctor::judge(&doc),
                Err(e) => CheckReport::could_not_run("doctor", format!("its JSON report: {e:#}")),
            })?;
        }
        Command::Report { json, reports } => return report(&json, &reports),
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `kit_nvml mig-profiles`'s output, parsed.
fn read_profiles(file: &PathBuf) -> Result<discovery::NvmlProfiles> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    discovery::parse_kit_nvml_profiles(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("NVML's MIG profiles in {}", file.display()))
}

fn discover(
    node: &Node,
    reference_xml: Option<PathBuf>,
    reference_mock: Option<PathBuf>,
    state_dir: PathBuf,
    partitions: Option<(PathBuf, PathBuf)>,
) -> Result<CheckReport> {
    let (backend, _) = open_backend(
        &node.backend,
        &node.paths(state_dir.clone()),
        StateAccess::ReadOnly,
    )?;
    let found = backend
        .discover()
        .context("discovery through the backend")?;
    let reference = match (reference_xml, reference_mock) {
        (Some(xml), _) => {
            let text = std::fs::read_to_string(&xml)
                .with_context(|| format!("reading {}", xml.display()))?;
            discovery::parse_nvidia_smi_xml(&text).map_err(anyhow::Error::msg)?
        }
        (None, Some(yaml)) => {
            let node = MockNode::from_file(&yaml)?;
            let inv = MockBackend::new(node, state_dir, StateAccess::ReadOnly).discover()?;
            discovery::reference_from_inventory(&inv)
        }
        (None, None) => anyhow::bail!("no reference: --reference-xml or --reference-mock"),
    };
    let partitions = match partitions {
        Some((inventory, profiles)) => {
            let text = std::fs::read_to_string(&inventory)
                .with_context(|| format!("reading {}", inventory.display()))?;
            let slices: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", inventory.display()))?;
            Some((
                discovery::offered_partitions(&slices),
                read_profiles(&profiles)?,
            ))
        }
        None => None,
    };
    Ok(discovery::compare(
        &found,
        &reference,
        partitions.as_ref().map(|(o, n)| (o.as_slice(), n)),
    ))
}

fn report(json: &PathBuf, files: &[PathBuf]) -> Result<std::process::ExitCode> {
    let mut reports: Vec<serde_json::Value> = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let v: serde_json::Value = match serde_json::from_str(text.trim()) {
            Ok(v) => v,
            Err(e) => serde_json::to_value(CheckReport::could_not_run(
                &f.file_stem().unwrap_or_default().to_string_lossy(),
                format!("its report is not JSON ({e}): {}", text.trim()),
            ))?,
        };
        reports.push(v);
    }
    let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    println!("{:<14} {:<7} figure", "check", "verdict");
    let mut failed = 0;
    for r in &reports {
        if s(r, "verdict") != "PASS" && s(r, "verdict") != "SKIP" {
            failed += 1;
        }
        println!(
            "{:<14} {:<7} {}",
            s(r, "check"),
            s(r, "verdict"),
            s(r, "figure")
        );
    }
    for r in reports.iter().filter(|r| s(r, "verdict") == "FAIL") {
        for d in r["details"].as_array().into_iter().flatten() {
            println!("  {}: {}", s(r, "check"), d.as_str().unwrap_or(""));
        }
    }
    let doc = serde_json::json!({ "checks": reports, "failed": failed });
    std::fs::write(json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", json.display()))?;
    Ok(if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}
