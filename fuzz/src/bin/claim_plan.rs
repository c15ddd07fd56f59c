//! AFL++ entry of [`tessera_fuzz::claim_plan`] (`cargo afl build --features afl`).

fn main() {
    afl::fuzz!(|data: &[u8]| tessera_fuzz::claim_plan(data));
}
