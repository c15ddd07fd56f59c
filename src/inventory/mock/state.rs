//! The simulated node's state file: the one source of truth shared by the mock backend
//! and the fake `libnvidia-ml.so.1` used in tests.
//!
//! The format is line-oriented text so that a small C library can read (and, for MIG,
//! later write) it without a parser dependency. Each line is `key value`, where the
//! value is the rest of the line after the first space. GPU blocks open with `gpu` and
//! close with `end`:
//!
//! ```text
//! tessera-node-state 1
//! source 5f3a9c0e12ab34cd
//! driver-version 580.65.06
//! cuda-driver-version 13000
//! major nvidia 195
//! major nvidia-uvm 508
//! major nvidia-caps 511
//! gpu
//! index 0
//! minor 0
//! uuid GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10
//! name NVIDIA H100 80GB HBM3
//! brand Nvidia
//! architecture Hopper
//! memory 85520809984
//! multiprocessors 132
//! compute-capability 9.0
//! pci-bus-id 0000:19:00.0
//! pcie-root pci0000:00
//! numa-node 0
//! mig-capable 1
//! mig-enabled 0
//! end
//! ```
//!
//! `cuda-driver-version` uses NVML's integer form (`major*1000 + minor*10`). `pcie-root`
//! and `numa-node` may be absent. Unknown keys are ignored so that a newer writer's file
//! stays readable. Writers hold an exclusive `flock` on `mock-node.state.lock` for their
//! read-modify-write and replace the file atomically.
//!
//! MIG lines inside a GPU block (MIG-capable GPUs of a catalogued model):
//!
//! ```text
//! mig-gi <gi-id> <profile-id> <start> <size>
//! mig-ci <gi-id> <ci-id> <ci-profile-index> <MIG-uuid>
//! mig-busy <gi-id>
//! ```
//!
//! Health events, after the GPU blocks (the simulated node's XID errors and device
//! losses, appended by `mock::inject_xid`/`inject_lost`/`inject_clear`):
//!
//! ```text
//! health-event <seq> <minor> xid <n>
//! health-event <seq> <minor> xid <n> gi <gi-id>
//! health-event <seq> <minor> lost
//! health-event <seq> <minor> clear
//! ```
//!
//! Sequence numbers increase from 1. A GPU whose last `lost`/`clear` line is `lost`
//! answers NVML queries with `GPU_IS_LOST` in the fake `libnvidia-ml.so.1`, whose event
//! sets deliver the `xid` lines as XID critical errors (with the GPU instance ID of
//! `gi`, else none). A `clear` is a lost GPU answering again (a reset brought it
//! back); on a GPU that is not lost it changes nothing, in the fake NVML as in the
//! mock backend.
//!
//! A GPU's MIG profiles are not written here: readers take the catalog
//! (`crate::mig::catalog`) itself (older files' `mig-profile` rows are ignored, as any
//! unknown key). `mig-busy` is a test knob: processes are running on that
//! MIG device, so destroying it answers `IN_USE`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use std::collections::{BTreeMap, BTreeSet};

use crate::inventory::{
    CharMajors, ComputeInstance, GpuInfo, HealthEvent, HealthEventKind, MigInstance, NodeInventory,
};

/// File name of the state file inside `--state-dir`.
pub const STATE_FILE: &str = "mock-node.state";
const MAGIC: &str = "tessera-node-state";
const FORMAT_VERSION: u32 = 1;

/// The persisted simulated node: its inventory plus a digest of the description it was
/// created from (so that a changed description re-initialises the node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub source_digest: String,
    pub inventory: NodeInventory,
    /// Live MIG instances per GPU minor (MIG mode itself is `GpuInfo::mig_enabled`).
    pub mig: BTreeMap<u32, GpuMig>,
    /// Injected health events, oldest first (`health-event` lines).
    pub health: Vec<HealthEvent>,
}

