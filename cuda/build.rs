//! Generates the cuGetProcAddress variant table from `data/gpa-variants.tsv` (itself
//! extracted from the facts' Part B4.1): one `Variant` per exported symbol.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let src = "data/gpa-variants.tsv";
    println!("cargo::rerun-if-changed={src}");
    let text = std::fs::read_to_string(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let mut out = String::from("pub static VARIANTS: &[Variant] = &[\n");
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
            format!("Some({:?})", f[3])
        };
        writeln!(
            out,
            "    Variant {{ base: {:?}, introduced: {introduced}, symbol: {:?}, per_thread_of: {of} }},",
            f[0], f[2]
        )
        .ok();
    }
    out.push_str("];\n");
    let dst = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("gpa_variants.rs");
    std::fs::write(&dst, out).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
}
