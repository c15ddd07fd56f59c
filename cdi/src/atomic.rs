//! Crash-safe file replacement: write a temp file, fsync it, rename it over the
//! target, fsync the directory. A reader (or a restarted process) sees either the old
//! content or the new one, never a torn file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Atomically replaces `dir/file_name` with `bytes`, staging through `dir/temp_name`.
///
/// `temp_name` must be in the same directory (rename is only atomic within one file
/// system) and must not look like a file that readers load: CDI runtimes load every
/// `*.json`/`*.yaml` in their directories, so callers pass names like `.tessera-<uid>.tmp`.
/// On error the temp file is removed and the target is unchanged.
pub fn write_atomic(dir: &Path, file_name: &str, temp_name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(temp_name);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, dir.join(file_name))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes `dir/file_name` durably. A missing file is not an error (removal is
/// idempotent).
pub fn remove_durable(dir: &Path, file_name: &str) -> io::Result<()> {
    match fs::remove_file(dir.join(file_name)) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// fsyncs a directory so that a rename or unlink in it survives a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A successful write leaves the new content and no temp file behind.
    #[test]
    fn write_atomic_replaces_content_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("tessera-atomic-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        write_atomic(&dir, "f.json", ".f.tmp", b"one").unwrap();
        write_atomic(&dir, "f.json", ".f.tmp", b"two").unwrap();
        assert_eq!(fs::read(dir.join("f.json")).unwrap(), b"two");
        assert!(!dir.join(".f.tmp").exists());
        remove_durable(&dir, "f.json").unwrap();
        remove_durable(&dir, "f.json").unwrap();
        assert!(!dir.join("f.json").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A failed write (target directory missing) reports the error.
    #[test]
    fn write_atomic_into_missing_dir_fails() {
        let dir = Path::new("/nonexistent/tessera-atomic");
        assert!(write_atomic(dir, "f", ".f.tmp", b"x").is_err());
    }
}
