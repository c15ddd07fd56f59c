//! Test doubles and harnesses for Tessera's tests, benchmarks and demo: an in-process
//! fake API server, a kubelet stand-in over the plugin's real sockets, the demo's
//! harness and an evaluator for the shipped admission policies. Dev-only: nothing here
//! is linked into the shipped `tessera` binary.

#![forbid(unsafe_code)]

pub mod admission;
pub mod demo;
pub mod fakeapi;
pub mod kubelet_standin;
pub mod rbac;
