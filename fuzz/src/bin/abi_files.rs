//! AFL++ entry of [`tessera_fuzz::abi_files`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::abi_files(data));
}
