//! The fields of the fixed-size files (`control`, `region`): little-endian integers at
//! byte offsets, and NUL-padded GPU UUIDs. Pure functions over byte slices.
#![forbid(unsafe_code)]

use crate::AbiError;

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
