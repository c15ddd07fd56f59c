//! Tessera's interception library, `libtessera_cuda.so`: preloaded into every process
//! of a shared-GPU container, it enforces each claim's per-GPU memory budget on the
//! CUDA driver's allocation paths and shows the budget as the device's memory, and paces
//! every kernel launch by the claim's compute rate.
//!
//! * [`interpose`]: the `dlsym` trampoline and the real-function slots;
//! * `elf_symbols`: functions and objects found among the loaded objects without libdl
//!   (shared with the front library, `front/lib.rs`);
//! * [`gpa_table`]: which variant `cuGetProcAddress` hands out (generated table);
//! * [`budget`]: which claims bind the process and the budgets merged by GPU UUID;
//! * [`accounting`]: the slots, reservations and the allocation table;
//! * [`forklock`]: the locks a forked child finds free or abandoned, never held;
//! * [`sizes`]: what each allocation is charged and what the virtual views report;
//! * [`throttle`]: compute rates: the claim's token bucket per GPU, launch counters;
//! * `glibc_shims` (release build only): libdl and libpthread found at first use, so
//!   that ld.so does not load them into every process;
//! * `hooks`: the exported entry points, one module per family of calls.
//!
//! Nothing here may panic across the C boundary: errors become CUDA or NVML codes.

pub mod accounting;
pub mod budget;
mod elf_symbols;
pub mod ffi;
pub mod forklock;
#[cfg(all(tessera_glibc_shims, not(test), target_arch = "x86_64"))]
mod glibc_shims;
pub mod gpa_table;
#[cfg(not(test))]
mod hooks;
pub mod interpose;
pub mod sizes;
pub mod throttle;
