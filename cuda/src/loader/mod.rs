//! How the library gets into a process and finds the driver behind itself. Nothing
//! here knows what a hook does: the hooks module exports the entry points and hands
//! its own addresses to [`hook_table`] where a lookup needs them.
//!
//! * [`hook_table`]: the hooked names (one list, `tessera_symbols::for_each_hook!`,
//!   shared with the front library) and the driver's function behind each;
//! * [`driver_fns`]: the driver functions the library calls without hooking them;
//! * [`resolve`]: glibc's own `dlsym`, and a name found behind the library;
//! * [`front`]: where the front library's stubs are, never taken for the driver's;
//! * [`gpa_table`]: which exported variant `cuGetProcAddress` hands out (generated);
//! * `glibc_shims` (release build only): libdl and libpthread found at first use, so
//!   that ld.so does not load them into every process.

pub mod driver_fns;
use tessera_symbols::elf as elf_symbols;
pub mod front;
#[cfg(all(tessera_glibc_shims, not(test), target_arch = "x86_64"))]
mod glibc_shims;
pub mod gpa_table;
pub mod hook_table;
pub mod resolve;
