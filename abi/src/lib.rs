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
//! The byte layouts are documented (as tables) in ARCHITECTURE.md and pinned by
//! golden-file tests. Only std and libc: the interception library links this crate.

pub mod control;
pub mod limits;
pub mod map;
pub mod region;

/// Longest GPU UUID the fixed-size tables hold (NVML's are 40 ASCII characters).
pub const UUID_FIELD: usize = 64;

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
}

impl std::fmt::Display for AbiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbiError::BadMagic => write!(f, "bad magic"),
            AbiError::BadLayout(s) => write!(f, "bad layout: {s}"),
            AbiError::BadLine { line, reason } => write!(f, "line {line}: {reason}"),
            AbiError::Invalid(s) => write!(f, "invalid: {s}"),
        }
    }
}

impl std::error::Error for AbiError {}

/// Writes `uuid` NUL-padded into a fixed field; refuses one that does not fit.
pub(crate) fn put_uuid(dst: &mut [u8], uuid: &str) -> Result<(), AbiError> {
    if uuid.is_empty() || uuid.len() >= dst.len() || !uuid.is_ascii() {
        return Err(AbiError::Invalid(format!(
            "GPU UUID {uuid:?} must be 1 to {} ASCII characters",
            dst.len() - 1
        )));
    }
    dst.fill(0);
    dst[..uuid.len()].copy_from_slice(uuid.as_bytes());
    Ok(())
}

/// Reads a NUL-padded UUID field.
pub(crate) fn get_uuid(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).into_owned()
}

pub(crate) fn rd_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn rd_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn wr_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn wr_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
