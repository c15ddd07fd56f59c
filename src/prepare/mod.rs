//! Preparing and unpreparing claims: the state machine and its crash recovery over the
//! checkpoint, the pure claim plan, and what a prepared claim leaves on the node (its
//! CDI spec, its claim files, its device metadata files, the installed interception
//! library).

pub mod cdi_spec;
pub mod checkpoint;
pub mod claim_dir;
pub mod claim_files;
pub mod claim_plan;
pub mod device_metadata;
pub mod failpoints;
pub mod gpu_config;
pub mod library;
pub mod snapshot;
pub mod state;
