//! Compute shares on shared GPUs: the pure controller, and the service that feeds it
//! NVML and region readings each tick and writes the claims' launch rates.

pub mod controller;
pub mod procmap;
pub mod service;
