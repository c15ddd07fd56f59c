//! What the library enforces, and the books it keeps for that: the claims that bind
//! the process and their budgets, the charges in each claim's region, the allocations
//! they were charged for, and the launch rates. Nothing here calls the driver or knows
//! a hook: the hooks ask the driver and pass in what it answered (a device's UUID
//! through a closure, the launch path's device queries through
//! [`throttle::LaunchDevices`]).
//!
//! * [`budget`]: which claims bind the process (`/proc/self/mountinfo`), budgets
//!   merged by GPU UUID (pure);
//! * [`accounting`]: the process's claims, its slot in each region (OFD locks),
//!   reservations and releases, each claim's launch buckets;
//! * [`allocations`]: the live charged allocations by handle (lock-free for linear
//!   memory), and graph memory needs;
//! * [`sizes`]: what each allocation is charged and what the virtual views report
//!   (pure);
//! * [`throttle`]: compute rates: the launch's GPU and the claim's token bucket, graph
//!   work per executable graph;
//! * [`launch_counters`]: per-thread launch counters and their flusher;
//! * [`forklock`]: the locks a forked child finds free or abandoned, never held;
//! * [`ptr_hasher`]: the tables' hasher for pointer and handle keys.

pub mod accounting;
pub mod allocations;
pub mod budget;
pub mod forklock;
pub mod launch_counters;
pub mod ptr_hasher;
pub mod sizes;
pub mod throttle;
