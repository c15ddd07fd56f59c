//! Crash-test fail points: named places in prepare and unprepare where a test build
//! aborts the process, so the crash tests can check recovery from each. Compiled to
//! nothing without the `failpoints` feature, which only the plugin's own test builds
//! enable (a dev-dependency on itself, in the root `Cargo.toml`).

use std::collections::BTreeSet;

/// Points where a test can make the plugin abort (`TESSERA_FAILPOINTS=a,b`).
pub const FAIL_POINTS: &[&str] = &[
    "prepare-after-started",
    "prepare-after-mig-create",
    "prepare-after-claim-files",
    "prepare-after-metadata",
    "prepare-after-cdi-write",
    "prepare-before-completed",
    "unprepare-after-mig-destroy",
    "unprepare-after-cdi-remove",
    "unprepare-after-claim-files-remove",
    "unprepare-after-metadata-remove",
];

/// The set of armed fail points; empty in production.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailPoints(BTreeSet<String>);

impl FailPoints {
    /// Parses a comma-separated list; unknown names are an error so a typo in a test
    /// cannot silently disarm it.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for p in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !FAIL_POINTS.contains(&p) {
                return Err(format!(
                    "unknown fail point {p:?}; known: {}",
                    FAIL_POINTS.join(", ")
                ));
            }
            set.insert(p.to_string());
        }
        Ok(FailPoints(set))
    }

    /// Aborts the process if `point` is armed. Without the `failpoints` feature (every
    /// release build) nothing can be armed and this does nothing.
    pub(crate) fn hit(&self, point: &str) {
        #[cfg(feature = "failpoints")]
        if self.0.contains(point) {
            eprintln!("tessera: fail point {point} reached, aborting");
            std::process::abort();
        }
        #[cfg(not(feature = "failpoints"))]
        let _ = point;
    }

    /// The armed points from `TESSERA_FAILPOINTS`. A build without the `failpoints`
    /// feature refuses a non-empty variable rather than run with points it ignores.
    pub fn from_env() -> Result<Self, String> {
        let list = std::env::var("TESSERA_FAILPOINTS").unwrap_or_default();
        if cfg!(not(feature = "failpoints")) && !list.trim().is_empty() {
            return Err(
                "TESSERA_FAILPOINTS is set, but this build has no fail points \
                        (the `failpoints` feature is for crash tests only)"
                    .to_string(),
            );
        }
        Self::parse(&list)
    }
}
