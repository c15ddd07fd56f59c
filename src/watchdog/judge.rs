//! The watchdog's decisions, pure and deterministic: which pod a process belongs to
//! (from its cgroup), which claims on a GPU it counts against, and per GPU what is over
//! budget, what runs with no claim and what memory is a zombie's.

use std::collections::BTreeMap;

use crate::prepare::checkpoint::{ClaimRecord, ClaimState, PodRef};
use crate::prepare::state::Unprepared;
use crate::watchdog::pods::LivePod;

/// The pod UID a process belongs to, from its `/proc/<pid>/cgroup`: the kubelet's
/// `pod<uid>` path element under `kubepods`, in the systemd (`kubepods-burstable-pod
/// <uid with _>.slice`) and cgroupfs (`/kubepods/burstable/pod<uid>/`) layouts, cgroup
/// v1 and v2. `None` for a process outside any pod.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        if !path.contains("kubepods") {
            continue;
        }
        for seg in path.split('/') {
            let seg = seg.strip_suffix(".slice").unwrap_or(seg);
            let Some(pos) = seg.rfind("pod") else {
                continue;
            };
            let cand = &seg[pos + 3..];
            let uid = cand.replace('_', "-");
            if is_uid(&uid) {
                return Some(uid);
            }
        }
    }
    None
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// One process on a GPU, as the watchdog sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessView {
    pub pid: u32,
    pub used_bytes: u64,
    /// Whether `<proc-root>/<pid>` exists.
    pub exists: bool,
    /// Pod UID from the cgroup, when in a pod.
    pub pod: Option<String>,
    /// The MIG GPU instance it runs on; `None` on a whole GPU.
    pub gi: Option<u32>,
}

/// A prepared claim with devices on the GPU being judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub pods: Vec<PodRef>,
    /// Memory budget on this GPU (shares and slots); `None` for a whole GPU or a MIG
    /// device, which has no budget to exceed.
    pub budget: Option<u64>,
}

/// One finding of a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A claim's processes hold more than budget + tolerance; `kill` are the PIDs to
    /// stop (largest first) to get back within it.
    OverBudget {
        claim: String,
        namespace: String,
        name: String,
        pods: Vec<PodRef>,
        used: u64,
        budget: u64,
        pids: Vec<u32>,
        kill: Vec<u32>,
    },
    /// A GPU process of no prepared claim.
    NoClaim {
        pid: u32,
        used: u64,
        pod: Option<String>,
    },
    /// Memory still held by a vanished process, or by a process of a claim unprepared
    /// (or being unprepared).
    Zombie {
        pid: u32,
        used: u64,
        /// The MIG GPU instance holding the memory; `None` for the whole GPU.
        gi: Option<u32>,
        /// The unprepared claim it belonged to, when known.
        claim: Option<String>,
        vanished: bool,
    },
}

