//! Device health: what XID and loss events mean for the published devices (the pure
//! policy), and the watcher that applies them and serves the DRA health stream.

pub mod policy;
pub mod watcher;
