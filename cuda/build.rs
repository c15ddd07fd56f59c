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
