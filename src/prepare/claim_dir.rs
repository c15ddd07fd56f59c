//! One directory per claim under a root of the run dir (`claims/`, `metadata/`), made
//! and removed so that a crash never leaves half of one where a container could mount
//! it:
//!
//! * create: fill `<root>/.<uid>.tmp/`, fsync it, rename it to `<root>/<uid>`, fsync
//!   the root (a retried prepare replaces the directory);
//! * remove: rename `<root>/<uid>` to `<root>/.<uid>.del`, fsync the root, then delete;
//! * sweep (start-up): delete every entry that is not a known claim's directory, so
//!   half-made (`.tmp`), half-removed (`.del`) and orphaned ones go.
//!
//! The checkpoint records a directory before it is created, so `known` is complete.
//! The per-claim files (`claim_files`) and the device metadata files
//! (`device_metadata`) both live in such directories; each maps [`DirError`] into its
//! own error.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A filesystem call failed; `what` says which step, `path` where.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}", path.display())]
pub struct DirError {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DirError + 'a {
    move |source| DirError {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn remove_tree(p: &Path) -> std::io::Result<()> {
    match fs::remove_dir_all(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Creates `<root>/<uid>` (mode 0755: containers may run as any user) atomically with
/// what `fill` writes into the directory it is given; `what` names the contents in an
/// error. Whatever was there before is replaced; on failure nothing new remains.
pub fn create(
    root: &Path,
    uid: &str,
    what: &'static str,
    fill: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<PathBuf, DirError> {
    fs::create_dir_all(root).map_err(err("creating", root))?;
    let tmp = root.join(format!(".{uid}.tmp"));
    let dst = root.join(uid);
    remove_tree(&tmp).map_err(err("removing", &tmp))?;
    remove(root, uid)?;
    let result = (|| {
        fs::create_dir(&tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fill(&tmp)?;
        tessera_cdi::atomic::sync_dir(&tmp)?;
        fs::rename(&tmp, &dst)?;
        tessera_cdi::atomic::sync_dir(root)
    })();
    if let Err(e) = result {
        let _ = remove_tree(&tmp);
        return Err(err(what, &tmp)(e));
    }
    Ok(dst)
}

/// Removes `<root>/<uid>` (idempotent): renamed aside first, so that a crash leaves
/// either the whole directory or a `.del` that [`sweep`] deletes.
pub fn remove(root: &Path, uid: &str) -> Result<(), DirError> {
    let dir = root.join(uid);
    let del = root.join(format!(".{uid}.del"));
    match fs::rename(&dir, &del) {
        Ok(()) => tessera_cdi::atomic::sync_dir(root).map_err(err("syncing", root))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("removing", &dir)(e)),
    }
    remove_tree(&del).map_err(err("removing", &del))
}

/// Removes every entry of `root` that is not the directory of a claim in `known`.
/// Returns the names it removed.
pub fn sweep(root: &Path, known: &BTreeSet<String>) -> Result<Vec<String>, DirError> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(err("listing", root)(e)),
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if known.contains(&name) {
            continue;
        }
        let p = e.path();
        let r = if p.is_dir() {
            remove_tree(&p)
        } else {
            fs::remove_file(&p)
        };
        r.map_err(err("removing", &p))?;
        removed.push(name);
    }
    if !removed.is_empty() {
        tessera_cdi::atomic::sync_dir(root).map_err(err("syncing", root))?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fill_leaves_neither_the_old_nor_a_half_made_directory() {
        let run = tempfile::tempdir().unwrap();
        let root = run.path().join("r");
        create(&root, "u", "writing", |d| fs::write(d.join("a"), b"1")).unwrap();
        let e = create(&root, "u", "writing", |d| {
            fs::write(d.join("a"), b"2")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(e.what, "writing");
        let left: Vec<_> = fs::read_dir(&root).unwrap().flatten().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn create_replaces_remove_is_idempotent_and_sweep_keeps_only_known_claims() {
        let run = tempfile::tempdir().unwrap();
        let root = run.path().join("r");
        create(&root, "u", "writing", |d| fs::write(d.join("a"), b"1")).unwrap();
        let dst = create(&root, "u", "writing", |d| fs::write(d.join("b"), b"2")).unwrap();
        assert!(!dst.join("a").exists() && dst.join("b").exists());
        let mode = fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        remove(&root, "u").unwrap();
        remove(&root, "u").unwrap();
        assert!(!dst.exists());
        for name in ["keep", ".half.tmp", ".gone.del", "orphan"] {
            fs::create_dir_all(root.join(name)).unwrap();
        }
        fs::write(root.join("stray-file"), b"").unwrap();
        let mut swept = sweep(&root, &BTreeSet::from(["keep".to_string()])).unwrap();
        swept.sort();
        assert_eq!(swept, [".gone.del", ".half.tmp", "orphan", "stray-file"]);
        assert!(root.join("keep").is_dir());
        assert_eq!(
            sweep(&run.path().join("none"), &BTreeSet::new())
                .unwrap()
                .len(),
            0
        );
    }
}
