//! AFL++ entry of [`tessera_fuzz::plan`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::plan(data));
}
