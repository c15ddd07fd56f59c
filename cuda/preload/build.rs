//! The front library's link arguments (`tessera-link`).

fn main() {
    tessera_link::no_start_files();
}
