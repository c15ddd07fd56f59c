//! AFL++ entry of [`tessera_fuzz::cdi_spec`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::cdi_spec(data));
}
