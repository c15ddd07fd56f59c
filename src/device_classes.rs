//! The DeviceClasses Tessera ships (`deploy/deviceclasses/`), compiled in so that
//! `tessera plan` and the tests allocate with exactly what a cluster gets by default.

use std::path::Path;

use k8s_model::schedule::{self, PlanError};
use k8s_openapi::api::resource::v1::DeviceClass;

/// The shipped DeviceClass manifests, one per file of `deploy/deviceclasses/`.
pub const BUILTIN: &[&str] = &[
    include_str!("../deploy/deviceclasses/gpu.tessera.dev.yaml"),
    include_str!("../deploy/deviceclasses/mig.tessera.dev.yaml"),
    include_str!("../deploy/deviceclasses/shared.tessera.dev.yaml"),
    include_str!("../deploy/deviceclasses/slot.tessera.dev.yaml"),
];

/// The classes in `path` (a file or directory), or the shipped ones when it is `None`.
pub fn read(path: Option<&Path>) -> Result<Vec<DeviceClass>, PlanError> {
    match path {
        Some(p) => schedule::read_classes(p),
        None => schedule::parse_classes(BUILTIN, "built-in classes"),
    }
}
