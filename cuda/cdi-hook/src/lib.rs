//! `tessera-cdi-hook`: the OCI `createContainer` hook a shared claim's CDI spec names.
//!
//! `tessera-cdi-hook pin DIR...` makes each DIR of the container (`/etc`, `/usr`,
//! `/usr/local`, `/usr/local/tessera`) a mount point by bind-mounting it onto itself,
//! recursively. The kernel refuses to rename a mount point (`EBUSY`), and a container
//! without `CAP_SYS_ADMIN` can neither unmount nor move it, so a tenant who is root in
//! its container can no longer rename `/etc` (which makes ld.so skip
//! `/etc/ld.so.preload`, and with it Tessera's front library) or a directory above the
//! front or the driver's real files. Without this, renaming `/etc` and preloading the
//! real driver file by path bypassed the budget with configuration alone
//! (docs/security.md, threat model).
//!
//! The runtime runs the hook in the container's mount namespace after its mounts and
//! before `pivot_root`, with the OCI state on stdin; the root file system is
//! `root.path` of the bundle's `config.json`. Paths are walked component by component
//! without following symbolic links: a symlinked DIR in the image could be swapped by
//! the tenant afterwards, so it is refused, and the container does not start (fail
//! closed). With `root.readonly`, the new mounts are made read-only too, since the
//! runtime remounts only `/` read-only afterwards.
//!
//! The executable is `src/main.rs`; the plugin installs it from beside the
//! interception library into its run directory (the glibc 2.17 release build, from
//! `cargo zigbuild`, runs on old hosts). std only.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The hook's entry point: returns the process exit code, having printed why on
/// stderr when it is not 0.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut state = Vec::new();
    let read = std::io::stdin().take(MAX_STATE + 1).read_to_end(&mut state);
    let result = read
        .map_err(|e| format!("reading the OCI state from stdin: {e}"))
        .and_then(|_| run(&args, &state));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tessera-cdi-hook: {e}");
            1
        }
    }
}

/// The OCI state is a few hundred bytes plus annotations; config.json can be large
/// (environment, mounts), but not this large.
const MAX_STATE: u64 = 1 << 20;
const MAX_CONFIG: u64 = 64 << 20;

/// `args` without the program name; `state` is the OCI state JSON.
pub fn run(args: &[String], state: &[u8]) -> Result<(), String> {
    let dirs = match args.split_first() {
        Some((cmd, dirs)) if cmd == "pin" => parse_dirs(dirs)?,
        _ => return Err(format!("usage: tessera-cdi-hook pin DIR... (got {args:?})")),
    };
    let bundle = bundle_of(state)?;
    let config = read_limited(&bundle.join("config.json"), MAX_CONFIG)?;
    let root = root_of(&bundle, &config)?;
    let root_fd = open_dir(&root.path)?;
    for dir in &dirs {
        pin(&root_fd, dir, root.readonly)
            .map_err(|e| format!("pinning {dir} under {}: {e}", root.path.display()))?;
    }
    Ok(())
}

/// The directories to pin, in order: absolute, normal (no `.`, `..` or empty
/// components), not `/` itself, each after its ancestors among them (so an outer
/// mount never hides an inner one made before it).
pub fn parse_dirs(dirs: &[String]) -> Result<Vec<String>, String> {
    if dirs.is_empty() {
        return Err("pin: no directory given".into());
    }
    for (i, d) in dirs.iter().enumerate() {
        let rest = d
            .strip_prefix('/')
            .ok_or_else(|| format!("pin: {d:?} is not absolute"))?;
        if rest.is_empty()
            || rest
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!("pin: {d:?} is not a normal path below /"));
        }
        for later in &dirs[i + 1..] {
            if d.starts_with(&format!("{later}/")) {
                return Err(format!("pin: {later} must come before {d}"));
            }
        }
    }
    Ok(dirs.to_vec())
}

/// `bundle` from the OCI state.
pub fn bundle_of(state: &[u8]) -> Result<PathBuf, String> {
    if state.len() as u64 > MAX_STATE {
        return Err("the OCI state on stdin is over 1 MiB".into());
    }
    let v = json::parse(state).map_err(|e| format!("the OCI state on stdin: {e}"))?;
    match v.get("bundle") {
        Some(json::Value::Str(b)) if b.starts_with('/') => Ok(PathBuf::from(b)),
        _ => Err("the OCI state on stdin has no absolute \"bundle\"".into()),
    }
}

