//! The offline Kubernetes model Tessera checks itself against: which `resource.k8s.io/v1`
//! fields each release keeps ([`release`]), the API server's validation rules
//! ([`validation`]), the DRA CEL environment ([`cel`]), and the scheduler's allocator
//! ([`allocator`]) behind `tessera plan` ([`schedule`]). Pure: no I/O but reading the
//! files `tessera plan` is given, no Kubernetes client.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod allocator;
pub mod attribute_version;
pub mod cel;
pub mod release;
pub mod schedule;
pub mod validation;