/// The MIG instances of one simulated GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuMig {
    pub instances: Vec<MigInstance>,
    /// GI IDs with processes running on them (destroy answers `IN_USE`).
    pub busy: BTreeSet<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read node state {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write node state {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node state {path} line {line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

impl NodeState {
    /// Renders the state in the line format above. Deterministic.
    pub fn render(&self) -> String {
        let inv = &self.inventory;
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{MAGIC} {FORMAT_VERSION}");
        let _ = writeln!(s, "source {}", self.source_digest);
        let _ = writeln!(s, "driver-version {}", inv.driver_version);
        let _ = writeln!(
            s,
            "cuda-driver-version {}",
            cuda_version_to_int(&inv.cuda_driver_version)
        );
        let _ = writeln!(s, "major nvidia {}", inv.char_majors.nvidia);
        let _ = writeln!(s, "major nvidia-uvm {}", inv.char_majors.nvidia_uvm);
        if let Some(caps) = inv.char_majors.nvidia_caps {
            let _ = writeln!(s, "major nvidia-caps {caps}");
        }
        for g in &inv.gpus {
            let _ = writeln!(s, "gpu");
            let _ = writeln!(s, "index {}", g.index);
            let _ = writeln!(s, "minor {}", g.minor);
            let _ = writeln!(s, "uuid {}", g.uuid);
            let _ = writeln!(s, "name {}", g.product_name);
            if let Some(brand) = &g.brand {
                let _ = writeln!(s, "brand {brand}");
            }
            if let Some(arch) = &g.architecture {
                let _ = writeln!(s, "architecture {arch}");
            }
            let _ = writeln!(s, "memory {}", g.memory_bytes);
            if let Some(sms) = g.multiprocessors {
                let _ = writeln!(s, "multiprocessors {sms}");
            }
            let _ = writeln!(s, "compute-capability {}", g.cuda_compute_capability);
            let _ = writeln!(s, "pci-bus-id {}", g.pci_bus_id);
            if let Some(root) = &g.pcie_root {
                let _ = writeln!(s, "pcie-root {root}");
            }
            if let Some(numa) = g.numa_node {
                let _ = writeln!(s, "numa-node {numa}");
            }
            let _ = writeln!(s, "mig-capable {}", u8::from(g.mig_capable));
            let _ = writeln!(s, "mig-enabled {}", u8::from(g.mig_enabled));
            if let Some(m) = self.mig.get(&g.minor) {
                for i in &m.instances {
                    let _ = writeln!(
                        s,
                        "mig-gi {} {} {} {}",
                        i.gi_id, i.profile_id, i.start, i.size
                    );
                    if let Some(ci) = &i.ci {
                        let ci_profile = crate::mig::model_for_product(&g.product_name)
                            .and_then(|m| m.profile_by_id(i.profile_id))
                            .map(|p| p.ci_profile_index)
                            .unwrap_or(0);
                        let _ = writeln!(
                            s,
                            "mig-ci {} {} {} {}",
                            i.gi_id, ci.ci_id, ci_profile, ci.uuid
                        );
                    }
                }
                for b in &m.busy {
                    let _ = writeln!(s, "mig-busy {b}");
                }
            }
            let _ = writeln!(s, "end");
        }
        for e in &self.health {
            let what = match e.kind {
                HealthEventKind::Xid(x) => match e.gi_id {
                    Some(gi) => format!("xid {x} gi {gi}"),
                    None => format!("xid {x}"),
                },
                HealthEventKind::Lost => "lost".into(),
                HealthEventKind::Recovered => "clear".into(),
            };
            let _ = writeln!(s, "health-event {} {} {what}", e.seq, e.minor);
        }
        s
    }

    /// Parses the line format. `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, StateError> {
        let bad = |line: usize, reason: String| StateError::Malformed {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end()));
        match lines.next() {
            Some((_, l)) if l == format!("{MAGIC} {FORMAT_VERSION}") => {}
            Some((n, l)) => {
                return Err(bad(
                    n,
                    format!("expected `{MAGIC} {FORMAT_VERSION}`, found `{l}`"),
                ));
            }
            None => return Err(bad(0, "empty file".into())),
        }
        let mut digest = String::new();
        let mut driver_version = None;
        let mut cuda = None;
        let (mut nvidia, mut uvm, mut caps) = (None, None, None);
        let mut gpus = Vec::new();
        let mut mig = BTreeMap::new();
        let mut health = Vec::new();
        let mut cur: Option<(usize, PartialGpu)> = None;
        for (n, line) in lines {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            if let Some((start, g)) = cur.as_mut() {
                match key {
                    "end" => {
                        let (g, m) = std::mem::take(g).finish().map_err(|r| bad(*start, r))?;
                        if !m.instances.is_empty() || !m.busy.is_empty() {
                            mig.insert(g.minor, m);
                        }
                        gpus.push(g);
                        cur = None;
                    }
                    "gpu" => return Err(bad(n, "`gpu` inside a gpu block".into())),
                    _ => g.set(key, value).map_err(|r| bad(n, r))?,
                }
                continue;
            }
            match key {
                "source" => digest = value.to_string(),
                "driver-version" => driver_version = Some(value.to_string()),
                "cuda-driver-version" => {
                    let v: u32 = value
                        .parse()
                        .map_err(|_| bad(n, format!("bad cuda-driver-version `{value}`")))?;
                    cuda = Some(format!("{}.{}", v / 1000, (v % 1000) / 10));
                }
                "major" => {
                    let (name, num) = value.split_once(' ').unwrap_or((value, ""));
                    let num: u32 = num
                        .parse()
                        .map_err(|_| bad(n, format!("bad major `{value}`")))?;
                    match name {
                        "nvidia" => nvidia = Some(num),
                        "nvidia-uvm" => uvm = Some(num),
                        "nvidia-caps" => caps = Some(num),
                        _ => {}
                    }
                }
                "gpu" => cur = Some((n, PartialGpu::default())),
                "health-event" => health.push(
                    parse_health_event(value)
                        .ok_or_else(|| bad(n, format!("bad health-event `{value}`")))?,
                ),
                _ => {}
            }
        }
        if let Some((start, _)) = cur {
            return Err(bad(start, "gpu block without `end`".into()));
        }
        let missing = |what: &str| bad(0, format!("missing `{what}`"));
        gpus.sort_by_key(|g: &GpuInfo| g.minor);
        Ok(NodeState {
            source_digest: digest,
            mig,
            health,
            inventory: NodeInventory {
                driver_version: driver_version.ok_or_else(|| missing("driver-version"))?,
                cuda_driver_version: cuda.ok_or_else(|| missing("cuda-driver-version"))?,
                char_majors: CharMajors {
                    nvidia: nvidia.ok_or_else(|| missing("major nvidia"))?,
                    nvidia_uvm: uvm.ok_or_else(|| missing("major nvidia-uvm"))?,
                    nvidia_caps: caps,
                },
                gpus,
            },
        })
    }

    /// Loads the state file from `state_dir`; `Ok(None)` when there is none yet.
    pub fn load(state_dir: &Path) -> Result<Option<Self>, StateError> {
        let path = state_dir.join(STATE_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Read { path, source }),
        }
    }

    /// Atomically (re)writes the state file into `state_dir`, creating the directory.
    pub fn store(&self, state_dir: &Path) -> Result<(), StateError> {
        let path = state_dir.join(STATE_FILE);
        let write_err = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(write_err)?;
        tessera_cdi::atomic::write_atomic(
            state_dir,
            STATE_FILE,
            &format!(".{STATE_FILE}.tmp"),
            self.render().as_bytes(),
        )
        .map_err(write_err)
    }
}

