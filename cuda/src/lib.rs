//! Tessera's interception library, `libtessera_cuda.so`: preloaded into every process
//! of a shared-GPU container, it enforces each claim's per-GPU memory budget on the
//! CUDA driver's allocation paths and shows the budget as the device's memory, and paces
//! every kernel launch by the claim's compute rate.
//!
//! Three concerns, one folder each, depending one way: `hooks` → [`enforce`] and
//! `hooks` → [`loader`]; the loader knows the hooks only by name (its table, to which
//! the hooks give their addresses), and `enforce` calls neither (the hooks pass in what
//! the driver answered).
//!
//! * [`loader`]: how the library gets in and finds the driver: the hook table, the
//!   driver functions it calls, glibc's `dlsym`, the front library's range, the
//!   `cuGetProcAddress` variant table, symbols found without libdl;
//! * [`enforce`]: budgets, the claims' regions and the charges in them, the live
//!   allocations, what each allocation is charged, compute rates and launch counters;
//! * `hooks`: the exported entry points (and `dlsym`), one module per family of calls;
//! * [`ffi`]: the CUDA and NVML types and constants the library touches;
//! * [`stderr`]: the library's one-line messages.
//!
//! Nothing here may panic across the C boundary: errors become CUDA or NVML codes.

pub mod enforce;
pub mod ffi;
#[cfg(not(test))]
mod hooks;
pub mod loader;
pub mod stderr;
