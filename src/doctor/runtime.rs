//! Whether the container runtime will apply the CDI specs Tessera writes: containerd
//! (`enable_cdi`, off by default on 1.7 and on by default from 2.0; `cdi_spec_dirs`) or
//! CRI-O (CDI always on since 1.23; `cdi_spec_dirs`), read from their config files
//! (containerd's: the running daemon's `--config`, read through `/proc/<pid>/root`;
//! else under the host root). The runtime and its version come from the Node's
//! `status.nodeInfo.containerRuntimeVersion` when the API server answered.
//!
//! [`judge_containerd`] and [`judge_crio`] are pure; [`gather`] reads the files.

use std::path::{Path, PathBuf};

use toml_edit::{Document, Item};

use super::Finding;

const CHECK: &str = "container-runtime";

/// The CDI spec directories both runtimes read by default.
pub const DEFAULT_CDI_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// What the runtime check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRuntime {
    /// `containerd://1.7.24`, `cri-o://1.31.0`, ... (from the Node), if known.
    pub runtime_version: Option<String>,
    /// The CDI dir the plugin writes, as the host sees it.
    pub cdi_dir: PathBuf,
    /// containerd's config (path, text), if the file exists.
    pub containerd: Option<(PathBuf, Result<String, String>)>,
    /// CRI-O's config files in the order they apply (main file, then drop-ins).
    pub crio: Vec<(PathBuf, Result<String, String>)>,
    /// For each spec dir the configs (or the defaults) name, whether it is the
    /// plugin's CDI dir, by device and inode as the runtime resolves it; absent when
    /// either could not be looked at (then the paths are compared).
    pub same_dir: Vec<(String, bool)>,
}

/// A process's command line from `<proc>/<pid>/cmdline`.
fn cmdline(proc: &Path, pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(proc.join(pid.to_string()).join("cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

fn comm(proc: &Path, pid: u32) -> Option<String> {
    std::fs::read_to_string(proc.join(pid.to_string()).join("comm"))
        .ok()
        .map(|c| c.trim().to_string())
}

/// The value of `flag` (`flag X` or `flag=X`) in `argv`. Deterministic.
fn flag_value<'a>(argv: &'a [String], names: &[&str]) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, a)| {
        names.iter().find_map(|n| {
            if a == n {
                argv.get(i + 1).map(String::as_str)
            } else {
                a.strip_prefix(n)
                    .and_then(|r| r.strip_prefix('='))
                    .filter(|v| !v.is_empty())
            }
        })
    })
}

/// The containerd socket of the shim this process runs under (its `-address`), found
/// by walking up the parent PIDs in `proc` (the host's, with `hostPID`): it names the
/// containerd that runs this pod when a host runs several.
fn shim_address(proc: &Path) -> Option<String> {
    let mut pid = std::process::id();
    for _ in 0..64 {
        let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        if ppid <= 1 {
            return None;
        }
        if comm(proc, ppid)?.starts_with("containerd-shim") {
            return flag_value(&cmdline(proc, ppid)?, &["-address", "--address"])
                .map(str::to_string);
        }
        pid = ppid;
    }
    None
}

