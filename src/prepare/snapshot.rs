//! The metrics snapshot of this node's prepared claims: per GPU and per claim, from the
//! checkpoint, the backend's usage figures and the claims' regions (files read, none
//! mapped). It lives beside the state it reads so that telemetry depends on nothing
//! of prepare's.

use crate::prepare::checkpoint::device_kind;
use crate::prepare::claim_files::claim_dir;
use crate::prepare::state::DeviceState;
use crate::telemetry::metrics::{
    ClaimRow, GpuRow, NodeSnapshot, RuntimeStatus, region_usage, runtime,
};

/// Builds the snapshot from the checkpoint and the regions (reads files only).
pub fn gather(state: &DeviceState, node: &str) -> NodeSnapshot {
    let claims = state.prepared().unwrap_or_default();
    let run_dir = &state.config().run_dir;
    let mut snap = NodeSnapshot {
        node: node.to_string(),
        ..Default::default()
    };
    // Copied out so that slow NVML calls below never hold the lock the controller and
    // the watchdog write through.
    let rt = {
        let r = runtime().lock().unwrap_or_else(|p| p.into_inner());
        RuntimeStatus {
            compute: r.compute.clone(),
            zombies: r.zombies.clone(),
        }
    };
    for g in state.gpus() {
        let usage = state.backend().usage(g.gpu.minor).ok().flatten();
        snap.gpus.push(GpuRow {
            uuid: g.gpu.uuid.clone(),
            minor: g.gpu.minor,
            model: g.gpu.product_name.clone(),
            mode: g.mode.as_str().to_string(),
            memory_total: g.gpu.memory_bytes,
            memory_allocated: 0,
            memory_charged: 0,
            claims: 0,
            compute_reserved: 0.0,
            memory_used: usage.as_ref().map(|u| u.used_bytes),
            utilization: usage
                .and_then(|u| u.utilization_percent)
                .map(|p| f64::from(p) / 100.0),
            memory_zombie: rt
                .zombies
                .iter()
                .filter(|((uuid, _), _)| *uuid == g.gpu.uuid)
                .map(|(_, z)| z.0)
                .sum(),
            mig_zombie: rt
                .zombies
                .iter()
                .filter_map(|((uuid, gi), z)| {
                    (*uuid == g.gpu.uuid)
                        .then_some(*gi)
                        .flatten()
                        .map(|gi| (gi, z.0))
                })
                .collect(),
        });
    }
    for (uid, rec) in &claims {
        let usage = rec
            .claim_files
            .then(|| region_usage(&claim_dir(run_dir, uid).join(tessera_abi::REGION_FILE)))
            .flatten()
            .unwrap_or_default();
        let mut per_gpu: Vec<ClaimRow> = Vec::new();
        for d in &rec.devices {
            let Some(gpu) = state.gpus().iter().find(|g| g.gpu.uuid == d.gpu_uuid) else {
                continue;
            };
            let memory = match (&d.mig, d.budget) {
                (Some(m), _) => crate::mig::model_for_product(&gpu.gpu.product_name)
                    .and_then(|model| model.profile_by_id(m.profile_id))
                    .map_or(0, |p| p.memory_mib << 20),
                (None, Some(b)) => b.memory_bytes,
                (None, None) => gpu.gpu.memory_bytes,
            };
            let compute = d
                .budget
                .map_or(0.0, |b| f64::from(b.compute_percent) / 100.0);
            match per_gpu.iter_mut().find(|r| r.device == d.gpu_uuid) {
                Some(r) => {
                    r.memory_budget += memory;
                    r.compute_reserved += compute;
                }
                None => per_gpu.push(ClaimRow {
                    namespace: rec.namespace.clone(),
                    name: rec.name.clone(),
                    uid: uid.clone(),
                    device: d.gpu_uuid.clone(),
                    kind: device_kind(d).to_string(),
                    memory_budget: memory,
                    usage: usage
                        .iter()
                        .find(|(u, _)| u == &d.gpu_uuid)
                        .map(|(_, u)| *u),
                    compute_reserved: compute,
                    compute: rt.compute.get(&(uid.clone(), d.gpu_uuid.clone())).copied(),
                }),
            }
        }
        for row in &per_gpu {
            if let Some(g) = snap.gpus.iter_mut().find(|g| g.uuid == row.device) {
                g.claims += 1;
                g.memory_allocated += row.memory_budget;
                g.memory_charged += row.usage.map_or(0, |u| u.used);
                g.compute_reserved += row.compute_reserved;
            }
        }
        snap.claims.extend(per_gpu);
    }
    snap
}
