//! The library's one way to speak: a line on the process's stderr. Every module logs
//! through [`log`], which cannot panic (a hook must never unwind into C).

/// Writes `tessera-cuda: <msg>` to stderr with one write(2), ignoring every error:
/// `eprintln!` panics when stderr is closed or a broken pipe, and a panic must never
/// unwind out of a hook.
pub fn log(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut buf = [0u8; 512];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cur, "tessera-cuda: {msg}");
    let mut n = (cur.position() as usize).min(buf.len() - 1);
    buf[n] = b'\n';
    n += 1;
    // SAFETY: write(2) from a local buffer to fd 2; the result is ignored on purpose.
    let _ = unsafe { libc::write(2, buf.as_ptr().cast(), n) };
}
