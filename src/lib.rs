//! Tessera: a Kubernetes DRA driver for GPUs. See ARCHITECTURE.md for the map: one
//! folder per concern, in the order a claim meets them.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod claim_status;
pub mod clock;
pub mod compute;
pub mod config;
pub mod device_classes;
pub mod device_health;
pub mod doctor;
pub mod driver_root;
pub mod error_chain;
pub mod inventory;
pub mod kubelet;
pub mod mig;
pub mod naming;
pub mod node;
pub mod plugin;
pub mod prepare;
pub mod publish;
pub mod telemetry;
pub mod watchdog;