/// `<seq> <minor> xid <n> [gi <id>]` | `<seq> <minor> lost` | `<seq> <minor> clear`.
fn parse_health_event(value: &str) -> Option<HealthEvent> {
    let f: Vec<&str> = value.split(' ').collect();
    let (kind, gi_id) = match &f[2.min(f.len())..] {
        ["xid", x] => (HealthEventKind::Xid(x.parse().ok()?), None),
        ["xid", x, "gi", gi] => (
            HealthEventKind::Xid(x.parse().ok()?),
            Some(gi.parse().ok()?),
        ),
        ["lost"] => (HealthEventKind::Lost, None),
        ["clear"] => (HealthEventKind::Recovered, None),
        _ => return None,
    };
    Some(HealthEvent {
        seq: f[0].parse().ok()?,
        minor: f.get(1)?.parse().ok()?,
        gi_id,
        kind,
    })
}

/// Name of the lock file writers hold while they read-modify-write the state.
pub const LOCK_FILE: &str = "mock-node.state.lock";

/// Runs `change` on the state under the writers' lock and stores the result when
/// `change` succeeds (nothing is written when it fails). `Ok(Err(e))` is `change`'s own
/// refusal; the outer error is I/O on the state file.
pub fn update<T, E>(
    state_dir: &Path,
    change: impl FnOnce(&mut NodeState) -> Result<T, E>,
) -> Result<Result<T, E>, StateError> {
    let lock_path = state_dir.join(LOCK_FILE);
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| StateError::Write {
            path: lock_path.clone(),
            source,
        })?;
    lock.lock().map_err(|source| StateError::Write {
        path: lock_path.clone(),
        source,
    })?;
    let path = state_dir.join(STATE_FILE);
    let mut state = NodeState::load(state_dir)?.ok_or_else(|| StateError::Read {
        path: path.clone(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no node state yet"),
    })?;
    match change(&mut state) {
        Ok(v) => {
            state.store(state_dir)?;
            Ok(Ok(v))
        }
        Err(e) => Ok(Err(e)),
    }
}

