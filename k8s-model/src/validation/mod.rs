//! The Kubernetes API rules for `resource.k8s.io/v1` objects, per release 1.34–1.38 and
//! feature gates: what the API server drops ([`drop_disabled_fields`]), what it refuses
//! ([`validate_resource_slice`], [`validate_resource_claim`],
//! [`validate_resource_claim_status`]) and the cross-slice pool rules the scheduler and
//! the publisher enforce ([`validate_pool`]). Used by the in-process fake API server and
//! by the publisher's pre-validation. Everything here is pure and deterministic.
//!
//! Errors carry Kubernetes field paths, kinds and messages ([`FieldError`]), mirroring
//! `pkg/apis/resource/validation/validation.go`; each module notes which release's Go
//! source it was checked against and where it infers.

mod capacity;
pub mod claim;
mod device;
pub mod field;
pub mod format;
pub mod pool;
pub mod quantity;
pub mod slice;
pub mod strategy;

pub use claim::{
    allocated_node, device_status_drivers_changed, validate_resource_claim,
    validate_resource_claim_status,
};
pub use device::{DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH, taint_effects};
pub use field::{BadValue, FieldError, FieldErrorKind, FieldPath, invalid_status_message};
pub use pool::{PoolProblem, validate_pool, validate_pool_for};
pub use quantity::{ParsedQuantity, Quantity, QuantityError, QuantityFormat};
pub use slice::{SliceLimits, validate_resource_slice};
pub use strategy::{
    DroppedField, drop_disabled_claim_fields, drop_disabled_claim_fields_on_update,
    drop_disabled_fields, drop_disabled_fields_on_update, dropped_fields,
    dropped_fields_with_gates, gates_used,
};
