//! `tessera-scale`: N simulated GPU nodes against a real control plane (issue #44).
//!
//! Dev-only (a testkit binary, never in the shipped one). Run by
//! `tests/cluster/scale/run.sh`, which starts the real etcd, kube-apiserver,
//! controller-manager and scheduler without a kubelet (`up.sh` with
//! `TESSERA_CLUSTER_NODELESS=1`). This binary then:
//!
//! 1. registers N Nodes as their kubelets would (Ready, a Lease renewed every 10 s:
//!    its own heartbeat writer, see `nodes`), a mix of 8×H100 whole, 8×H100 MIG (every
//!    partition), 8×H100 shared and 8×T4;
//! 2. starts every node's plugin at once: Tessera's own publisher code per node name
//!    (`plugins`), and times until all are published;
//! 3. measures the API requests while nothing changes (the API server's
//!    `apiserver_request_total`), and what etcd stores per node;
//! 4. restarts every publisher at once, twice: unchanged, then with a new driver
//!    version (every slice changes): writes per node, convergence, API latency;
//! 5. schedules pods without claims, then with claims (whole GPU, 1g.10gb MIG, a share,
//!    `firstAvailable`) until the GPUs are filled to `--fill`: pods/s and latency
//!    quantiles from the scheduler's own metrics (a stalled batch is explained, not
//!    fatal);
//! 6. with `--sample K`: K pods of each kind one at a time, each created once the
//!    previous one is bound (one pod's latency, no queue), then writes the sample and
//!    the slices for `tessera plan` (`run.sh` runs it and `scale/plan-sample.py`).
//!
//! It prints the figures (Markdown tables) and fails only on hard properties: every
//! node's slices present, no write at steady state, in a restart storm at most one
//! write per slice of a changed pool (a bumped generation rewrites a pool whole) and
//! none for an unchanged one. Timings are printed, never asserted.

mod etcd;
mod metrics;
mod nodes;
mod plugins;
mod scheduling;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use tokio::sync::watch;

use crate::metrics::{Scrape, bucket_delta, quantile};
use crate::nodes::{NodeKind, SimNode};
use crate::plugins::Fleet;
use crate::scheduling::PodKind;

#[derive(Parser, Debug)]
#[command(about = "N simulated GPU nodes against a real control plane (issue #44)")]
struct Args {
    /// The cluster's DIR (up.sh with TESSERA_CLUSTER_NODELESS=1): env, kubeconfig, pki/.
    #[arg(long)]
    cluster_dir: PathBuf,
    /// The plugins' kubeconfig (default: DIR/scale/plugin.kubeconfig if present, else
    /// the admin's).
    #[arg(long)]
    plugin_kubeconfig: Option<PathBuf>,
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Seconds of steady state measured.
    #[arg(long, default_value_t = 60)]
    steady_secs: u64,
    /// Fill the GPUs to this fraction with claim pods (0: no scheduling phase).
    #[arg(long, default_value_t = 0.9)]
    fill: f64,
    /// Fill only these kinds of claim pods (comma-separated: whole, mig, share,
    /// first-available; default all). At 1,000 nodes a 90 % fill of every kind is about
    /// 29,000 pods, hours on 2 cores; a whole-GPU fill alone is 3,600.
    #[arg(long, value_delimiter = ',', value_parser = ["whole", "mig", "share", "first-available"])]
    fill_only: Vec<String>,
    /// Pods without claims in the baseline batch (default: as many as the largest claim
    /// batch, at most 20 a node).
    #[arg(long)]
    plain_pods: Option<usize>,
    /// Pods of each kind scheduled one at a time after the fill (each created once the
    /// previous one is bound): one pod's latency without a queue (0: none).
    #[arg(long, default_value_t = 0)]
    sample: usize,
    /// The slice-shape experiment: publish MIG devices of only these profiles
    /// (comma-separated, e.g. 1g.10gb), as a node config limiting profiles would; default
    /// every profile, as Tessera publishes.
    #[arg(long, value_delimiter = ',')]
    mig_profiles: Vec<String>,
    /// Limit on any one publish or convergence (seconds).
    #[arg(long, default_value_t = 900)]
    limit_secs: u64,
}

