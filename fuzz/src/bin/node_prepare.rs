//! AFL++ entry of [`tessera_fuzz::node_prepare`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::node_prepare(data));
}
