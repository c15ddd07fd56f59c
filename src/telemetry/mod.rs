//! What the plugin tells operators: Prometheus metrics, and the HTTP server for them and
//! the liveness and readiness probes.

pub mod http;
pub mod metrics;