/// A hard property that failed (the run's exit status).
struct Violations(Vec<String>);

impl Violations {
    fn check(&mut self, ok: bool, what: String) {
        println!("{} {what}", if ok { "ok:" } else { "VIOLATED:" });
        if !ok {
            self.0.push(what);
        }
    }
}

/// The cluster's `env` file as a map.
fn read_env(dir: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("env"))
        .with_context(|| format!("reading {}/env", dir.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

async fn client_from(path: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("kubeconfig")?;
    cfg.read_timeout = Some(Duration::from_secs(300));
    kube::Client::try_from(cfg).context("client")
}

struct Cluster {
    dir: PathBuf,
    env: BTreeMap<String, String>,
    admin: kube::Client,
}

impl Cluster {
    async fn apiserver_metrics(&self) -> Result<Scrape> {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        let text = self
            .admin
            .request_text(req)
            .await
            .context("API server /metrics")?;
        Ok(metrics::parse(&text))
    }

    /// The scheduler's `/metrics` (its self-signed serving certificate; the admin's
    /// client certificate), through curl.
    fn scheduler_metrics(&self) -> Result<Scrape> {
        let pki = self.dir.join("pki");
        let port = self.env.get("SCHED_PORT").context("SCHED_PORT in env")?;
        let out = Command::new("curl")
            .args(["-fsS", "-k", "--max-time", "60", "--cert"])
            .arg(pki.join("admin.crt"))
            .arg("--key")
            .arg(pki.join("admin.key"))
            .arg(format!("https://127.0.0.1:{port}/metrics"))
            .output()
            .context("running curl")?;
        anyhow::ensure!(
            out.status.success(),
            "scheduler /metrics: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(metrics::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    fn etcd_endpoint(&self) -> Result<String> {
        Ok(format!(
            "http://127.0.0.1:{}",
            self.env.get("ETCD_PORT").context("ETCD_PORT in env")?
        ))
    }
}

fn is_write(verb: &str) -> bool {
    matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY")
}

/// `apiserver_request_total` between two scrapes for one resource: verb (with
/// "dry-run" marked) → requests.
fn requests(a: &Scrape, b: &Scrape, resource: &str) -> BTreeMap<String, f64> {
    let key = |s: &Scrape| {
        s.group("apiserver_request_total", &["verb", "dry_run"], |l| {
            l.get("resource").map(String::as_str) == Some(resource)
                && l.get("subresource").is_none_or(|s| s.is_empty())
        })
    };
    let (before, after) = (key(a), key(b));
    let mut out = BTreeMap::new();
    for (k, v) in after {
        let d = v - before.get(&k).copied().unwrap_or(0.0);
        if d > 0.0 {
            let name = if k[1].is_empty() {
                k[0].clone()
            } else {
                format!("{} (dry run)", k[0])
            };
            *out.entry(name).or_insert(0.0) += d;
        }
    }
    out
}

/// Real (not dry-run) writes to `resource` between two scrapes whose response has
/// `code_ok` (a write the server turned away, 429 from API priority and fairness, wrote
/// nothing and is retried).
fn writes_with(a: &Scrape, b: &Scrape, resource: &str, code_ok: impl Fn(&str) -> bool) -> f64 {
    let count = |s: &Scrape| {
        s.sum("apiserver_request_total", |l| {
            let get = |k: &str| l.get(k).map(String::as_str).unwrap_or("");
            get("resource") == resource
                && get("subresource").is_empty()
                && get("dry_run").is_empty()
                && is_write(get("verb"))
                && code_ok(get("code"))
        })
    };
    count(b) - count(a) + 0.0
}

/// Writes to `resource` that the server made (2xx).
fn writes(a: &Scrape, b: &Scrape, resource: &str) -> f64 {
    writes_with(a, b, resource, |c| c.starts_with('2'))
}

/// Writes to `resource` that the server turned away with 429 (retried by the publisher).
fn rejected(a: &Scrape, b: &Scrape, resource: &str) -> f64 {
    writes_with(a, b, resource, |c| c == "429")
}

fn per_node_line(what: &str, reqs: &BTreeMap<String, f64>, nodes: usize) {
    // (+ 0.0: the sum of nothing is -0.0.)
    let total: f64 = reqs.values().sum::<f64>() + 0.0;
    let verbs: Vec<String> = reqs
        .iter()
        .map(|(v, n)| format!("{v} {:.2}", n / nodes as f64))
        .collect();
    println!(
        "| {what} | {:.2} | {} |",
        total / nodes as f64,
        verbs.join(", ")
    );
}

/// p50/p95/p99 of the API server's request latency (`apiserver_request_duration_seconds`,
/// every verb but WATCH and CONNECT) between two scrapes, in ms.
fn api_latency(a: &Scrape, b: &Scrape, resource: Option<&str>) -> String {
    let keep = |l: &BTreeMap<String, String>| {
        !matches!(
            l.get("verb").map(String::as_str),
            Some("WATCH" | "CONNECT" | "WATCHLIST")
        ) && resource.is_none_or(|r| l.get("resource").map(String::as_str) == Some(r))
    };
    let name = "apiserver_request_duration_seconds";
    let d = bucket_delta(&a.buckets(name, keep), &b.buckets(name, keep));
    quantiles_ms(&d)
}

fn quantiles_ms(d: &[(f64, f64)]) -> String {
    let n = d.last().map(|x| x.1).unwrap_or(0.0);
    let q = |p| {
        quantile(d, p)
            .map(|s| format!("{:.0}", s * 1000.0))
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "{} / {} / {} ms ({n:.0} requests)",
        q(0.5),
        q(0.95),
        q(0.99)
    )
}

/// Lists every slice of the driver (one LIST) and checks each node's pool: as many
/// slices as it publishes, all of one generation. Returns the nodes that are not.
async fn check_pools(
    admin: &kube::Client,
    fleet: &Fleet,
) -> Result<(Vec<String>, BTreeMap<String, Vec<ResourceSlice>>)> {
    let api: Api<ResourceSlice> = Api::all(admin.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.driver={}", plugins::DRIVER)))
        .await
        .context("list resourceslices")?;
    let mut by_node: BTreeMap<String, Vec<ResourceSlice>> = BTreeMap::new();
    for s in list.items {
        if let Some(n) = s.spec.node_name.clone() {
            by_node.entry(n).or_default().push(s);
        }
    }
    let bad = fleet
        .plugins
        .iter()
        .filter(|p| {
            let stored = by_node.get(&p.node).map(Vec::as_slice).unwrap_or_default();
            let gens: std::collections::BTreeSet<i64> =
                stored.iter().map(|s| s.spec.pool.generation).collect();
            stored.len() != p.pool.len()
                || gens.len() != 1
                || !p.pool.iter().all(|want| {
                    stored.iter().any(|have| {
                        tessera::publish::same_ignoring_generation(&have.spec, &want.spec)
                    })
                })
        })
        .map(|p| p.node.clone())
        .collect();
    Ok((bad, by_node))
}

fn models(
    nodes: &[SimNode],
    driver_version: &str,
    work: &Path,
) -> Result<Vec<(String, Arc<tessera::node::NodeModel>)>> {
    nodes
        .iter()
        .map(|n| {
            let model = nodes::model(n, driver_version, work)?;
            Ok::<_, anyhow::Error>((n.name.clone(), Arc::new(model)))
        })
        .collect()
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let env = read_env(&args.cluster_dir)?;
    if !args.mig_profiles.is_empty() {
        let _ = plugins::MIG_PROFILES.set(args.mig_profiles.clone());
    }
    let admin = client_from(&args.cluster_dir.join("kubeconfig")).await?;
    let plugin_kc = args.plugin_kubeconfig.clone().unwrap_or_else(|| {
        let p = args.cluster_dir.join("scale/plugin.kubeconfig");
        if p.exists() {
            p
        } else {
            args.cluster_dir.join("kubeconfig")
        }
    });
    let plugin_client = client_from(&plugin_kc).await?;
    let cluster = Cluster {
        dir: args.cluster_dir.clone(),
        env,
        admin: admin.clone(),
    };
    let limit = Duration::from_secs(args.limit_secs);
    let mut violations = Violations(Vec::new());
    let work = tempfile::Builder::new()
        .prefix("tessera-scale-")
        .tempdir()
        .context("work dir")?;
    let n = args.nodes;
    println!(
        "# tessera-scale: {n} nodes, Kubernetes {}, plugins as {}",
        cluster.env.get("K8S_VERSION").cloned().unwrap_or_default(),
        plugin_kc.display()
    );
    if !args.mig_profiles.is_empty() {
        println!("slice shape: MIG devices of {:?} only", args.mig_profiles);
    }
    println!(
        "machine: {} CPUs, load {} at start",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load()
    );
    // The scheduler answers (it started with the API server).
    let t = Instant::now();
    while let Err(e) = cluster.scheduler_metrics() {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "scheduler: {e:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // ---- 1. the nodes ----
    let fleet_nodes = nodes::fleet(n);
    let t = Instant::now();
    nodes::register(&admin, &fleet_nodes).await?;
    println!(
        "\n## Nodes\n\n{n} Nodes and Leases registered in {:.1?}",
        t.elapsed()
    );
    let (hb_stop, hb_rx) = watch::channel(false);
    let heartbeat = tokio::spawn(nodes::heartbeat(
        admin.clone(),
        fleet_nodes.iter().map(|n| n.name.clone()).collect(),
        hb_rx,
    ));
    let t = Instant::now();
    let v1 = models(&fleet_nodes, "580.65.06", &work.path().join("v1"))?;
    println!(
        "node models (Tessera's mock backend + node config) built in {:.1?}",
        t.elapsed()
    );

    // ---- 2. publish from scratch ----
    let m0 = cluster.apiserver_metrics().await?;
    let t = Instant::now();
    let fleet = Fleet::start_all(&plugin_client, &v1).await?;
    let started = t.elapsed();
    let took = fleet.wait_published(t, limit).await?;
    let m1 = cluster.apiserver_metrics().await?;
    println!("\n## Publishing from scratch (every plugin starting at once)\n");
    println!(
        "all {n} nodes published in {took:.1?} (start-ups done after {started:.1?}); load {}",
        load()
    );
    println!("\n| requests per node | total | by verb |\n|---|---|---|");
    per_node_line("resourceslices", &requests(&m0, &m1, "resourceslices"), n);
    per_node_line("nodes", &requests(&m0, &m1, "nodes"), n);
    println!(
        "\nAPI latency meanwhile (p50/p95/p99, all but watches): {}",
        api_latency(&m0, &m1, None)
    );
    println!(
        "writes turned away by API priority and fairness (429, retried): {}",
        rejected(&m0, &m1, "resourceslices")
    );
    println!(
        "resourceslices latency: {}",
        api_latency(&m0, &m1, Some("resourceslices"))
    );
    let (bad, _) = check_pools(&admin, &fleet).await?;
    violations.check(
        bad.is_empty(),
        format!(
            "every node's slices present after publishing ({} nodes not: {:?})",
            bad.len(),
            &bad[..bad.len().min(5)]
        ),
    );

    // ---- 3. steady state ----
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m2 = cluster.apiserver_metrics().await?;
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let m3 = cluster.apiserver_metrics().await?;
    let minutes = args.steady_secs as f64 / 60.0;
    println!(
        "\n## Steady state ({} s, nothing changing)\n",
        args.steady_secs
    );
    println!("| requests per node per minute | total | by verb |\n|---|---|---|");
    for r in ["resourceslices", "nodes", "leases"] {
        let reqs: BTreeMap<String, f64> = requests(&m2, &m3, r)
            .into_iter()
            .map(|(k, v)| (k, v / minutes))
            .collect();
        per_node_line(r, &reqs, n);
    }
    println!(
        "(leases: the simulated kubelets' heartbeat, not Tessera's; a WATCH is counted when it ends)"
    );
    let steady_writes = writes_with(&m2, &m3, "resourceslices", |_| true);
    violations.check(
        steady_writes == 0.0,
        format!("0 ResourceSlice writes at steady state ({steady_writes})"),
    );

    // ---- 4. what is stored ----
    match cluster.etcd_endpoint().and_then(|e| etcd::read(&e)) {
        Ok(c) => print_storage(&c, &fleet, &fleet_nodes),
        Err(e) => println!("\n(etcd not read: {e:#})"),
    }

    // ---- 5. restart storms ----
    let fleet = storm(
        &cluster,
        &plugin_client,
        fleet,
        &v1,
        "restart (nothing changed)",
        limit,
        &mut violations,
    )
    .await?;
    let v2 = models(&fleet_nodes, "580.95.05", &work.path().join("v2"))?;
    let fleet = storm(
        &cluster,
        &plugin_client,
        fleet,
        &v2,
        "upgrade (new driver version: every slice changes)",
        limit,
        &mut violations,
    )
    .await?;

    // ---- 6. scheduling ----
    if args.fill > 0.0 || args.sample > 0 {
        let shares = fleet
            .plugins
            .iter()
            .find(|p| p.node.contains(NodeKind::H100Shared.label()))
            .map(|p| scheduling::shares_per_gpu(&p.pool))
            .unwrap_or(0);
        schedule(&cluster, &fleet_nodes, shares, &args, limit).await?;
    }

    let _ = hb_stop.send(true);
    let hb_failures = heartbeat.await.unwrap_or(0);
    println!(
        "\nheartbeat: {hb_failures} failed Lease renewals; load {} at the end",
        load()
    );
    fleet.stop().await;
    if violations.0.is_empty() {
        println!("\nall hard properties hold");
        Ok(())
    } else {
        anyhow::bail!("hard properties violated: {}", violations.0.join("; "))
    }
}

fn print_storage(c: &etcd::Contents, fleet: &Fleet, nodes: &[SimNode]) {
    let n = nodes.len() as f64;
    println!("\n## Stored in etcd\n");
    println!(
        "database {:.1} MiB ({:.1} MiB in use)\n",
        c.db_size as f64 / 1048576.0,
        c.db_in_use as f64 / 1048576.0
    );
    println!(
        "| resource | objects | bytes | objects per node | bytes per node |\n|---|---|---|---|---|"
    );
    for (r, (objs, bytes)) in c.by_resource() {
        if ["resourceslices", "minions", "leases"].contains(&r.as_str()) || bytes > 100_000 {
            println!(
                "| {r} | {objs} | {bytes} | {:.2} | {:.0} |",
                objs as f64 / n,
                bytes as f64 / n
            );
        }
    }
    println!(
        "\n| node config | slices | devices | stored bytes (etcd) | JSON bytes | largest slice (etcd) |\n|---|---|---|---|---|---|"
    );
    let sizes: BTreeMap<&str, usize> = c.slices().collect();
    for kind in NodeKind::ALL {
        let Some(p) = fleet.plugins.iter().find(|p| p.node.contains(kind.label())) else {
            continue;
        };
        let devices: usize = p
            .pool
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        let json: usize = p
            .pool
            .iter()
            .map(|s| serde_json::to_vec(s).map_or(0, |v| v.len()))
            .sum();
        let mine: Vec<usize> = sizes
            .iter()
            .filter(|(name, _)| name.contains(&format!("-{}-{}-", plugins::DRIVER, p.node)))
            .map(|(_, b)| *b)
            .collect();
        println!(
            "| {} | {} | {devices} | {} | {json} | {} |",
            kind.label(),
            p.pool.len(),
            mine.iter().sum::<usize>(),
            mine.iter().max().copied().unwrap_or(0)
        );
    }
}

/// Stops every plugin and starts them all again at once with `models`; checks the
/// writes against the slices that changed.
async fn storm(
    cluster: &Cluster,
    plugin_client: &kube::Client,
    fleet: Fleet,
    models: &[(String, Arc<tessera::node::NodeModel>)],
    what: &str,
    limit: Duration,
    violations: &mut Violations,
) -> Result<Fleet> {
    let n = models.len();
    let old: BTreeMap<String, Vec<ResourceSlice>> = fleet
        .plugins
        .iter()
        .map(|p| (p.node.clone(), p.pool.clone()))
        .collect();
    fleet.stop().await;
    let a = cluster.apiserver_metrics().await?;
    let t = Instant::now();
    let fleet = Fleet::start_all(plugin_client, models).await?;
    let took = fleet.wait_published(t, limit).await?;
    // Writes wake the writers' own watches: let those syncs (no writes) run too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = cluster.apiserver_metrics().await?;
    // A pool whose generation is bumped is rewritten whole (the scheduler only reads a
    // pool's newest generation): its unchanged slices are written once too. So the
    // bound is one write per slice of a changed pool, none for an unchanged pool.
    let (mut changed, mut bound) = (0usize, 0usize);
    for p in &fleet.plugins {
        let before = old.get(&p.node).map(Vec::as_slice).unwrap_or_default();
        let c = p
            .pool
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                before
                    .get(*i)
                    .is_none_or(|o| !tessera::publish::same_ignoring_generation(&o.spec, &s.spec))
            })
            .count()
            + before.len().saturating_sub(p.pool.len());
        changed += c;
        if c > 0 {
            bound += p.pool.len().max(before.len());
        }
    }
    let w = writes(&a, &b, "resourceslices");
    let turned_away = rejected(&a, &b, "resourceslices");
    println!("\n## Restart storm: {what}\n");
    println!(
        "every plugin restarted at once: converged in {took:.1?}; {changed} slices changed; load {}",
        load()
    );
    println!("\n| requests per node | total | by verb |\n|---|---|---|");
    per_node_line("resourceslices", &requests(&a, &b, "resourceslices"), n);
    println!(
        "\nAPI latency meanwhile (p50/p95/p99, all but watches): {}",
        api_latency(&a, &b, None)
    );
    println!(
        "resourceslices latency: {}",
        api_latency(&a, &b, Some("resourceslices"))
    );
    println!(
        "writes made (2xx): {w}; writes turned away by API priority and fairness (429, retried): {turned_away}"
    );
    violations.check(
        w <= bound as f64,
        format!(
            "at most one write per slice of a changed pool in the storm ({w} writes, {changed} slices changed in pools of {bound} slices, {:.2} writes per node)",
            w / n as f64
        ),
    );
    let (bad, _) = check_pools(&cluster.admin, &fleet).await?;
    violations.check(
        bad.is_empty(),
        format!(
            "every node's slices present after the storm ({} nodes not)",
            bad.len()
        ),
    );
    Ok(fleet)
}

/// One batch: creates the pods, waits until the scheduler bound them all, prints its
/// figures from the scheduler's metrics.
async fn batch(
    cluster: &Cluster,
    pods: &[(PodKind, String)],
    label: &str,
    limit: Duration,
) -> Result<()> {
    if pods.is_empty() {
        return Ok(());
    }
    let scheduled = |s: &Scrape| {
        s.sum("scheduler_schedule_attempts_total", |l| {
            l.get("result").map(String::as_str) == Some("scheduled")
        })
    };
    let unschedulable = |s: &Scrape| {
        s.sum("scheduler_schedule_attempts_total", |l| {
            l.get("result").map(String::as_str) == Some("unschedulable")
        })
    };
    let a = cluster.scheduler_metrics()?;
    let t = Instant::now();
    scheduling::create(&cluster.admin, pods).await?;
    let base = scheduled(&a);
    let waited = scheduling::wait_scheduled(
        || async { Ok::<_, anyhow::Error>(scheduled(&cluster.scheduler_metrics()?)) },
        base,
        pods.len(),
        limit,
    )
    .await;
    let took = t.elapsed();
    let b = cluster.scheduler_metrics()?;
    let sli = |s: &Scrape| s.buckets("scheduler_pod_scheduling_sli_duration_seconds", |_| true);
    let attempt = |s: &Scrape| {
        s.buckets("scheduler_scheduling_attempt_duration_seconds", |l| {
            l.get("result").map(String::as_str) == Some("scheduled")
        })
    };
    println!(
        "| {label} | {} | {:.1} | {:.1} | {} | {} | {} |",
        pods.len(),
        took.as_secs_f64(),
        pods.len() as f64 / took.as_secs_f64(),
        quantiles_ms(&bucket_delta(&sli(&a), &sli(&b))),
        quantiles_ms(&bucket_delta(&attempt(&a), &attempt(&b))),
        unschedulable(&b) - unschedulable(&a),
    );
    if let Err(e) = waited {
        // Reported, not fatal: the stall is explained from the scheduler's own messages
        // and the claims' allocations, and the run goes on without the unbound pods.
        println!("\n{label}: {e:#}");
        scheduling::explain_stall(&cluster.admin, pods[0].0).await?;
    }
    Ok(())
}

/// Nearest-rank quantiles of exact samples, in ms.
fn exact_ms(samples: &mut [Duration]) -> (String, f64) {
    samples.sort();
    let q = |p: f64| {
        let i = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    if samples.is_empty() {
        return ("-".into(), 0.0);
    }
    (
        format!("{:.0} / {:.0} / {:.0} ms", q(0.5), q(0.95), q(0.99)),
        q(0.95),
    )
}

/// The extension points reported per kind in the paced sample, and the algorithm.
const POINTS: [&str; 9] = [
    "algorithm",
    "PreFilter",
    "Filter",
    "PostFilter",
    "PreScore",
    "Score",
    "Reserve",
    "PreBind",
    "Bind",
];

/// Mean milliseconds per observation between two scrapes, for each of [`POINTS`]
/// (`None`: not observed in between).
fn mean_ms_per_extension_point(a: &Scrape, b: &Scrape) -> Vec<Option<f64>> {
    let mean = |name: &str, keep: &dyn Fn(&BTreeMap<String, String>) -> bool| {
        let d = |suffix: &str| {
            let n = format!("{name}_{suffix}");
            b.sum(&n, keep) - a.sum(&n, keep)
        };
        let (sum, count) = (d("sum"), d("count"));
        (count > 0.0).then(|| sum / count * 1000.0)
    };
    POINTS
        .iter()
        .map(|p| match *p {
            "algorithm" => mean("scheduler_scheduling_algorithm_duration_seconds", &|_| true),
            point => mean(
                "scheduler_framework_extension_point_duration_seconds",
                &|l| l.get("extension_point").is_some_and(|e| e == point),
            ),
        })
        .collect()
}

/// The paced sample: `count` pods of each kind, one at a time (each created once the
/// previous one is bound), so each latency is one pod's scheduling work and not its
/// wait behind others. Returns each kind's p95 (client-observed, SLI), in ms.
async fn sample(
    cluster: &Cluster,
    count: usize,
    limit: Duration,
) -> Result<BTreeMap<PodKind, (f64, f64)>> {
    println!(
        "\n### One pod at a time ({count} pods of each kind, each created when the previous one is bound; load {})\n",
        load()
    );
    println!(
        "| kind | pods | create → bound (client) p50/p95/p99 | SLI p50/p95/p99 | attempt p50/p95/p99 | attempts |\n|---|---|---|---|---|---|"
    );
    let sli = |s: &Scrape| s.buckets("scheduler_pod_scheduling_sli_duration_seconds", |_| true);
    let attempt = |s: &Scrape| s.buckets("scheduler_scheduling_attempt_duration_seconds", |_| true);
    let mut p95 = BTreeMap::new();
    let mut per_point = Vec::new();
    for kind in [
        PodKind::Plain,
        PodKind::Whole,
        PodKind::Mig,
        PodKind::Share,
        PodKind::FirstAvailable,
    ] {
        let a = cluster.scheduler_metrics()?;
        let mut took = Vec::new();
        for (k, name) in scheduling::names(kind, count, "s") {
            took.push(scheduling::create_one_and_wait(&cluster.admin, k, &name, limit).await?);
        }
        let b = cluster.scheduler_metrics()?;
        let (client, client95) = exact_ms(&mut took);
        let s = bucket_delta(&sli(&a), &sli(&b));
        let at = bucket_delta(&attempt(&a), &attempt(&b));
        let sli95 = quantile(&s, 0.95).unwrap_or(0.0) * 1000.0;
        println!(
            "| {} | {count} | {client} | {} | {} | {:.0} |",
            kind.label(),
            quantiles_ms(&s),
            quantiles_ms(&at),
            at.last().map_or(0.0, |x| x.1)
        );
        p95.insert(kind, (client95, sli95));
        per_point.push((kind, mean_ms_per_extension_point(&a, &b)));
    }
    // Where an attempt's time goes: the scheduler's histogram of each extension point
    // (every attempt; Filter is all nodes' filtering in one cycle), as means.
    println!(
        "\nMean ms per attempt at each extension point (`scheduler_framework_extension_point_duration_seconds`) and of the algorithm (`scheduler_scheduling_algorithm_duration_seconds`):\n"
    );
    println!(
        "| kind | {} |\n|---|{}",
        POINTS.join(" | "),
        "---|".repeat(POINTS.len())
    );
    for (kind, means) in &per_point {
        let cells: Vec<String> = means
            .iter()
            .map(|m| m.map_or("–".into(), |v| format!("{v:.2}")))
            .collect();
        println!("| {} | {} |", kind.label(), cells.join(" | "));
    }
    if let (Some(w), Some(p)) = (p95.get(&PodKind::Whole), p95.get(&PodKind::Plain)) {
        println!(
            "\nwhole GPU p95 / no claim p95: {:.2} (client), {:.2} (scheduler SLI); load {}",
            w.0 / p.0.max(f64::MIN_POSITIVE),
            w.1 / p.1.max(f64::MIN_POSITIVE),
            load()
        );
    }
    Ok(p95)
}

async fn schedule(
    cluster: &Cluster,
    nodes: &[SimNode],
    shares_per_gpu: u64,
    args: &Args,
    limit: Duration,
) -> Result<()> {
    let (fill, fill_only, plain, sample_size) =
        (args.fill, &args.fill_only, args.plain_pods, args.sample);
    scheduling::prepare(&cluster.admin).await?;
    let mut plan = scheduling::plan(nodes, shares_per_gpu, fill);
    let flag = |k: PodKind| match k {
        PodKind::Plain => "no-claim",
        PodKind::Whole => "whole",
        PodKind::Mig => "mig",
        PodKind::Share => "share",
        PodKind::FirstAvailable => "first-available",
    };
    if !fill_only.is_empty() {
        plan.retain(|(k, _)| fill_only.iter().any(|f| f == flag(*k)));
        println!("(filling only: {})", fill_only.join(", "));
    }
    let largest = plan.iter().map(|(_, c)| *c).max().unwrap_or(0);
    let plain = plain.unwrap_or(largest.min(nodes.len() * 20));
    println!(
        "\n## Scheduling (shares per shared GPU: {shares_per_gpu}; filling the GPUs to {:.0} %)\n",
        fill * 100.0
    );
    println!(
        "Pods are created 16 at a time, claims created beforehand (one per pod, no template); the no-claim pods are deleted after their batch (they would take the nodes' 110 pod slots). No kubelet: bound pods stay Pending on their node. Latencies from the scheduler's histograms (interpolated in its buckets): SLI = queue to bound; attempt = one scheduling attempt (algorithm + binding).\n"
    );
    println!(
        "| batch | pods | seconds | pods/s | SLI p50/p95/p99 | attempt p50/p95/p99 | unschedulable attempts |\n|---|---|---|---|---|---|---|"
    );
    batch(
        cluster,
        &scheduling::names(PodKind::Plain, plain, "a"),
        PodKind::Plain.label(),
        limit,
    )
    .await?;
    // The baseline measured, its pods go: they would take the nodes' pod slots.
    scheduling::delete_kind(&cluster.admin, PodKind::Plain).await?;
    for (kind, count) in &plan {
        batch(
            cluster,
            &scheduling::names(*kind, *count, "b"),
            kind.label(),
            limit,
        )
        .await?;
    }
    let bound = scheduling::bound(&cluster.admin).await?;
    println!(
        "\npods bound by kind (created, bound): {bound:?}; load {}",
        load()
    );
    if sample_size > 0 {
        sample(cluster, sample_size, limit).await?;
        scheduling::dump_for_plan(&cluster.admin, &cluster.dir.join("scale/plan")).await?;
    }
    Ok(())
}
