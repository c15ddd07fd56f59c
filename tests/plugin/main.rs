//! The plugin at work on the mock node or the fake NVML host, in-process or as a child
//! process of the real binary (the test kit's `harness` and `fake_nvml`; `nvml_models`
//! loads go-nvml's DGX models from `tests/nvml-models/` instead): gRPC,
//! preparation, crash recovery, health, metrics and the watchdog. One test binary of
//! modules, so that the suite links a few binaries rather than one per file.

mod claim_status;
mod crash;
mod demo;
mod device_health;
mod device_metadata;
mod doctor;
mod grpc_authority;
mod metrics;
mod mig_prepare;
mod nvml_backend;
mod nvml_models;
mod nvml_models_mig;
mod plugin_grpc;
mod shared_gpus;
mod state_locking;
mod watchdog;
