//! `tessera-cdi-hook pin`, run as a runtime runs a `createContainer` hook: in the
//! container's mount namespace (here `unshare -m`), after its mounts, with the OCI
//! state on stdin and the root file system named by the bundle's `config.json`.
//! What a tenant who is root in the container then tries is done with `mv`, as it
//! would be (the podman suite repeats it in a real container).

use testkit::interpose as support;

use std::fs;
use std::path::Path;
use std::process::Command;

use support::*;

/// The built hook (`tessera-cdi-hook`), beside the library in the same target directory.
fn hook() -> std::path::PathBuf {
    let h = built_library().with_file_name("tessera-cdi-hook");
    assert!(h.is_file(), "{} missing", h.display());
    h
}

/// A bundle whose root file system has what a shared claim's container has: the
/// front's `ld.so.preload` mounted over `/etc/ld.so.preload`, the library directory
/// at `/usr/local/tessera/lib`, a real driver file under `/usr/local/tessera/driver`.
fn bundle(dir: &Path, readonly: bool) {
    let root = dir.join("bundle/rootfs");
    for d in [
        "etc",
        "usr/bin",
        "usr/local/tessera/lib",
        "usr/local/tessera/driver",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("etc/ld.so.preload"), "").unwrap();
    fs::write(root.join("usr/local/tessera/driver/libcuda.real"), "").unwrap();
    fs::create_dir_all(dir.join("host/lib")).unwrap();
    fs::write(
        dir.join("host/preload"),
        "/usr/local/tessera/lib/front.so\n",
    )
    .unwrap();
    fs::write(dir.join("host/lib/front.so"), "front").unwrap();
    fs::write(dir.join("host/libcuda.so.1"), "driver").unwrap();
    fs::write(
        dir.join("bundle/config.json"),
        format!(r#"{{"ociVersion":"1.2.0","root":{{"path":"rootfs","readonly":{readonly}}}}}"#),
    )
    .unwrap();
}

/// Runs `script` in a new private mount namespace after the container-like mounts
/// and the hook; `$R` is the root file system. Returns (status, stdout+stderr).
fn in_container(dir: &Path, hook_args: &str, script: &str) -> (bool, String) {
    let d = dir.display();
    let h = hook().display().to_string();
    let full = format!(
        r#"set -u
R={d}/bundle/rootfs
mount --bind -o ro {d}/host/preload $R/etc/ld.so.preload
mount --bind -o ro {d}/host/lib $R/usr/local/tessera/lib
mount --bind -o ro {d}/host/libcuda.so.1 $R/usr/local/tessera/driver/libcuda.real
printf '{{"ociVersion":"1.2.0","id":"c","status":"creating","pid":%d,"bundle":"{d}/bundle","annotations":{{"a":"\\"bundle\\":\\"/\\""}}}}' $$ \
  | {h} {hook_args} || {{ echo "hook failed: $?"; exit 9; }}
{script}"#
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "bash", "-c", &full])
        .output()
        .expect("unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

const PIN: &str = "pin /etc /usr /usr/local /usr/local/tessera";

#[test]
#[ignore = "needs root (unshare -m)"]
fn after_the_hook_no_directory_above_tesseras_mounts_can_be_renamed() {
    if !require("after_the_hook_no_directory_above_tesseras_mounts_can_be_renamed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    bundle(dir.path(), false);
    let (ok, out) = in_container(
        dir.path(),
        PIN,
        r#"for d in etc usr usr/local usr/local/tessera; do
  if mv $R/$d $R/$d.moved 2>/dev/null; then echo "renamed $d"; else echo "refused $d"; fi
done
cat $R/etc/ld.so.preload
cat $R/usr/local/tessera/lib/front.so; echo
cat $R/usr/local/tessera/driver/libcuda.real; echo
# The image's own files stay the tenant's to change.
touch $R/etc/hosts && echo "etc writable"
"#,
    );
    println!("{out}");
    assert!(ok, "{out}");
    for d in ["etc", "usr", "usr/local", "usr/local/tessera"] {
        assert!(
            out.contains(&format!("refused {d}\n")),
            "{d} renamed:\n{out}"
        );
    }
    // The mounts below the pinned directories came along (a recursive bind).
    assert!(
        out.contains("/usr/local/tessera/lib/front.so\nfront\ndriver\n"),
        "{out}"
    );
    assert!(out.contains("etc writable"), "{out}");
}

#[test]
#[ignore = "needs root (unshare -m)"]
fn pinning_twice_changes_nothing_and_a_readonly_root_stays_readonly() {
    if !require("pinning_twice_changes_nothing_and_a_readonly_root_stays_readonly") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    bundle(dir.path(), true);
    let (ok, out) = in_container(
        dir.path(),
        PIN,
        &format!(
            r#"before=$(wc -l </proc/self/mountinfo)
printf '{{"bundle":"{}/bundle"}}' | {} {PIN} || echo "second run failed"
echo "mounts added by a second run: $(( $(wc -l </proc/self/mountinfo) - before ))"
touch $R/etc/x 2>/dev/null && echo "etc writable" || echo "etc read-only"
touch $R/usr/local/x 2>/dev/null && echo "usr/local writable" || echo "usr/local read-only"
"#,
            dir.path().display(),
            hook().display()
        ),
    );
    println!("{out}");
    assert!(ok, "{out}");
    assert!(out.contains("mounts added by a second run: 0"), "{out}");
    assert!(
        out.contains("etc read-only") && out.contains("usr/local read-only"),
        "{out}"
    );
}

#[test]
#[ignore = "needs root (unshare -m)"]
fn a_symlinked_directory_in_the_image_stops_the_container() {
    if !require("a_symlinked_directory_in_the_image_stops_the_container") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    bundle(dir.path(), false);
    // The image links /usr/local elsewhere: the tenant could swap the link later.
    let root = dir.path().join("bundle/rootfs");
    fs::rename(root.join("usr/local"), root.join("opt-local")).unwrap();
    std::os::unix::fs::symlink("../opt-local", root.join("usr/local")).unwrap();
    let (ok, out) = in_container(dir.path(), PIN, "echo started");
    println!("{out}");
    assert!(!ok && out.contains("hook failed: 1"), "{out}");
    assert!(
        out.contains("pinning /usr/local under") && out.contains("symbolic link"),
        "{out}"
    );
    assert!(!out.contains("started"), "{out}");
}

#[test]
#[ignore = "needs root (unshare -m)"]
fn a_malformed_state_or_config_stops_the_container() {
    if !require("a_malformed_state_or_config_stops_the_container") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    bundle(dir.path(), false);
    fs::write(dir.path().join("bundle/config.json"), r#"{"root":{}}"#).unwrap();
    let (ok, out) = in_container(dir.path(), PIN, "echo started");
    assert!(!ok && out.contains("no \"root.path\""), "{out}");
    let (ok, out) = in_container(dir.path(), "pin etc", "echo started");
    assert!(!ok && out.contains("not absolute"), "{out}");
}