/// The config file of the containerd running this pod, read through
/// `<proc>/<pid>/root` (the daemon's own view of its files): its `--config`/`-c`, else
/// the default. With several containerd processes, the one whose socket (`--address`,
/// `[grpc] address`, default `/run/containerd/containerd.sock`) is our shim's wins,
/// else the lowest PID. `None` when no process named `containerd` is in `proc`.
fn running_containerd_config(proc: &Path) -> Option<PathBuf> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let candidates: Vec<(PathBuf, String)> = pids
        .into_iter()
        .filter(|pid| comm(proc, *pid).as_deref() == Some("containerd"))
        .filter_map(|pid| {
            let argv = cmdline(proc, pid)?;
            let config = config_arg(&argv).unwrap_or("/etc/containerd/config.toml");
            let path = proc
                .join(pid.to_string())
                .join("root")
                .join(config.trim_start_matches('/'));
            let address = flag_value(&argv, &["--address", "-a"])
                .map(str::to_string)
                .or_else(|| {
                    let text = std::fs::read_to_string(&path).ok()?;
                    let doc = Document::parse(text).ok()?;
                    table(&doc, &["grpc", "address"])
                        .and_then(Item::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "/run/containerd/containerd.sock".into());
            Some((path, address))
        })
        .collect();
    let ours = shim_address(proc);
    candidates
        .iter()
        .find(|(_, a)| ours.as_deref() == Some(a.as_str()))
        .or(candidates.first())
        .map(|(p, _)| p.clone())
}

/// containerd's `--config X`, `--config=X`, `-c X` or `-c=X`. Deterministic.
fn config_arg(argv: &[String]) -> Option<&str> {
    flag_value(argv, &["--config", "-c"])
}

/// Reads containerd's config (the running daemon's, found in `runtime_proc`, else
/// `/etc/containerd/config.toml` under `host_root`), `/etc/crio/crio.conf` and
/// `/etc/crio/crio.conf.d/*` under `host_root`.
pub fn gather(
    host_root: &Path,
    runtime_proc: &Path,
    cdi_dir: &Path,
    runtime_version: Option<String>,
) -> SeenRuntime {
    let read = |p: PathBuf| -> Option<(PathBuf, Result<String, String>)> {
        match std::fs::read_to_string(&p) {
            Ok(t) => Some((p, Ok(t))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some((p, Err(e.to_string()))),
        }
    };
    let running = running_containerd_config(runtime_proc);
    let (containerd, containerd_root) = match running.clone().and_then(read) {
        Some(c) => {
            // `<proc>/<pid>/root/<config>`: the daemon's root is the part up to `root`.
            let root = running.as_deref().and_then(|p| {
                p.ancestors()
                    .find(|a| a.file_name().is_some_and(|n| n == "root"))
                    .map(Path::to_path_buf)
            });
            (Some(c), root.unwrap_or_else(|| host_root.to_path_buf()))
        }
        None => (
            read(host_root.join("etc/containerd/config.toml")),
            host_root.to_path_buf(),
        ),
    };
    let mut crio: Vec<_> = read(host_root.join("etc/crio/crio.conf"))
        .into_iter()
        .collect();
    if let Ok(dir) = std::fs::read_dir(host_root.join("etc/crio/crio.conf.d")) {
        let mut names: Vec<PathBuf> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        names.sort();
        crio.extend(names.into_iter().filter_map(read));
    }
    // Where each named spec dir is, as its runtime resolves it.
    let mut named: Vec<(PathBuf, String)> = Vec::new();
    if let Some((_, Ok(t))) = &containerd {
        named.extend(
            spec_dirs_in(t)
                .into_iter()
                .map(|d| (containerd_root.clone(), d)),
        );
    }
    for (_, t) in &crio {
        if let Ok(t) = t {
            named.extend(
                spec_dirs_in(t)
                    .into_iter()
                    .map(|d| (host_root.to_path_buf(), d)),
            );
        }
    }
    for d in DEFAULT_CDI_DIRS {
        named.push((containerd_root.clone(), d.to_string()));
        named.push((host_root.to_path_buf(), d.to_string()));
    }
    let mut same_dir: Vec<(String, bool)> = Vec::new();
    if let Ok(ours) = std::fs::metadata(cdi_dir) {
        use std::os::unix::fs::MetadataExt;
        for (root, d) in named {
            if same_dir.iter().any(|(x, same)| x == &d && *same) {
                continue;
            }
            if let Ok(m) = std::fs::metadata(root.join(d.trim_start_matches('/'))) {
                same_dir.retain(|(x, _)| x != &d);
                same_dir.push((d, m.dev() == ours.dev() && m.ino() == ours.ino()));
            }
        }
    }
    SeenRuntime {
        runtime_version,
        cdi_dir: cdi_dir.to_path_buf(),
        containerd,
        crio,
        same_dir,
    }
}

/// Every string in a `cdi_spec_dirs` array anywhere in a TOML document.
fn spec_dirs_in(text: &str) -> Vec<String> {
    fn walk(item: &Item, out: &mut Vec<String>) {
        if let Some(t) = item.as_table_like() {
            for (k, v) in t.iter() {
                if k == "cdi_spec_dirs" {
                    out.extend(strings(Some(v)).unwrap_or_default());
                } else {
                    walk(v, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(doc) = Document::parse(text.to_string()) {
        walk(doc.as_item(), &mut out);
    }
    out
}

/// The runtime's name and (major, minor) from `containerd://1.7.24`.
fn parse_runtime(v: &str) -> Option<(&str, Option<(u64, u64)>)> {
    let (name, ver) = v.split_once("://")?;
    let mut parts = ver.trim_start_matches('v').split(['.', '-', '+']);
    let major = parts.next().and_then(|p| p.parse().ok());
    let minor = parts.next().and_then(|p| p.parse().ok());
    Some((name, major.zip(minor)))
}

/// The verdict for this node's runtime. Deterministic.
pub fn check(seen: &SeenRuntime) -> Finding {
    let runtime = seen.runtime_version.as_deref().and_then(parse_runtime);
    match runtime {
        Some(("cri-o", v)) => judge_crio(seen, v),
        Some(("containerd", v)) => judge_containerd(seen, v),
        Some((other, _)) => Finding::warn(
            CHECK,
            vec![format!("runtime {other} (from the Node)")],
            "Tessera needs a runtime that applies CDI (containerd 1.7+ with enable_cdi, containerd 2.x, CRI-O 1.23+); check yours applies the specs in the CDI dir",
        ),
        None if seen.containerd.is_some() => judge_containerd(seen, None),
        None if !seen.crio.is_empty() => judge_crio(seen, None),
        None => Finding::warn(
            CHECK,
            vec![
                "runtime unknown: the Node's nodeInfo was not read, and no /etc/containerd/config.toml or /etc/crio/crio.conf under the host root".into(),
            ],
            "mount the host's / at --host-root (read-only) so doctor can read the runtime's config, and check that it applies CDI",
        ),
    }
}

fn table<'a>(doc: &'a Document<String>, path: &[&str]) -> Option<&'a Item> {
    let mut cur = doc.as_item();
    for p in path {
        cur = cur.get(p)?;
    }
    Some(cur)
}

fn strings(item: Option<&Item>) -> Option<Vec<String>> {
    let arr = item?.as_array()?;
    Some(
        arr.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
    )
}

/// `/var/run/x` and `/run/x` are one directory (`/var/run` links to `/run`).
fn same_dir(a: &str, b: &Path) -> bool {
    let norm = |s: &str| {
        let s = s.trim_end_matches('/');
        s.strip_prefix("/var").unwrap_or(s).to_string()
    };
    norm(a) == norm(&b.display().to_string())
}

/// Whether the spec dirs include the plugin's CDI dir (by identity where it was
/// looked at, else by path).
fn dirs_verdict(
    mut saw: Vec<String>,
    dirs: &[String],
    seen: &SeenRuntime,
    setting: &str,
) -> Finding {
    let cdi_dir = &seen.cdi_dir;
    saw.push(format!("CDI spec dirs: {}", dirs.join(", ")));
    let is_ours = |d: &&String| match seen.same_dir.iter().find(|(x, _)| x == *d) {
        Some((_, same)) => *same,
        None => same_dir(d, cdi_dir),
    };
    if let Some(d) = dirs.iter().find(is_ours) {
        saw.push(format!(
            "{d} is the plugin's --cdi-dir {}",
            cdi_dir.display()
        ));
        Finding::pass(CHECK, saw)
    } else {
        Finding::fail(
            CHECK,
            saw,
            format!(
                "the runtime does not read {} where Tessera writes its specs: add it to {setting}, or set --cdi-dir (Helm: hostPaths.cdiDir) to one of these, then restart the runtime",
                cdi_dir.display()
            ),
        )
    }
}

/// A table's header as written in TOML: `plugins."io.containerd.grpc.v1.cri"`.
fn toml_table(path: &[&str]) -> String {
    path.iter()
        .map(|p| {
            if p.contains('.') {
                format!("\"{p}\"")
            } else {
                p.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// containerd: config version 3 (2.x) keeps CRI settings in
/// `plugins."io.containerd.cri.v1.runtime"`, version 2 in
/// `plugins."io.containerd.grpc.v1.cri"`. `enable_cdi` defaults to on from 2.0 (also
/// for a version-2 file, which 2.x migrates) and off on 1.7; before 1.7 there is no
/// CDI. `cdi_spec_dirs` defaults to [`DEFAULT_CDI_DIRS`].
pub fn judge_containerd(seen: &SeenRuntime, version: Option<(u64, u64)>) -> Finding {
    let mut saw = vec![match version {
        Some((a, b)) => format!("containerd {a}.{b} (from the Node)"),
        None => "containerd, version unknown".into(),
    }];
    if let Some((a, b)) = version
        && (a, b) < (1, 7)
    {
        return Finding::fail(
            CHECK,
            saw,
            "containerd before 1.7 cannot apply CDI specs: upgrade containerd to 1.7 or later",
        );
    }
    let (path, text) = match &seen.containerd {
        None => {
            saw.push("no /etc/containerd/config.toml: containerd's defaults apply".into());
            return match version {
                Some((a, _)) if a >= 2 => {
                    let dirs: Vec<String> =
                        DEFAULT_CDI_DIRS.iter().map(|s| s.to_string()).collect();
                    dirs_verdict(saw, &dirs, seen, "cdi_spec_dirs")
                }
                Some(_) => Finding::fail(
                    CHECK,
                    saw,
                    "containerd 1.7 has CDI off by default: create /etc/containerd/config.toml with `[plugins.\"io.containerd.grpc.v1.cri\"]` `enable_cdi = true` and restart containerd",
                ),
                None => Finding::warn(
                    CHECK,
                    saw,
                    "containerd 2.x applies CDI by default, 1.7 does not: on 1.7 set enable_cdi = true in [plugins.\"io.containerd.grpc.v1.cri\"]",
                ),
            };
        }
        Some((p, Err(e))) => {
            saw.push(format!("{}: {e}", p.display()));
            return Finding::warn(
                CHECK,
                saw,
                "make the containerd config readable to the plugin (host root mounted read-only)",
            );
        }
        Some((p, Ok(t))) => (p, t),
    };
    let doc = match Document::parse(text.clone()) {
        Ok(d) => d,
        Err(e) => {
            saw.push(format!("{}: not valid TOML: {e}", path.display()));
            return Finding::fail(
                CHECK,
                saw,
                "fix the containerd config's syntax; containerd would not start with it either",
            );
        }
    };
    let file_version = table(&doc, &["version"])
        .and_then(Item::as_integer)
        .unwrap_or(1);
    let section: &[&str] = if file_version >= 3 {
        &["plugins", "io.containerd.cri.v1.runtime"]
    } else {
        &["plugins", "io.containerd.grpc.v1.cri"]
    };
    saw.push(format!(
        "{} (config version {file_version}, [{}])",
        path.display(),
        toml_table(section)
    ));
    let key = |k: &str| {
        let mut p = section.to_vec();
        p.push(k);
        table(&doc, &p)
    };
    let enabled = key("enable_cdi").and_then(Item::as_bool);
    let default_on = match version {
        Some((a, _)) => a >= 2,
        None => file_version >= 3,
    };
    let setting = format!("[{}] enable_cdi", toml_table(section));
    match enabled {
        Some(false) => {
            saw.push("enable_cdi = false".into());
            return Finding::fail(
                CHECK,
                saw,
                format!(
                    "CDI is off: set {setting} = true in {} and restart containerd",
                    path.display()
                ),
            );
        }
        None if !default_on => {
            saw.push(
                if version.is_some() {
                    "enable_cdi not set (off by default on containerd 1.7)"
                } else {
                    "enable_cdi not set (off by default on containerd 1.7, on from 2.0)"
                }
                .into(),
            );
            let fix = format!(
                "set {setting} = true in {} and restart containerd",
                path.display()
            );
            return if version.is_some() {
                Finding::fail(CHECK, saw, fix)
            } else {
                Finding::warn(CHECK, saw, fix)
            };
        }
        Some(true) => saw.push("enable_cdi = true".into()),
        None => saw.push("enable_cdi not set (on by default from containerd 2.0)".into()),
    }
    let dirs = strings(key("cdi_spec_dirs"))
        .unwrap_or_else(|| DEFAULT_CDI_DIRS.iter().map(|s| s.to_string()).collect());
    dirs_verdict(
        saw,
        &dirs,
        seen,
        &format!("[{}] cdi_spec_dirs", toml_table(section)),
    )
}

/// CRI-O: CDI is always on from 1.23; `[crio.runtime] cdi_spec_dirs` (the last file
/// that sets it wins) defaults to [`DEFAULT_CDI_DIRS`].
pub fn judge_crio(seen: &SeenRuntime, version: Option<(u64, u64)>) -> Finding {
    let mut saw = vec![match version {
        Some((a, b)) => format!("CRI-O {a}.{b} (from the Node)"),
        None => "CRI-O, version unknown".into(),
    }];
    if let Some((a, b)) = version
        && (a, b) < (1, 23)
    {
        return Finding::fail(
            CHECK,
            saw,
            "CRI-O before 1.23 cannot apply CDI specs: upgrade CRI-O",
        );
    }
    let mut dirs: Option<Vec<String>> = None;
    for (p, text) in &seen.crio {
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                saw.push(format!("{}: {e}", p.display()));
                continue;
            }
        };
        match Document::parse(text.clone()) {
            Ok(doc) => {
                saw.push(format!("{}", p.display()));
                if let Some(d) = strings(table(&doc, &["crio", "runtime", "cdi_spec_dirs"])) {
                    dirs = Some(d);
                }
            }
            Err(e) => saw.push(format!("{}: not valid TOML: {e}", p.display())),
        }
    }
    let dirs = dirs.unwrap_or_else(|| DEFAULT_CDI_DIRS.iter().map(|s| s.to_string()).collect());
    dirs_verdict(saw, &dirs, seen, "[crio.runtime] cdi_spec_dirs")
}

#[cfg(test)]
mod tests {
    use super::super::Verdict::{self, *};
    use super::*;

    fn containerd(version: Option<&str>, config: Option<&str>) -> Verdict {
        check(&SeenRuntime {
            runtime_version: version.map(str::to_string),
            cdi_dir: "/var/run/cdi".into(),
            containerd: config.map(|c| ("/etc/containerd/config.toml".into(), Ok(c.to_string()))),
            crio: Vec::new(),
            same_dir: Vec::new(),
        })
        .verdict
    }

    /// containerd's CDI switch and spec dirs, per version and config version.
    #[test]
    fn containerd_cdi_verdicts() {
        let v2_on = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\n";
        let v2_off = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = false\n";
        let v2_unset = "version = 2\n";
        let v3 = "version = 3\n";
        let v3_dirs = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/etc/cdi\"]\n";
        let v3_run = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/run/cdi\"]\n";
        let cases = [
            (Some("containerd://1.7.24"), Some(v2_on), Pass),
            (Some("containerd://1.7.24"), Some(v2_off), Fail),
            (Some("containerd://1.7.24"), Some(v2_unset), Fail),
            (Some("containerd://1.7.24"), None, Fail),
            (Some("containerd://1.6.30"), Some(v2_on), Fail),
            (Some("containerd://2.1.4"), Some(v2_unset), Pass),
            (Some("containerd://2.1.4"), Some(v3), Pass),
            (Some("containerd://2.1.4"), None, Pass),
            (Some("containerd://2.1.4"), Some(v3_dirs), Fail),
            (Some("containerd://2.1.4"), Some(v3_run), Pass),
            (None, Some(v2_unset), Warn),
            (None, Some(v3), Pass),
            (None, None, Warn),
            (Some("containerd://2.1.4"), Some("version = ["), Fail),
        ];
        for (v, c, want) in cases {
            assert_eq!(containerd(v, c), want, "{v:?} {c:?}");
        }
    }

    /// containerd's config flag in its forms.
    #[test]
    fn containerd_config_flag_forms() {
        let a = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            config_arg(&a(&["containerd", "--config", "/x"])),
            Some("/x")
        );
        assert_eq!(config_arg(&a(&["containerd", "--config=/x"])), Some("/x"));
        assert_eq!(config_arg(&a(&["containerd", "-c", "/x"])), Some("/x"));
        assert_eq!(config_arg(&a(&["containerd"])), None);
    }

    /// CRI-O: on from 1.23; the last file setting cdi_spec_dirs wins.
    #[test]
    fn crio_cdi_verdicts() {
        let seen = |v: &str, files: &[&str]| SeenRuntime {
            runtime_version: Some(v.into()),
            cdi_dir: "/var/run/cdi".into(),
            containerd: None,
            crio: files
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    (
                        PathBuf::from(format!("/etc/crio/{i}.conf")),
                        Ok(t.to_string()),
                    )
                })
                .collect(),
            same_dir: Vec::new(),
        };
        assert_eq!(check(&seen("cri-o://1.31.0", &[])).verdict, Pass);
        assert_eq!(check(&seen("cri-o://1.22.0", &[])).verdict, Fail);
        let only_etc = "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n";
        let both = "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n";
        assert_eq!(check(&seen("cri-o://1.31.0", &[only_etc])).verdict, Fail);
        assert_eq!(
            check(&seen("cri-o://1.31.0", &[only_etc, both])).verdict,
            Pass
        );
    }
}
