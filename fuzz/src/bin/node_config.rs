//! AFL++ entry of [`tessera_fuzz::node_config`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::node_config(data));
}
