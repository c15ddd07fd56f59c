//! AFL++ entry of [`tessera_fuzz::quantity_semver`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::quantity_semver(data));
}