/// The container's root file system, from the bundle's config.json.
#[derive(Debug, PartialEq, Eq)]
pub struct Root {
    pub path: PathBuf,
    pub readonly: bool,
}

/// `root.path` (relative to the bundle unless absolute) and `root.readonly`.
pub fn root_of(bundle: &Path, config: &[u8]) -> Result<Root, String> {
    let v = json::parse(config).map_err(|e| format!("{}/config.json: {e}", bundle.display()))?;
    let root = v
        .get("root")
        .ok_or_else(|| format!("{}/config.json has no \"root\"", bundle.display()))?;
    let path = match root.get("path") {
        Some(json::Value::Str(p)) if !p.is_empty() => bundle.join(p),
        _ => {
            return Err(format!(
                "{}/config.json has no \"root.path\"",
                bundle.display()
            ));
        }
    };
    let readonly = matches!(root.get("readonly"), Some(json::Value::Bool(true)));
    Ok(Root { path, readonly })
}

fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut buf))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if buf.len() as u64 > max {
        return Err(format!("{}: over {max} bytes", path.display()));
    }
    Ok(buf)
}

mod sys {
    use std::os::raw::{c_char, c_int, c_ulong, c_void};

    pub const O_PATH: c_int = 0o10000000;
    pub const O_DIRECTORY: c_int = 0o200000;
    pub const O_NOFOLLOW: c_int = 0o400000;
    pub const O_CLOEXEC: c_int = 0o2000000;
    pub const MS_RDONLY: c_ulong = 1;
    pub const MS_NOSUID: c_ulong = 2;
    pub const MS_NODEV: c_ulong = 4;
    pub const MS_NOEXEC: c_ulong = 8;
    pub const MS_REMOUNT: c_ulong = 32;
    pub const MS_NOATIME: c_ulong = 1024;
    pub const MS_NODIRATIME: c_ulong = 2048;
    pub const MS_BIND: c_ulong = 4096;
    pub const MS_REC: c_ulong = 16384;
    pub const MS_RELATIME: c_ulong = 1 << 21;
    pub const ST_NOSUID: c_ulong = 2;
    pub const ST_NODEV: c_ulong = 4;
    pub const ST_NOEXEC: c_ulong = 8;
    pub const ST_NOATIME: c_ulong = 1024;
    pub const ST_NODIRATIME: c_ulong = 2048;
    pub const ST_RELATIME: c_ulong = 4096;

    /// glibc's `struct statvfs` on 64-bit Linux.
    #[repr(C)]
    pub struct Statvfs {
        pub f_bsize: c_ulong,
        pub f_frsize: c_ulong,
        pub f_blocks: u64,
        pub f_bfree: u64,
        pub f_bavail: u64,
        pub f_files: u64,
        pub f_ffree: u64,
        pub f_favail: u64,
        pub f_fsid: c_ulong,
        pub f_flag: c_ulong,
        pub f_namemax: c_ulong,
        pub f_spare: [c_int; 6],
    }

    unsafe extern "C" {
        pub fn openat(dirfd: c_int, path: *const c_char, flags: c_int, ...) -> c_int;
        pub fn mount(
            source: *const c_char,
            target: *const c_char,
            fstype: *const c_char,
            flags: c_ulong,
            data: *const c_void,
        ) -> c_int;
        pub fn fstatvfs(fd: c_int, buf: *mut Statvfs) -> c_int;
    }
}

fn cstr(s: &OsStr) -> Result<CString, String> {
    CString::new(s.as_bytes()).map_err(|_| format!("{s:?} holds a NUL byte"))
}

