//! `libtessera_shim_cuda.so`: the front library (`tessera-front`) as Tessera's
//! `libcuda.so.1`, which the plugin mounts at the driver's own path in a shared-claim
//! container (its link arguments: `build.rs`).

#![no_std]

#[cfg(target_arch = "x86_64")]
tessera_front::library!(shim);
