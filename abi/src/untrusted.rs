//! Reading a file a tenant can write, as the plugin must: the region is mapped
//! read-write in every container of its claim, so its contents, its size and (on a
//! host path the plugin does not own) even its kind are hostile input.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::AbiError;

/// Reads at most `max` bytes of the regular file at `path`, and the open file (so that
/// lock queries look at the very file that was read):
///
/// * opened with `O_NONBLOCK` and `O_NOFOLLOW`: a FIFO put in the file's place blocks
///   neither the open nor a read, and a symlink is refused;
/// * refused unless a regular file of at most `max` bytes (a tenant can `ftruncate`
///   its region to a terabyte, sparse; `std::fs::read` would try to allocate it);
/// * read with `read(2)` into a buffer, never through a mapping that a tenant could
///   shrink under the reader (SIGBUS), and refused if it grew past `max` meanwhile.
///
/// A writer racing the read can leave a mix of old and new bytes: the parsers check
/// every field against the buffer they are given, so such a buffer parses or is
/// refused, and the plugin's caller treats a refusal as "no figures for this claim".
pub fn read_bounded(path: &Path, max: u64) -> Result<(File, Vec<u8>), AbiError> {
    let fail = |what: String| AbiError::Unreadable(format!("{}: {what}", path.display()));
    let f = open_regular(path)?;
    let md = f.metadata().map_err(|e| fail(e.to_string()))?;
    if md.len() > max {
        return Err(fail(format!(
            "{} bytes, more than the {max} read",
            md.len()
        )));
    }
    let mut b = Vec::with_capacity(md.len() as usize);
    (&f).take(max.saturating_add(1))
        .read_to_end(&mut b)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if b.len() as u64 > max {
        return Err(fail(format!("grew past the {max} bytes read")));
    }
    Ok((f, b))
}

/// Opens `path` for reading as a file others write must be opened: `O_NONBLOCK` (a
/// FIFO in its place blocks neither the open nor a read), `O_NOFOLLOW` (a symlink is
/// refused), `O_NOCTTY`; then refused unless a regular file.
pub fn open_regular(path: &Path) -> Result<File, AbiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |what: String| AbiError::Unreadable(format!("{}: {what}", path.display()));
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| fail(format!("cannot open: {e}")))?;
    let md = f.metadata().map_err(|e| fail(e.to_string()))?;
    if !md.is_file() {
        return Err(fail("not a regular file".into()));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_within_the_bound_is_read_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("region");
        std::fs::write(&p, [7u8; 100]).unwrap();
        let (_, b) = read_bounded(&p, 100).unwrap();
        assert_eq!(b, vec![7u8; 100]);
    }

    /// A sparse terabyte is refused from its size, without reading or allocating it.
    #[test]
    fn a_huge_sparse_file_is_refused_without_allocating_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("region");
        File::create(&p).unwrap().set_len(1 << 40).unwrap();
        let e = read_bounded(&p, 1 << 20).unwrap_err().to_string();
        assert!(
            e.contains("1099511627776 bytes, more than the 1048576 read"),
            "{e}"
        );
    }

    /// A FIFO in the file's place: refused at once (no writer ever comes).
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("region");
        // coreutils' mkfifo: libc's would need `unsafe` in this crate.
        let ok = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap();
        assert!(ok.success(), "mkfifo {}", p.display());
        let e = read_bounded(&p, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    /// The plugin's bound leaves room above every region it creates.
    #[test]
    fn the_region_bound_is_far_above_the_largest_region_created() {
        use crate::region::{DEFAULT_SLOTS, Layout, MAX_READ};
        let largest = Layout::current(crate::MAX_GPUS, DEFAULT_SLOTS)
            .unwrap()
            .file_size;
        assert!(4 * largest as u64 <= MAX_READ, "{largest} bytes");
    }

    #[test]
    fn a_symlink_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere");
        std::fs::write(&target, b"x").unwrap();
        let p = d.path().join("region");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = read_bounded(&p, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("cannot open"), "{e}");
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let e = read_bounded(Path::new("/nonexistent/region"), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/region: cannot open"), "{e}");
    }
}
