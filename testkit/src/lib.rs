//! Test doubles and harnesses for Tessera's tests, benchmarks and demo: the one home of
//! the Rust test helpers. Dev-only: nothing here is linked into the shipped `tessera`
//! binary.
//!
//! * [`fakeapi`]: an in-process fake API server; [`kubelet_standin`]: a kubelet
//!   stand-in over the plugin's real sockets;
//! * [`harness`]: the plugin on the mock node in a temp dir (in-process or as a child
//!   process), with claims created and allocated as the scheduler would;
//! * [`claims`]: the one ResourceClaim builder;
//! * [`fake_nvml`]: the fake `libnvidia-ml.so.1` and a simulated host, checks run in a
//!   child process;
//! * [`e2e`]: the container-runtime suites' node (device nodes, rootfs, fakes) and
//!   podman; [`cri`]: containerd through CRI; [`runtime`]: the [`runtime::Runtime`]
//!   trait the shared runtime scenarios run over, with both runtimes as thin impls;
//! * [`prereq`] (re-exported from `tessera-testkit-lite`, the light half that
//!   `tessera-cdi`, `tessera-interpose` and the real-cluster crate use): `in_ci`, the
//!   skip-or-fail rule, progress lines. The CDI schema fixtures are that crate's
//!   `testkit_lite::cdi` (feature `cdi`, a dev-dependency only);
//! * [`kit`]: the GPU acceptance kit's checks (`tessera-kit`, `tests/gpu/`);
//! * [`demo`], [`admission`], [`rbac`]: the demo's harness, the admission policies'
//!   evaluator, RBAC checks.

// Denied, not forbidden: the one exception is `interpose::shares::run`, which sets
// the in-process fake NVML's environment (marked there).
#![deny(unsafe_code)]

pub mod admission;
pub mod claims;
pub mod cri;
pub mod demo;
pub mod e2e;
pub mod fake_nvml;
pub mod fakeapi;
pub mod harness;
pub mod interpose;
pub mod kit;
pub mod kubelet_standin;
pub mod rbac;
pub mod runtime;

pub use testkit_lite::prereq;
