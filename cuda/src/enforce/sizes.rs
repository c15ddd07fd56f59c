//! Sizes the library charges, and the numbers its virtual views report. Pure
//! functions.
#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint};

/// The page size the driver backs linear, managed and stream-ordered allocations with:
/// a 1-byte `cuMemAlloc` still takes a 2 MiB page of device memory, so charging the
/// request would let many small allocations overrun a budget.
pub const LINEAR_PAGE: u64 = 2 << 20;

/// The widest pitch alignment a driver uses for `cuMemAllocPitch` (texture pitch
/// alignment of current GPUs).
pub const PITCH_ALIGN: u64 = 512;

pub fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to).saturating_mul(to)
}

/// The charge for a linear allocation of `bytes`.
pub fn linear(bytes: u64) -> u64 {
    round_up(bytes.max(1), LINEAR_PAGE)
}

/// A first reservation for a pitched allocation; corrected to the returned pitch.
pub fn pitch_bound(width: u64, height: u64) -> u64 {
    linear(round_up(width, PITCH_ALIGN).saturating_mul(height))
}

/// A first reservation for an array: its unpadded size plus an eighth and 2 MiB for
/// row, height and metadata padding; the library then charges exactly what
/// `cuArrayGetMemoryRequirements` reports (topping up, or destroying the array when
/// the budget has no room for the difference).
pub fn array_bound(w: usize, h: usize, d: usize, format: c_int, channels: c_uint) -> u64 {
    let elem = crate::ffi::format_bytes(format).unwrap_or(16);
    let n = (w as u64)
        .saturating_mul(h as u64)
        .saturating_mul(d as u64)
        .saturating_mul(u64::from(channels.max(1)))
        .saturating_mul(elem);
    n.saturating_add(n / 8).saturating_add(LINEAR_PAGE)
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a 16-byte `CUuuid`, as NVML spells it.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from_digit(u32::from(x >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(x & 15), 16).unwrap_or('0'));
    }
    s
}

/// A memory view for a budgeted GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

/// The budget as total; used never above it, free never wrapping and never more
/// than the device really has free.
pub fn virtual_memory(budget: u64, used: u64, device_free: u64) -> View {
    let used = used.min(budget);
    View {
        total: budget,
        used,
        free: (budget - used).min(device_free),
    }
}

/// The charge a measurement of `measured` bytes sets for a context reserved at
/// `reserved` bytes, with the region's figure `estimate`: the measurement when it is
/// above the reservation (at most twice the figure), else the reservation. A
/// measurement (before - after on the driver's free memory) only ever raises a
/// charge: memory freed meanwhile, by anyone, would make a context look free.
pub fn context_charge(reserved: u64, estimate: u64, measured: u64) -> u64 {
    let cap = estimate.saturating_mul(2).max(reserved);
    measured.clamp(reserved, cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_charges_whole_pages() {
        assert_eq!(linear(0), LINEAR_PAGE);
        assert_eq!(linear(1), LINEAR_PAGE);
        assert_eq!(linear(LINEAR_PAGE), LINEAR_PAGE);
        assert_eq!(linear(LINEAR_PAGE + 1), 2 * LINEAR_PAGE);
        // Saturates rather than wrapping: such a request is refused, never undercharged.
        assert_eq!(linear(u64::MAX), u64::MAX);
    }

    #[test]
    fn uuid_is_formatted_like_nvml() {
        let b = [
            0x4f, 0x8d, 0x0c, 0x1e, 0x6a, 0x2b, 0x4c, 0x59, 0x9e, 0x31, 0x0a, 0x7b, 0x5d, 0x2c,
            0x9f, 0x10,
        ];
        assert_eq!(format_uuid(&b), "GPU-4f8d0c1e-6a2b-4c59-9e31-0a7b5d2c9f10");
    }

    /// Used never exceeds total and free never wraps, whatever the region says.
    #[test]
    fn virtual_view_never_wraps() {
        assert_eq!(
            virtual_memory(100, 150, 1000),
            View {
                total: 100,
                used: 100,
                free: 0
            }
        );
        assert_eq!(
            virtual_memory(100, 30, 1000),
            View {
                total: 100,
                used: 30,
                free: 70
            }
        );
        assert_eq!(virtual_memory(100, 30, 10).free, 10);
    }

    const MIB: u64 = 1 << 20;

    /// A measurement raises a context's charge up to twice the region's figure, and
    /// never lowers it below what was reserved (memory freed during the creation makes
    /// the difference small or zero).
    #[test]
    fn a_context_measurement_only_raises_the_charge() {
        for (reserved, estimate, measured, want) in [
            (100 * MIB, 100 * MIB, 130 * MIB, 130 * MIB),
            (100 * MIB, 100 * MIB, 0, 100 * MIB),
            (100 * MIB, 100 * MIB, 37 * MIB, 100 * MIB),
            (100 * MIB, 100 * MIB, 900 * MIB, 200 * MIB),
            (130 * MIB, 100 * MIB, 66 * MIB, 130 * MIB),
            (130 * MIB, 100 * MIB, 150 * MIB, 150 * MIB),
        ] {
            assert_eq!(
                context_charge(reserved, estimate, measured),
                want,
                "reserved {reserved} estimate {estimate} measured {measured}"
            );
        }
    }
}