/// `13.0` → 13000, NVML's `cudaDriverVersion` encoding. Unparsable parts count as 0.
pub fn cuda_version_to_int(v: &str) -> u32 {
    let mut parts = v.split('.');
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    major * 1000 + minor * 10
}

#[derive(Default)]
struct PartialGpu {
    index: Option<u32>,
    minor: Option<u32>,
    uuid: Option<String>,
    name: Option<String>,
    brand: Option<String>,
    architecture: Option<String>,
    memory: Option<u64>,
    sms: Option<u32>,
    cc: Option<String>,
    bus: Option<String>,
    root: Option<String>,
    numa: Option<i64>,
    mig_capable: bool,
    mig_enabled: bool,
    gis: Vec<(u32, u32, u32, u32)>,
    cis: Vec<(u32, u32, String)>,
    busy: BTreeSet<u32>,
}

impl PartialGpu {
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
            v.parse().map_err(|_| format!("bad {key} `{v}`"))
        }
        match key {
            "index" => self.index = Some(num(key, value)?),
            "minor" => self.minor = Some(num(key, value)?),
            "uuid" => self.uuid = Some(value.into()),
            "name" => self.name = Some(value.into()),
            "brand" => self.brand = Some(value.into()),
            "architecture" => self.architecture = Some(value.into()),
            "memory" => self.memory = Some(num(key, value)?),
            "multiprocessors" => self.sms = Some(num(key, value)?),
            "compute-capability" => self.cc = Some(value.into()),
            "pci-bus-id" => self.bus = Some(value.into()),
            "pcie-root" => self.root = Some(value.into()),
            "numa-node" => self.numa = Some(num(key, value)?),
            "mig-capable" => self.mig_capable = value == "1",
            "mig-enabled" => self.mig_enabled = value == "1",
            "mig-gi" => {
                let f: Vec<&str> = value.split(' ').collect();
                if f.len() != 4 {
                    return Err(format!("bad mig-gi `{value}`"));
                }
                self.gis.push((
                    num(key, f[0])?,
                    num(key, f[1])?,
                    num(key, f[2])?,
                    num(key, f[3])?,
                ));
            }
            "mig-ci" => {
                let f: Vec<&str> = value.split(' ').collect();
                if f.len() != 4 {
                    return Err(format!("bad mig-ci `{value}`"));
                }
                self.cis
                    .push((num(key, f[0])?, num(key, f[1])?, f[3].to_string()));
            }
            "mig-busy" => {
                self.busy.insert(num(key, value)?);
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<(GpuInfo, GpuMig), String> {
        fn req<T>(v: Option<T>, key: &str) -> Result<T, String> {
            v.ok_or_else(|| format!("gpu block lacks `{key}`"))
        }
        let mut instances = Vec::new();
        for (gi_id, profile_id, start, size) in &self.gis {
            let ci = self
                .cis
                .iter()
                .find(|(g, _, _)| g == gi_id)
                .map(|(_, ci_id, uuid)| ComputeInstance {
                    ci_id: *ci_id,
                    uuid: uuid.clone(),
                });
            instances.push(MigInstance {
                gi_id: *gi_id,
                profile_id: *profile_id,
                start: *start,
                size: *size,
                ci,
            });
        }
        if let Some((g, ..)) = self
            .cis
            .iter()
            .find(|(g, ..)| !self.gis.iter().any(|gi| gi.0 == *g))
        {
            return Err(format!(
                "mig-ci names GPU instance {g}, which has no mig-gi line"
            ));
        }
        let mig = GpuMig {
            instances,
            busy: self.busy.clone(),
        };
        let info = GpuInfo {
            index: req(self.index, "index")?,
            minor: req(self.minor, "minor")?,
            uuid: req(self.uuid, "uuid")?,
            product_name: req(self.name, "name")?,
            brand: self.brand,
            architecture: self.architecture,
            memory_bytes: req(self.memory, "memory")?,
            multiprocessors: self.sms,
            cuda_compute_capability: req(self.cc, "compute-capability")?,
            pci_bus_id: req(self.bus, "pci-bus-id")?,
            pcie_root: self.root,
            numa_node: self.numa,
            mig_capable: self.mig_capable,
            mig_enabled: self.mig_enabled,
        };
        Ok((info, mig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rendering then parsing gives back the same state (the format is lossless).
    #[test]
    fn state_round_trips() {
        let mut mig = BTreeMap::new();
        mig.insert(
            0,
            GpuMig {
                instances: vec![MigInstance {
                    gi_id: 13,
                    profile_id: 19,
                    start: 6,
                    size: 1,
                    ci: Some(ComputeInstance {
                        ci_id: 0,
                        uuid: "MIG-c7384736-a75d-5afc-978f-d2f1294409fd".into(),
                    }),
                }],
                busy: BTreeSet::from([13]),
            },
        );
        let state = NodeState {
            source_digest: "abc".into(),
            mig,
            health: vec![
                HealthEvent {
                    seq: 1,
                    minor: 2,
                    gi_id: None,
                    kind: HealthEventKind::Xid(79),
                },
                HealthEvent {
                    seq: 2,
                    minor: 0,
                    gi_id: Some(13),
                    kind: HealthEventKind::Xid(48),
                },
                HealthEvent {
                    seq: 3,
                    minor: 2,
                    gi_id: None,
                    kind: HealthEventKind::Lost,
                },
                HealthEvent {
                    seq: 4,
                    minor: 2,
                    gi_id: None,
                    kind: HealthEventKind::Recovered,
                },
            ],
            inventory: crate::inventory::mock::MockNode::embedded_default()
                .expect("embedded default parses")
                .inventory(),
        };
        let text = state.render();
        let back = NodeState::parse(&text, Path::new("x")).expect("parses");
        assert_eq!(back, state);
    }

    /// A truncated GPU block is an error naming its line, not a silently smaller node.
    #[test]
    fn unterminated_gpu_block_is_an_error() {
        let text = "tessera-node-state 1\ndriver-version 1\ncuda-driver-version 13000\nmajor nvidia 195\nmajor nvidia-uvm 508\ngpu\nindex 0\n";
        let err = NodeState::parse(text, Path::new("s")).unwrap_err();
        assert!(err.to_string().contains("line 6"), "{err}");
    }
}
