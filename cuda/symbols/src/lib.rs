//! What the interception library (`tessera-interpose`) and its front
//! (`tessera-front`) share, so that neither copies the other: the list of hooked names
//! ([`for_each_hook!`]) and [`elf`], which finds functions and objects among the
//! loaded objects without libdl. No std: the front has none.

#![cfg_attr(not(test), no_std)]

pub mod elf;
mod hooks;
