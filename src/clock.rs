//! The wall clock, read in one place: seconds since the Unix epoch for records
//! (checkpoint times, taint times, probe timestamps). A clock before 1970 reads as 0
//! rather than failing a daemon path.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch (zero if the clock is set before it).
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Whole seconds since the Unix epoch.
pub fn unix_secs() -> u64 {
    since_epoch().as_secs()
}