fn open_dir(path: &Path) -> Result<OwnedFd, String> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: `c` is a valid NUL-terminated string; the flags create nothing.
    let fd = unsafe {
        sys::openat(
            -100, // AT_FDCWD
            c.as_ptr(),
            sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!(
            "{}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` in `dir` as a directory without following a symbolic link.
fn open_child(dir: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    let c = CString::new(name).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: `dir` is an open descriptor and `c` a valid string; O_PATH creates nothing.
    let fd = unsafe {
        sys::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            sys::O_PATH | sys::O_DIRECTORY | sys::O_NOFOLLOW | sys::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as in `open_dir`.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The mount an open descriptor is on (`mnt_id` in /proc/self/fdinfo).
fn mnt_id(fd: RawFd) -> Result<u64, String> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .map_err(|e| format!("/proc/self/fdinfo/{fd}: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("/proc/self/fdinfo/{fd} has no mnt_id"))
}

/// Walks `dir` (absolute, normal) from `root` without following symbolic links;
/// returns the directory and its parent.
fn walk(root: &OwnedFd, dir: &str) -> Result<(OwnedFd, OwnedFd), String> {
    let mut parent = root.try_clone().map_err(|e| e.to_string())?;
    let mut comps = dir.trim_start_matches('/').split('/').peekable();
    loop {
        let Some(name) = comps.next() else {
            return Err("empty path".into());
        };
        let child = open_child(&parent, name).map_err(|e| match e.raw_os_error() {
            Some(40) | Some(20) => format!(
                "{name} is not a directory (a symbolic link in the image?): the path must not change after start-up, so it is refused"
            ),
            _ => format!("{name}: {e}"),
        })?;
        if comps.peek().is_none() {
            return Ok((child, parent));
        }
        parent = child;
    }
}

/// Makes `dir` a mount point: a recursive bind mount onto itself (submounts, such as
/// the CDI file mounts below it, come along), read-only if the root is. A directory
/// that already is a mount point is left as it is.
fn pin(root: &OwnedFd, dir: &str, readonly: bool) -> Result<(), String> {
    let (fd, parent) = walk(root, dir)?;
    if mnt_id(fd.as_raw_fd())? != mnt_id(parent.as_raw_fd())? {
        return Ok(());
    }
    let at =
        CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| e.to_string())?;
    // SAFETY: both paths are valid strings; a bind mount reads no `data`.
    let r = unsafe {
        sys::mount(
            at.as_ptr(),
            at.as_ptr(),
            std::ptr::null(),
            sys::MS_BIND | sys::MS_REC,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!("bind mount: {}", std::io::Error::last_os_error()));
    }
    // The descriptor still names the directory under the new mount; reopen it to see
    // the mount.
    let (now, parent) = walk(root, dir)?;
    if mnt_id(now.as_raw_fd())? == mnt_id(parent.as_raw_fd())? {
        return Err("still not a mount point after the bind mount".into());
    }
    if readonly {
        remount_readonly(&now)?;
    }
    Ok(())
}

/// Remounts the bind mount at `fd` read-only, keeping its other flags (a remount that
/// drops a locked flag is refused in a user namespace).
fn remount_readonly(fd: &OwnedFd) -> Result<(), String> {
    // SAFETY: all-zero is a valid `Statvfs`; fstatvfs fills it.
    let mut st: sys::Statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid out-pointer.
    if unsafe { sys::fstatvfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("fstatvfs: {}", std::io::Error::last_os_error()));
    }
    let mut flags = sys::MS_REMOUNT | sys::MS_BIND | sys::MS_RDONLY;
    for (st_flag, ms_flag) in [
        (sys::ST_NOSUID, sys::MS_NOSUID),
        (sys::ST_NODEV, sys::MS_NODEV),
        (sys::ST_NOEXEC, sys::MS_NOEXEC),
        (sys::ST_NOATIME, sys::MS_NOATIME),
        (sys::ST_NODIRATIME, sys::MS_NODIRATIME),
        (sys::ST_RELATIME, sys::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    let at =
        CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| e.to_string())?;
    // SAFETY: valid strings; a remount reads no `data`.
    let r = unsafe {
        sys::mount(
            std::ptr::null(),
            at.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!(
            "read-only remount: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// A strict JSON reader for the two documents the hook reads (RFC 8259; duplicate
/// keys: the last wins, as in Go's encoding/json, which wrote them). Both come from
/// the runtime, but hold strings the tenant chose (annotations, environment), so
/// nothing is found by searching the text.
pub mod json {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Num,
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
    }

    impl Value {
        /// An object's member (the last of that name).
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Obj(m) => m.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
    }

    const MAX_DEPTH: usize = 128;

    pub fn parse(text: &[u8]) -> Result<Value, String> {
        let mut p = Parser { s: text, i: 0 };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing data at byte {}", p.i));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn err<T>(&self, what: &str) -> Result<T, String> {
            Err(format!("{what} at byte {}", self.i))
        }
        fn ws(&mut self) {
            while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }
        fn lit(&mut self, word: &[u8], v: Value) -> Result<Value, String> {
            if self.s[self.i..].starts_with(word) {
                self.i += word.len();
                Ok(v)
            } else {
                self.err("invalid literal")
            }
        }
        fn value(&mut self, depth: usize) -> Result<Value, String> {
            if depth > MAX_DEPTH {
                return self.err("nested too deeply");
            }
            match self.s.get(self.i) {
                Some(b'{') => self.object(depth),
                Some(b'[') => self.array(depth),
                Some(b'"') => self.string().map(Value::Str),
                Some(b't') => self.lit(b"true", Value::Bool(true)),
                Some(b'f') => self.lit(b"false", Value::Bool(false)),
                Some(b'n') => self.lit(b"null", Value::Null),
                Some(b'-' | b'0'..=b'9') => self.number(),
                Some(_) => self.err("unexpected character"),
                None => self.err("unexpected end"),
            }
        }
        fn object(&mut self, depth: usize) -> Result<Value, String> {
            self.i += 1;
            let mut members = Vec::new();
            self.ws();
            if self.s.get(self.i) == Some(&b'}') {
                self.i += 1;
                return Ok(Value::Obj(members));
            }
            loop {
                self.ws();
                if self.s.get(self.i) != Some(&b'"') {
                    return self.err("expected a member name");
                }
                let k = self.string()?;
                self.ws();
                if self.s.get(self.i) != Some(&b':') {
                    return self.err("expected ':'");
                }
                self.i += 1;
                self.ws();
                let v = self.value(depth + 1)?;
                members.push((k, v));
                self.ws();
                match self.s.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        return Ok(Value::Obj(members));
                    }
                    _ => return self.err("expected ',' or '}'"),
                }
            }
        }
        fn array(&mut self, depth: usize) -> Result<Value, String> {
            self.i += 1;
            let mut items = Vec::new();
            self.ws();
            if self.s.get(self.i) == Some(&b']') {
                self.i += 1;
                return Ok(Value::Arr(items));
            }
            loop {
                self.ws();
                items.push(self.value(depth + 1)?);
                self.ws();
                match self.s.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        return Ok(Value::Arr(items));
                    }
                    _ => return self.err("expected ',' or ']'"),
                }
            }
        }
        fn number(&mut self) -> Result<Value, String> {
            let start = self.i;
            if self.s.get(self.i) == Some(&b'-') {
                self.i += 1;
            }
            let digits = |p: &mut Self| {
                let d = p.i;
                while matches!(p.s.get(p.i), Some(b'0'..=b'9')) {
                    p.i += 1;
                }
                p.i - d
            };
            match self.s.get(self.i) {
                Some(b'0') => self.i += 1,
                Some(b'1'..=b'9') => {
                    digits(self);
                }
                _ => return self.err("invalid number"),
            }
            if self.s.get(self.i) == Some(&b'.') {
                self.i += 1;
                if digits(self) == 0 {
                    return self.err("invalid number");
                }
            }
            if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
                self.i += 1;
                if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                    self.i += 1;
                }
                if digits(self) == 0 {
                    return self.err("invalid number");
                }
            }
            debug_assert!(self.i > start);
            Ok(Value::Num)
        }
        fn hex4(&mut self) -> Result<u32, String> {
            let h = self
                .s
                .get(self.i..self.i + 4)
                .ok_or("truncated \\u escape")?;
            let h = std::str::from_utf8(h).map_err(|_| "invalid \\u escape")?;
            let v = u32::from_str_radix(h, 16).map_err(|_| format!("invalid \\u escape {h:?}"))?;
            self.i += 4;
            Ok(v)
        }
        fn string(&mut self) -> Result<String, String> {
            self.i += 1;
            let mut out = Vec::new();
            loop {
                match self.s.get(self.i) {
                    None => return self.err("unterminated string"),
                    Some(b'"') => {
                        self.i += 1;
                        return String::from_utf8(out).map_err(|_| "invalid UTF-8".into());
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = match self.s.get(self.i) {
                            Some(b'"') => '"',
                            Some(b'\\') => '\\',
                            Some(b'/') => '/',
                            Some(b'b') => '\u{8}',
                            Some(b'f') => '\u{c}',
                            Some(b'n') => '\n',
                            Some(b'r') => '\r',
                            Some(b't') => '\t',
                            Some(b'u') => {
                                self.i += 1;
                                let hi = self.hex4()?;
                                let code = if (0xd800..0xdc00).contains(&hi) {
                                    if !self.s[self.i..].starts_with(b"\\u") {
                                        return self.err("lone surrogate");
                                    }
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if !(0xdc00..0xe000).contains(&lo) {
                                        return self.err("invalid surrogate pair");
                                    }
                                    0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                                } else {
                                    hi
                                };
                                let ch = char::from_u32(code)
                                    .ok_or_else(|| format!("invalid code point {code:#x}"))?;
                                let mut b = [0; 4];
                                out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                                continue;
                            }
                            _ => return self.err("invalid escape"),
                        };
                        let mut b = [0; 4];
                        out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                        self.i += 1;
                    }
                    Some(&c) if c < 0x20 => return self.err("control character in string"),
                    Some(&c) => {
                        out.push(c);
                        self.i += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_bundle_is_read_from_the_state_not_found_in_its_text() {
        let state = br#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":42,
            "annotations":{"x":"\"bundle\":\"/evil\""},"bundle":"/run/containerd/b/c1"}"#;
        assert_eq!(
            bundle_of(state).unwrap(),
            PathBuf::from("/run/containerd/b/c1")
        );
        // A member repeated: the last wins, as Go decodes it.
        let twice = br#"{"bundle":"/a","bundle":"/b"}"#;
        assert_eq!(bundle_of(twice).unwrap(), PathBuf::from("/b"));
    }

    #[test]
    fn a_state_without_an_absolute_bundle_is_refused() {
        for bad in [
            &br#"{"id":"c1"}"#[..],
            br#"{"bundle":"relative/dir"}"#,
            br#"{"bundle":1}"#,
            br#"["bundle","/x"]"#,
            b"",
            br#"{"bundle":"/x""#,
        ] {
            assert!(bundle_of(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_root_is_relative_to_the_bundle_unless_absolute() {
        let b = Path::new("/b");
        assert_eq!(
            root_of(b, br#"{"root":{"path":"rootfs"}}"#).unwrap(),
            Root {
                path: "/b/rootfs".into(),
                readonly: false
            }
        );
        assert_eq!(
            root_of(
                b,
                br#"{"root":{"path":"/var/lib/r","readonly":true},"process":{"env":["A=1"]}}"#
            )
            .unwrap(),
            Root {
                path: "/var/lib/r".into(),
                readonly: true
            }
        );
        assert!(root_of(b, br#"{"process":{}}"#).is_err());
        assert!(root_of(b, br#"{"root":{"path":""}}"#).is_err());
    }

    #[test]
    fn directories_must_be_absolute_normal_and_outer_first() {
        let ok = strings(&["/etc", "/usr", "/usr/local", "/usr/local/tessera"]);
        assert_eq!(parse_dirs(&ok).unwrap(), ok);
        for bad in [
            vec![],
            strings(&["etc"]),
            strings(&["/"]),
            strings(&["/usr/../etc"]),
            strings(&["/usr//local"]),
            strings(&["/usr/local/"]),
            strings(&["/usr/local", "/usr"]),
        ] {
            assert!(parse_dirs(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_json_reader_decodes_escapes_and_refuses_malformed_text() {
        let v =
            json::parse(br#" {"a":[1,-2.5e3,true,false,null,{}],"s":"\u00e9\ud83d\ude00\n\/"} "#)
                .unwrap();
        assert_eq!(v.get("s"), Some(&json::Value::Str("é😀\n/".into())));
        for bad in [
            &b"{"[..],
            b"{\"a\":}",
            b"[1,]",
            b"01",
            b"\"\\ud800\"",
            b"\"a\nb\"",
            b"{} {}",
            b"tru",
            b"1.",
        ] {
            assert!(
                json::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(json::parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn run_refuses_an_unknown_command_before_reading_anything() {
        let e = run(&strings(&["unpin", "/etc"]), b"{}").unwrap_err();
        assert!(e.contains("usage"), "{e}");
    }
}
