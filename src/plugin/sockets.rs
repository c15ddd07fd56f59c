//! The plugin's two Unix sockets: their names (the kubelet's and the Go helper's
//! conventions, rolling updates included) and a listener that replaces a socket a
//! crashed instance left.

use std::path::{Path, PathBuf};

use base64::Engine;
use sha2::{Digest, Sha256};
use tokio::net::UnixListener;

use super::{PluginError, PluginOptions};

/// `dra.sock`, or `dra-<podUID>.sock` with rolling updates.
pub fn dra_socket_path(opts: &PluginOptions) -> PathBuf {
    match &opts.rolling_update_pod_uid {
        Some(uid) => opts.paths.plugin_dir.join(format!("dra-{uid}.sock")),
        None => opts.paths.plugin_dir.join("dra.sock"),
    }
}

/// Maximum AF_UNIX path length the kubelet accepts.
const MAX_SOCKET_PATH: usize = 108;

/// `<driver>-reg.sock`; with rolling updates the first of the 1.37 helper's candidates
/// whose full path fits in 108 bytes: `<driver>-<podUID>-reg.sock`,
/// `<driver>-<b64url(sha256(uid))[:8 bytes]>-reg.sock`,
/// `dra-<b64url(sha256(driver "\0" uid))[:16 bytes]>-reg.sock` (base64url without
/// padding of the first 8 or 16 bytes of the digest).
pub fn registration_socket_path(dir: &Path, driver: &str, pod_uid: Option<&str>) -> PathBuf {
    let Some(uid) = pod_uid else {
        return dir.join(format!("{driver}-reg.sock"));
    };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let short = b64.encode(&Sha256::digest(uid.as_bytes())[..8]);
    let mut both = Vec::from(driver.as_bytes());
    both.push(0);
    both.extend_from_slice(uid.as_bytes());
    let shortest = b64.encode(&Sha256::digest(&both)[..16]);
    let candidates = [
        format!("{driver}-{uid}-reg.sock"),
        format!("{driver}-{short}-reg.sock"),
        format!("dra-{shortest}-reg.sock"),
    ];
    let fits = |name: &String| dir.join(name).as_os_str().len() <= MAX_SOCKET_PATH;
    let chosen = candidates
        .iter()
        .find(|c| fits(c))
        .unwrap_or(&candidates[2]);
    dir.join(chosen)
}

pub(super) fn listen(path: &Path) -> Result<UnixListener, PluginError> {
    let err = |source| PluginError::Listen {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by a crashed instance of ours would make bind fail.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    UnixListener::bind(path).map_err(err)
}
