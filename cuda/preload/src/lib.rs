//! `libtessera_preload.so`: the front library (`tessera-front`), as `/etc/ld.so.preload`
//! names it in a shared-GPU container.

#![no_std]

#[cfg(target_arch = "x86_64")]
tessera_front::library!(preload);
