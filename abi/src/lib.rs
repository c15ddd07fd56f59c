//! The contract between the Tessera plugin and the interception library: the three
//! per-claim files under `/run/tessera/claims/<uid>/`.
//!
//! * [`limits`]: written once by the plugin, read-only in containers: the claim's
//!   memory budget per GPU UUID and `scrubOnFree`. Versioned text.
//! * [`control`]: written in place by the plugin, read-only in containers: each GPU's
//!   compute share, `computeLimit`, block rate and bucket tolerance, under a sequence
//!   counter so that a reader never sees a torn value.
//! * [`region`]: the fixed-size accounting region, read-write in containers: per-GPU
//!   usage, the claim's token bucket and launch counters per GPU, and one slot per
//!   process identified by a random token and an OFD lock.
//!
//! The byte layouts are documented (as tables) in docs/design.md and pinned by
//! golden-file tests. What `control` and `region` share (the bounds below, the
//! little-endian fields and UUID fields of `bytes`) lives here, so that neither file's
//! module depends on the other. Only std and libc: the interception library links this
//! crate.

mod bytes;
pub mod control;
pub mod limits;
pub mod map;
pub mod region;
pub mod untrusted;

/// Longest GPU UUID the fixed-size tables hold (NVML's are 40 ASCII characters).
pub const UUID_FIELD: usize = 64;

/// Most GPUs one claim may budget: the bound of the `region`'s GPU table and of the
/// `control` file's (so that the region stays small). Also `region::MAX_GPUS`.
pub const MAX_GPUS: usize = 64;

/// The token bucket's tolerance the interception library uses when a `control` entry's
/// `burst_ns` is 0 (the `region`'s [`region::Bucket`] applies it). Also
/// `control::DEFAULT_BURST_NS`.
pub const DEFAULT_BURST_NS: u64 = 50_000_000;

/// File names inside a claim directory.
pub const LIMITS_FILE: &str = "limits";
pub const CONTROL_FILE: &str = "control";
pub const REGION_FILE: &str = "region";

/// Where claim directories appear inside containers.
pub const CONTAINER_CLAIMS_DIR: &str = "/run/tessera/claims";

/// Why a per-claim file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbiError {
    /// Wrong magic: not a Tessera file of this kind.
    BadMagic,
    /// A version older than 1 or a layout field that does not fit the file.
    BadLayout(String),
    /// A text line that does not parse.
    BadLine { line: usize, reason: String },
    /// A value out of range when writing.
    Invalid(String),
    /// A file that cannot be read as the plugin reads tenant-writable files: missing,
    /// not a regular file, or larger than the bound ([`untrusted::read_bounded`]).
    Unreadable(String),
}

impl std::fmt::Display for AbiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbiError::BadMagic => write!(f, "bad magic"),
            AbiError::BadLayout(s) => write!(f, "bad layout: {s}"),
            AbiError::BadLine { line, reason } => write!(f, "line {line}: {reason}"),
            AbiError::Invalid(s) => write!(f, "invalid: {s}"),
            AbiError::Unreadable(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for AbiError {}
