//! `tessera-cdi-hook`: see the library's documentation.

fn main() {
    std::process::exit(tessera_cdi_hook::main())
}
