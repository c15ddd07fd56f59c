//! Keeping the interception library installed for the claims that mount it: the
//! version installed under the node lock, reinstalled if removed, and old versions
//! collected once no claim references them.

use super::*;

impl DeviceState {
    /// Removes interception library versions that are neither the installed one nor
    /// referenced by a claim in the checkpoint.
    pub(super) fn gc_libraries(&self, cp: &Checkpoint) -> Result<Vec<String>, PrepareError> {
        let mut keep: BTreeSet<String> = cp
            .claims
            .values()
            .filter_map(|r| r.lib_version.clone())
            .collect();
        keep.extend(self.library());
        let removed = crate::prepare::library::gc(&self.cfg.run_dir, &keep)
            .map_err(PrepareError::LibraryGc)?;
        if !removed.is_empty() {
            info!(versions = ?removed, "removed interception library versions no claim uses");
        }
        Ok(removed)
    }

    /// The installed interception library version, if any.
    pub(super) fn library(&self) -> Option<String> {
        self.library
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Installs the interception library from `--interception-lib` (called under the
    /// node lock: at start-up, and again before a shared prepare if the version is
    /// missing, e.g. after a failed start-up install or another instance's clean-up).
    pub(super) fn install_library(&self) -> Result<Option<String>, PrepareError> {
        let Some(source) = &self.cfg.interception_source else {
            return Ok(None);
        };
        let lib = crate::prepare::library::install(&self.cfg.run_dir, source)?;
        info!(version = %lib.version, dir = %lib.dir.display(), "installed the interception library");
        *self.library.lock().unwrap_or_else(|p| p.into_inner()) = Some(lib.version.clone());
        Ok(Some(lib.version))
    }

    /// Makes sure a library version is installed and on disk before a spec mounts it.
    pub(super) fn ensure_library(&self) -> Result<(), PrepareError> {
        let present = self.library().is_some_and(|v| {
            use crate::prepare::library as lib;
            let dir = self.cfg.run_dir.join(lib::LIB_DIR).join(v);
            [
                lib::LIB_FILE,
                lib::FRONT_FILE,
                lib::SHIM_CUDA_FILE,
                lib::SHIM_NVML_FILE,
                lib::HOOK_FILE,
                lib::PRELOAD_FILE,
            ]
            .iter()
            .all(|f| dir.join(f).is_file())
        });
        if !present {
            self.install_library()?;
        }
        Ok(())
    }

    /// The CDI context with the current library version.
    pub(super) fn cdi_context(&self) -> CdiContext {
        CdiContext {
            interception: self.library(),
            ..self.cdi.clone()
        }
    }
}
