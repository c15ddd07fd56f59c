//! CDI (Container Device Interface) spec types, validation and atomic writing.
//! No async runtime and no gRPC here: this crate is pure data plus file I/O.
//!
//! - [`spec`]: the spec document as serde types;
//! - [`qualified`]: kinds, device names and `vendor/class=name` IDs;
//! - [`version`]: known `cdiVersion`s and the minimum a spec needs;
//! - [`validate`]: version, strict per-version fields, semantics;
//! - [`writer`]: rendering and atomically writing spec files;
//! - [`atomic`]: crash-safe file replacement.

#![forbid(unsafe_code)]

pub mod atomic;
mod error;
mod fields;
pub mod qualified;
pub mod spec;
pub mod validate;
pub mod version;
pub mod writer;

pub use qualified::{NameError, NamePart, QualifiedName};
pub use spec::{ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
pub use validate::{ValidationError, check_fields, validate_json, validate_spec};
pub use version::{SpecVersion, minimum_required_version};
pub use writer::{RenderedSpec, SpecFileNames, SpecWriter, VersionPolicy, WriteError, render_spec};