/// Judges one GPU. Pure and deterministic: processes in PID order, claims in the given
/// order. A process in a pod holding several of the GPU's claims counts against their
/// summed budget (the library merges budgets by GPU the same way).
pub fn judge(
    procs: &[ProcessView],
    claims: &[ClaimView],
    unprepared: &[Unprepared],
    tolerance: u64,
) -> Vec<Finding> {
    let mut procs: Vec<&ProcessView> = procs.iter().collect();
    procs.sort_by_key(|p| p.pid);
    let mut out = Vec::new();
    // Group processes by the set of claims their pod holds on this GPU.
    let mut groups: BTreeMap<Vec<usize>, Vec<&ProcessView>> = BTreeMap::new();
    for p in procs {
        if !p.exists {
            out.push(Finding::Zombie {
                pid: p.pid,
                used: p.used_bytes,
                gi: p.gi,
                claim: None,
                vanished: true,
            });
            continue;
        }
        let holders: Vec<usize> = match &p.pod {
            Some(pod) => claims
                .iter()
                .enumerate()
                .filter(|(_, c)| c.pods.iter().any(|r| &r.uid == pod))
                .map(|(i, _)| i)
                .collect(),
            None => Vec::new(),
        };
        if !holders.is_empty() {
            groups.entry(holders).or_default().push(p);
            continue;
        }
        let gone = p.pod.as_ref().and_then(|pod| {
            unprepared
                .iter()
                .rev()
                .find(|u| u.pods.iter().any(|r| &r.uid == pod))
        });
        match gone {
            Some(u) => out.push(Finding::Zombie {
                pid: p.pid,
                used: p.used_bytes,
                gi: p.gi,
                claim: Some(u.uid.clone()),
                vanished: false,
            }),
            None => out.push(Finding::NoClaim {
                pid: p.pid,
                used: p.used_bytes,
                pod: p.pod.clone(),
            }),
        }
    }
    for (holders, members) in groups {
        let budgets: Option<Vec<u64>> = holders.iter().map(|&i| claims[i].budget).collect();
        let Some(budgets) = budgets else {
            continue; // a whole GPU or MIG device among them: nothing to exceed
        };
        let budget: u64 = budgets.iter().sum();
        let used: u64 = members.iter().map(|p| p.used_bytes).sum();
        let limit = budget.saturating_add(tolerance);
        if used <= limit {
            continue;
        }
        let mut by_size = members.clone();
        by_size.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
        let mut left = used;
        let mut kill = Vec::new();
        for p in by_size {
            if left <= limit {
                break;
            }
            left -= p.used_bytes;
            kill.push(p.pid);
        }
        let first = &claims[holders[0]];
        out.push(Finding::OverBudget {
            claim: holders
                .iter()
                .map(|&i| claims[i].uid.as_str())
                .collect::<Vec<_>>()
                .join(","),
            namespace: first.namespace.clone(),
            name: holders
                .iter()
                .map(|&i| claims[i].name.as_str())
                .collect::<Vec<_>>()
                .join(","),
            pods: first.pods.clone(),
            used,
            budget,
            pids: members.iter().map(|p| p.pid).collect(),
            kill,
        });
    }
    out
}

/// The claims of the checkpoint with devices on GPU `uuid`, with their budget there.
pub fn claims_on_gpu(claims: &BTreeMap<String, ClaimRecord>, uuid: &str) -> Vec<ClaimView> {
    claims
        .iter()
        .filter(|(_, r)| r.state == ClaimState::PrepareCompleted)
        .filter_map(|(uid, r)| {
            let on: Vec<_> = r.devices.iter().filter(|d| d.gpu_uuid == uuid).collect();
            if on.is_empty() {
                return None;
            }
            let budget = on
                .iter()
                .map(|d| d.budget.filter(|_| d.mig.is_none()).map(|b| b.memory_bytes))
                .sum::<Option<u64>>();
            Some(ClaimView {
                uid: uid.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                pods: r.pods.clone(),
                budget,
            })
        })
        .collect()
}

/// Claims of the checkpoint with devices on GPU `uuid` whose unprepare has begun but
/// not finished (a MIG device still in use fails its destroy and leaves the claim
/// there), as unprepared claims: their processes hold zombie memory. Deterministic.
pub fn unpreparing_on_gpu(claims: &BTreeMap<String, ClaimRecord>, uuid: &str) -> Vec<Unprepared> {
    claims
        .iter()
        .filter(|(_, r)| r.state == ClaimState::UnprepareStarted)
        .filter(|(_, r)| r.devices.iter().any(|d| d.gpu_uuid == uuid))
        .map(|(uid, r)| Unprepared {
            uid: uid.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            pods: r.pods.clone(),
            gpus: vec![uuid.to_string()],
            at: r.started_at,
        })
        .collect()
}

/// Adds a live pod to the views of the claims (`claim_uids`) it uses, unless already
/// recorded there. Deterministic.
pub fn add_live_pod(on_gpu: &mut [ClaimView], pod: &LivePod, claim_uids: &[String]) {
    for c in on_gpu.iter_mut().filter(|c| claim_uids.contains(&c.uid)) {
        if !c.pods.iter().any(|r| r.uid == pod.uid) {
            c.pods.push(pod.pod_ref());
        }
    }
}
