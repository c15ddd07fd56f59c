//! Tessera: a Kubernetes DRA driver for GPUs. See ARCHITECTURE.md for the map.

pub mod backend;
pub mod config;
pub mod kubever;
pub mod naming;
pub mod node;
pub mod versions;
pub mod fakeapi;
pub mod publish;
pub mod slices;
pub mod validation;
