//! Generates the cuGetProcAddress variant table from `data/gpa-variants.tsv` (itself
//! extracted from the facts' Part B4.1): one `Variant` per exported symbol.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=RUSTC_LINKER");
    let zig = std::env::var("RUSTC_LINKER").is_ok_and(|l| l.contains("zig"));
    // No C start files (crti/crtn, crtbeginS/crtendS): their `_init`, `_fini`,
    // `frame_dummy` and `__do_global_dtors_aux` would run at load and at exit in every
    // process the library is preloaded into, paging in text it otherwise never touches
    // (about 20 µs of each `/bin/true` here). The library needs none of them: it has no
    // C++ constructors, the unwinder finds its frames through PT_GNU_EH_FRAME, and the
    // linker defines `__dso_handle` itself (at the image base): rustc's bundled
    // rust-lld for the plain build, zig's linker for the release one. (GNU ld would
    // not; glibc's weak references would then pass NULL, which still works for a
    // library that is never unloaded.)
    println!("cargo::rustc-cdylib-link-arg=-nostartfiles");
    println!("cargo::rustc-check-cfg=cfg(tessera_glibc_shims)");
    if zig {
        // The glibc 2.17 release build: libdl and libpthread functions are looked up
        // at first use instead of NEEDED (src/loader/glibc_shims.rs).
        println!("cargo::rustc-cfg=tessera_glibc_shims");
    } else {
        static_unwinder();
        // The library's references to its own exported functions (the hooks, whose
        // addresses it hands out) bind at link time: ld.so then resolves ~45 fewer
        // symbols in every process it is preloaded into. (zig's linker driver does
        // not take the flag.)
        println!("cargo::rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    }
    front_library();
    cdi_hook();
    let src = "data/gpa-variants.tsv";
    println!("cargo::rerun-if-changed={src}");
    let text = std::fs::read_to_string(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    // The names go into one string and the rows hold offsets into it: the table then
    // needs no relocation (with `&str` fields, ld.so would patch ~300 pointers in
    // every process the library is preloaded into, on pages it must then copy).
    let mut names = String::new();
    let mut name = |s: &str| -> String {
        let off = names.find(s).unwrap_or_else(|| {
            names.push_str(s);
            names.len() - s.len()
        });
        assert!(off + s.len() <= usize::from(u16::MAX) && s.len() <= usize::from(u8::MAX));
        format!("Name({off}, {})", s.len())
    };
    let mut rows = String::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        assert!(
            f.len() == 4,
            "{src}:{}: expected 4 tab-separated fields",
            n + 1
        );
        let introduced: u32 = f[1]
            .parse()
            .unwrap_or_else(|_| panic!("{src}:{}: bad version {:?}", n + 1, f[1]));
        let of = if f[3] == "-" {
            "None".to_string()
        } else {
            format!("Some({})", name(f[3]))
        };
        let (base, symbol) = (name(f[0]), name(f[2]));
        writeln!(
            rows,
            "    Variant {{ base: {base}, introduced: {introduced}, symbol: {symbol}, per_thread_of: {of} }},",
        )
        .ok();
    }
    let out =
        format!("const NAMES: &str = {names:?};\npub static VARIANTS: &[Variant] = &[\n{rows}];\n");
    let dst = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("gpa_variants.rs");
    std::fs::write(&dst, out).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
}

/// Links the unwinder statically, as the zig release build does: std names
/// `-lgcc_s`, which makes `libgcc_s.so.1` NEEDED, and ld.so then loads a second
/// library into every process of the container (about half of the library's start-up
/// cost) and silently skips the preload in images without it. A linker script named
/// `libgcc_s.so`, found first on the search path, points `-lgcc_s` at gcc's
/// `libgcc_eh.a` (PIC on x86-64, as `-static-libgcc` uses it); its symbols stay local
/// to the library, whose exports are only its `#[no_mangle]` hooks. Skipped for zig
/// (its own unwinder) and when gcc has no `libgcc_eh.a`.
fn static_unwinder() {
    let target_ok = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !target_ok {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let eh = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || !eh.starts_with('/') || !std::path::Path::new(&eh).exists() {
        return;
    }
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("static-unwind");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    std::fs::write(dir.join("libgcc_s.so"), format!("INPUT({eh})\n"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    println!("cargo::rustc-link-search=native={}", dir.display());
}

/// Builds the front library (`front/lib.rs`, `libtessera_preload.so`) and its two
/// soname shims (the same file with `--cfg tessera_shim`: Tessera's `libcuda.so.1` and
/// `libnvidia-ml.so.1`, each NEEDing the real library at its fixed container path)
/// with the same rustc, target and linker, and puts them beside this package's own
/// library, where the plugin and the tests look for them. Its package
/// (`tessera-front`, a workspace member) is only an rlib, for `cargo check` and
/// clippy: a library without std must be built with `-C panic=abort`, which cargo sets
/// per profile for the whole workspace only.
fn front_library() {
    for f in [
        "front/lib.rs",
        "src/loader/elf_symbols.rs",
        "src/loader/hook_names.rs",
    ] {
        println!("cargo::rerun-if-changed={f}");
    }
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        // Its stubs are x86-64 assembly. Without it the plugin refuses shared claims
        // (it installs the library only with its front).
        println!("cargo::warning=the front library is x86-64 only: not built for this target");
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR is <target dir>/[<triple>/]<profile>/build/<package>-<hash>/out; the
    // package's library lands in <target dir>/[<triple>/]<profile>.
    let Some(dest) = out.ancestors().nth(3) else {
        panic!("unexpected OUT_DIR {}", out.display());
    };
    let built = rustc_cdylib(&out, "tessera_preload", "front/lib.rs", &[], &[]);
    install(&built, dest, FRONT_FILE);
    for (file, soname, real) in SHIMS {
        // A library whose DT_SONAME is the real file's absolute path: linked into the
        // shim, it becomes the shim's DT_NEEDED, which ld.so opens by that path.
        let src = out.join("needed_stub.rs");
        std::fs::write(&src, STUB_SRC).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let stem = soname.split('.').next().unwrap_or(soname);
        let stub = rustc_cdylib(
            &out,
            &format!("{}_real_stub", stem.replace('-', "_")),
            src.to_str().expect("utf-8 OUT_DIR"),
            &[],
            &[format!("-Wl,-soname,{real}")],
        );
        let shim = rustc_cdylib(
            &out,
            &format!("tessera_shim_{}", stem.replace('-', "_")),
            "front/lib.rs",
            &["tessera_shim"],
            &[
                format!("-Wl,-soname,{soname}"),
                // rustc links with --as-needed: the stub defines nothing the shim uses.
                "-Wl,--no-as-needed".into(),
                stub.display().to_string(),
            ],
        );
        install(&shim, dest, file);
    }
}

/// Builds `tessera-cdi-hook` (`hook/lib.rs`, the `createContainer` hook of shared
/// claims' specs, which the plugin installs beside the library) with the same rustc,
/// target and linker, and puts it beside this package's library. It runs on the
/// host, so it gets the release build's glibc floor; its package
/// (`tessera-cdi-hook`) is an rlib for clippy and its unit tests.
fn cdi_hook() {
    println!("cargo::rerun-if-changed=hook/lib.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let Some(dest) = out.ancestors().nth(3) else {
        panic!("unexpected OUT_DIR {}", out.display());
    };
    let lib = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
        .join("hook/lib.rs");
    let src = out.join("cdi_hook_main.rs");
    std::fs::write(
        &src,
        format!(
            "#[path = {:?}]\nmod hook;\nfn main() {{\n    std::process::exit(hook::main())\n}}\n",
            lib.display().to_string()
        ),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let built = out.join("tessera-cdi-hook");
    rustc(
        &built,
        "tessera_cdi_hook",
        "bin",
        src.to_str().expect("utf-8 OUT_DIR"),
        &[],
        &[],
    );
    install(&built, dest, "tessera-cdi-hook");
}

/// The shims: (file name beside the library, DT_SONAME, DT_NEEDED). The NEEDED paths
/// are `tessera_abi::CONTAINER_DRIVER_DIR`'s files (`cuda/src/loader/resolve.rs`
/// looks the real functions up there; the plugin mounts the real files there).
const SHIMS: [(&str, &str, &str); 2] = [
    (
        "libtessera_shim_cuda.so.1",
        "libcuda.so.1",
        "/usr/local/tessera/driver/libcuda.real",
    ),
    (
        "libtessera_shim_nvidia-ml.so.1",
        "libnvidia-ml.so.1",
        "/usr/local/tessera/driver/libnvidia-ml.real",
    ),
];

/// The stand-in linked for a shim's DT_NEEDED: nothing but what a no_std cdylib needs.
const STUB_SRC: &str =
    "#![no_std]\n#[panic_handler]\nfn panic(_: &core::panic::PanicInfo) -> ! {\n    loop {}\n}\n";

/// Runs rustc on `src` as a `panic=abort` cdylib named `name` in `out`, with `cfgs`
/// and extra linker arguments, without C start files; returns the built file.
fn rustc_cdylib(
    out: &std::path::Path,
    name: &str,
    src: &str,
    cfgs: &[&str],
    link_args: &[String],
) -> PathBuf {
    let built = out.join(format!("lib{name}.so"));
    let link_args: Vec<String> = std::iter::once("-nostartfiles".to_string())
        .chain(link_args.iter().cloned())
        .collect();
    rustc(&built, name, "cdylib", src, cfgs, &link_args);
    built
}

/// Runs rustc on `src` as a `panic=abort` crate of `crate_type` named `name`, with
/// `cfgs` and linker arguments, for the target and with the linker cargo uses, into
/// `built`.
fn rustc(
    built: &std::path::Path,
    name: &str,
    crate_type: &str,
    src: &str,
    cfgs: &[&str],
    link_args: &[String],
) {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let mut cmd = Command::new(&rustc);
    cmd.args([
        "--crate-name",
        name,
        "--crate-type",
        crate_type,
        "--edition",
        "2024",
        "-C",
        "panic=abort",
        "-C",
        "opt-level=2",
        "-C",
        "debuginfo=0",
        "-C",
        "strip=debuginfo",
        "--target",
        &target,
    ]);
    for c in cfgs {
        cmd.arg("--cfg").arg(c);
    }
    for a in link_args {
        cmd.arg("-C").arg(format!("link-arg={a}"));
    }
    cmd.arg("-o").arg(built).arg(src);
    // Its warnings are clippy's to report (`cargo clippy --workspace` lints the
    // `tessera-front` and `tessera-cdi-hook` rlibs, the same files): a lint a newer
    // rustc adds must not break a user's build.
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        cmd.arg("-C").arg(format!("linker={linker}"));
    }
    let res = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
    assert!(
        res.status.success(),
        "building {name} ({src}) failed:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
}

/// Copies `built` to `dest/file` atomically.
fn install(built: &std::path::Path, dest: &std::path::Path, file: &str) {
    let tmp = dest.join(format!(".{file}.tmp"));
    std::fs::copy(built, &tmp)
        .and_then(|_| std::fs::rename(&tmp, dest.join(file)))
        .unwrap_or_else(|e| panic!("installing {file} in {}: {e}", dest.display()));
}

const FRONT_FILE: &str = "libtessera_preload.so";
