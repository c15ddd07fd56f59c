//! Tessera's CDI specs applied by real container runtimes, podman and containerd: the
//! scenarios are written once (`scenarios`) over the test kit's `Runtime` trait, and
//! each runtime's module starts its node and adds what only it can show. Root-only:
//! every test is `#[ignore]`d with the reason, and skipped without its prerequisites
//! unless `CI` is set.

mod containerd;
mod podman;
mod scenarios;
