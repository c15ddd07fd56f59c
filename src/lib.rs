//! Tessera: a Kubernetes DRA driver for GPUs. See ARCHITECTURE.md for the map.

pub mod allocator;
pub mod backend;
pub mod cdispec;
pub mod cel;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod demo;
pub mod driver;
pub mod fakeapi;
pub mod gpuconfig;
pub mod kubelet;
pub mod kubever;
pub mod mig;
pub mod naming;
pub mod node;
pub mod plan;
pub mod plugin;
pub mod proto;
pub mod publish;
pub mod slices;
pub mod state;
pub mod typemeta;
pub mod validation;
pub mod versions;
