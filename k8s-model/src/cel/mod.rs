//! The DRA CEL environment: compiles DeviceClass and request selectors
//! (`CELDeviceSelector.expression`) and evaluates them against devices of ResourceSlices
//! as the kube-scheduler does (`k8s.io/dynamic-resource-allocation/cel`), for the offline
//! simulator. Pure: no I/O, no global mutable state.
//!
//! ```
//! # use k8s_openapi::api::resource::v1::Device;
//! use k8s_model::cel::{DeviceInput, DeviceSelector};
//!
//! let selector = DeviceSelector::compile(r#"device.driver == "gpu.tessera.dev""#)?;
//! let device = Device { name: "gpu-0".into(), ..Default::default() };
//! let input = DeviceInput { driver: "gpu.tessera.dev", device: &device, consumable_capacity: false };
//! assert!(selector.matches(&input)?);
//! # Ok::<(), k8s_model::cel::CelError>(())
//! ```
//!
//! # What the environment offers
//!
//! * `device.driver`, `device.attributes[domain].id`, `device.capacity[domain].id` and,
//!   with [`DeviceInput::consumable_capacity`], `device.allowMultipleAllocations`. An
//!   unknown domain is an empty map; an unknown key is a "no such key" error (`has()` and
//!   `.?id.orValue(d)` work). Attributes are ints, bools, strings, versions (semver
//!   values) and lists of those; capacities are quantities.
//! * The CEL standard library with optionals, cel-go's strings and lists extensions,
//!   `cel.bind()`, the quantity library (`quantity`, `isQuantity`, `compareTo`,
//!   `isGreaterThan`, `isLessThan`, `add`, `sub`, `sign`, `isInteger`, `asInteger`,
//!   `asApproximateFloat`), the semver library (`semver`, `isSemver`, each with the
//!   optional `normalize` flag, `major`, `minor`, `patch`, `compareTo`, `isGreaterThan`,
//!   `isLessThan`) and DRA's `includes()`.
//!
//! # Differences from Kubernetes
//!
//! * No type checker: what Kubernetes refuses when validating (an unknown field of
//!   `device`, a statically non-bool expression, an unknown function) fails here when
//!   evaluating, as [`CelError::Eval`] or [`CelError::NotBool`].
//! * List attributes and `includes()` are always available, as with the
//!   DRAListTypeAttributes gate enabled.
//! * **Cost.** Kubernetes estimates the worst-case cost when validating and stops
//!   evaluation beyond `CELSelectorExpressionMaxCost` (1,000,000). The `cel` crate has
//!   neither an estimator nor a runtime budget; the model meters evaluation itself
//!   ([`cost`]): past [`MAX_COST`] units an evaluation stops with "operation cancelled:
//!   actual cost limit exceeded" ([`CelError::CostLimit`]). Its units are not cel-go's,
//!   so the boundary differs, but no selector (nested comprehensions, doubling strings or
//!   lists) runs long. There is no compile-time estimate.
//! * Not provided: the Kubernetes `lists`, `regex` (`find`), URL, IP/CIDR, `format` and
//!   `sets` libraries, quantity `mul`/`div`/`divInt`, and version gating of libraries.
//!   `q.sign()` is accepted besides Kubernetes' `sign(q)`. Quantities are limited to 38
//!   significant digits (see [`crate::validation::quantity`]). Runtime error texts come
//!   from the `cel` crate and differ from cel-go's.

pub mod cost;
mod device;
pub mod env;
mod quantity;
mod selector;
mod semver;

pub use cost::MAX_COST;
pub use device::DeviceInput;
pub use env::INCLUDES_MAX_LIST_LEN;
pub use selector::{CelError, DeviceSelector, MAX_EXPRESSION_LEN};
