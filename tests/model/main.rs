//! The planning model, validation, the fake API server and the layout: pure logic and
//! in-process fakes, no plugin running. One test binary of modules, so that the suite
//! links a few binaries rather than one per file.

mod architecture;
mod cel_selectors;
mod claim_plan;
mod fake_api;
mod gpuconfig_cases;
mod mig_catalog;
mod mig_slices;
mod plan_allocator;
mod publisher;
mod validation_fixtures;
