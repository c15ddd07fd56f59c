//! MIG: what Tessera knows about Multi-Instance GPU partitioning, without touching a GPU.
//!
//! * [`catalog`] owns the static profile tables per GPU model (NVML profile index vs.
//!   profile ID, instance counts, memory, engines, placements) and how much of each the
//!   reference facts back ([`Verification`]).
//! * [`geometry`] owns the rules NVML enforces over a GPU's existing GPU instances
//!   (valid placements, memory-slice overlap, instance counts, default placement,
//!   remaining capacity, destroy preconditions) and the identifiers derived from them
//!   (GI IDs, `nvidia-caps` minors, MIG UUIDs), with errors that carry NVML's codes.
//!
//! * [`discovered`] holds the models this process read from NVML for products the
//!   catalog lacks; [`model_for_product`] finds them after the catalog's.
//!
//! Everything else here is pure and deterministic. Creating instances on real hardware is the
//! backend's job; a simulated GPU calls [`geometry`] so that it behaves like NVML.

pub mod catalog;
pub mod discovered;
pub mod geometry;

pub use catalog::{GpuModel, MigProfile, Verification, all_models, model_for_product};
pub use geometry::{
    GpuInstance, MigError, check_create, check_destroy, ci_cap_minor, default_placement,
    default_placement_order, gi_cap_minor, gi_id_for_placement, mig_uuid, profile_info,
    remaining_capacity,
};
