//! Device health: what the backend's health events (NVML XID errors, a GPU fallen off
//! the bus) mean for the devices Tessera publishes. Pure: no I/O, the clock is a
//! parameter.
//!
//! Health is kept per physical GPU (by minor). Every device of an unhealthy GPU (the
//! whole GPU, its MIG partitions, its shared device or fallback slots) is unhealthy
//! with it: an XID names the GPU, and NVML reports loss per GPU.
//!
//! The policy ([`HealthConfig`], node config field `health:`) maps an event to an
//! [`HealthAction`]:
//!
//! * application XIDs (13, 31, 43, 45, 68, 109: faults a program causes on a healthy
//!   GPU) are ignored;
//! * fatal XIDs ([`FATAL_XIDS`]: 48 double-bit ECC, 79 fallen off the bus, 95
//!   uncontained ECC, 119/120 GSP errors) and device loss are `NoExecute`;
//! * every other XID is `NoSchedule`;
//! * `health.xids` overrides the action per XID and `health.gpuLost` the one for loss.
//!
//! An unhealthy GPU stays unhealthy until the backend reports it recovered; with
//! `clearOnRecovery: false` it stays so until the plugin restarts. A stronger action
//! replaces a weaker one (`NoExecute` over `NoSchedule`); an equal or weaker event
//! keeps the first cause and its time, so that repeated XIDs do not churn the slices.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::backend::{HealthEvent, HealthEventKind};

/// The taint key on every unhealthy device; the value names the cause.
pub const TAINT_KEY: &str = "gpu.tessera.dev/unhealthy";

/// XIDs a program causes on a healthy GPU (illegal address, MMU fault from a kernel,
/// reset channel, preemptive clean-up, video decoder exception, context switch
/// timeout): ignored by default.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// XIDs after which the GPU cannot be trusted with running work: `NoExecute` by default.
pub const FATAL_XIDS: [u64; 5] = [48, 79, 95, 119, 120];

/// What an event does to the devices of its GPU: the taint effect, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum HealthAction {
    /// The event is logged and otherwise ignored.
    Ignore,
    /// New claims are not allocated the devices; running pods stay.
    NoSchedule,
    /// Also evicts pods using the devices.
    NoExecute,
}

impl HealthAction {
    /// The `DeviceTaint.effect` string; `None` for [`HealthAction::Ignore`].
    pub fn effect(self) -> Option<&'static str> {
        match self {
            HealthAction::Ignore => None,
            HealthAction::NoSchedule => Some("NoSchedule"),
            HealthAction::NoExecute => Some("NoExecute"),
        }
    }
}

/// One `health.xids` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct XidRule {
    pub xid: u64,
    pub action: HealthAction,
}

fn default_true() -> bool {
    true
}

/// The node config's `health:` section. Every field is optional:
///
/// ```yaml
/// health:
///   clearOnRecovery: true      # default true: remove the taint when the GPU recovers
///   gpuLost: NoExecute         # Ignore | NoSchedule | NoExecute (default NoExecute)
///   xids:                      # per-XID overrides of the default classes
///   - {xid: 94, action: NoExecute}
///   - {xid: 63, action: Ignore}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthConfig {
    #[serde(default = "default_true")]
    pub clear_on_recovery: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_lost: Option<HealthAction>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<XidRule>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            clear_on_recovery: true,
            gpu_lost: None,
            xids: Vec::new(),
        }
    }
}

impl HealthConfig {
    /// Whether this is the default (so that the config serializes without it).
    pub fn is_default(&self) -> bool {
        *self == HealthConfig::default()
    }

    /// The action for an XID: the override, else its default class.
    pub fn xid_action(&self, xid: u64) -> HealthAction {
        if let Some(r) = self.xids.iter().find(|r| r.xid == xid) {
            return r.action;
        }
        if APPLICATION_XIDS.contains(&xid) {
            HealthAction::Ignore
        } else if FATAL_XIDS.contains(&xid) {
            HealthAction::NoExecute
        } else {
            HealthAction::NoSchedule
        }
    }

    /// The action for a GPU that fell off the bus (NVML `GPU_IS_LOST`).
    pub fn lost_action(&self) -> HealthAction {
        self.gpu_lost.unwrap_or(HealthAction::NoExecute)
    }

    /// The first duplicated XID in `xids`, as `(index, xid)`.
    pub fn duplicate_xid(&self) -> Option<(usize, u64)> {
        self.xids
            .iter()
            .enumerate()
            .find(|(i, r)| self.xids[..*i].iter().any(|o| o.xid == r.xid))
            .map(|(i, r)| (i, r.xid))
    }
}

/// Why a GPU is unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Xid(u64),
    Lost,
}

impl Cause {
    /// The taint value: `xid-<n>` or `gpu-lost` (a valid label value).
    pub fn reason(self) -> String {
        match self {
            Cause::Xid(x) => format!("xid-{x}"),
            Cause::Lost => "gpu-lost".into(),
        }
    }
}

/// An unhealthy GPU: its cause, the action the policy chose, a message, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    pub cause: Cause,
    /// Never [`HealthAction::Ignore`].
    pub action: HealthAction,
    pub message: String,
    /// Unix seconds.
    pub since: i64,
}

impl Unhealthy {
    /// The taint the GPU's devices carry.
    pub fn taint(&self) -> DeviceTaint {
        DeviceTaint {
            key: TAINT_KEY.into(),
            value: Some(self.cause.reason()),
            effect: self.action.effect().unwrap_or("NoSchedule").into(),
            time_added: k8s_openapi::jiff::Timestamp::from_second(self.since)
                .ok()
                .map(Time),
        }
    }
}

/// A device's health as the health stream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceHealth {
    Healthy,
    Unhealthy(Unhealthy),
}

/// The health of the node's GPUs under a policy. GPUs not listed are healthy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    policy: HealthConfig,
    unhealthy: BTreeMap<u32, Unhealthy>,
}

/// What applying one event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The GPU's state changed.
    Changed,
    /// The policy ignores the event.
    Ignored,
    /// The GPU already had this or a stronger state (or the policy keeps taints).
    Unchanged,
}

impl NodeHealth {
    pub fn new(policy: HealthConfig) -> Self {
        NodeHealth {
            policy,
            unhealthy: BTreeMap::new(),
        }
    }

    pub fn policy(&self) -> &HealthConfig {
        &self.policy
    }

    /// The GPU's health.
    pub fn gpu(&self, minor: u32) -> DeviceHealth {
        match self.unhealthy.get(&minor) {
            Some(u) => DeviceHealth::Unhealthy(u.clone()),
            None => DeviceHealth::Healthy,
        }
    }

    /// The GPU's unhealthy state, if any.
    pub fn unhealthy(&self, minor: u32) -> Option<&Unhealthy> {
        self.unhealthy.get(&minor)
    }

    /// Every unhealthy GPU by minor.
    pub fn all_unhealthy(&self) -> &BTreeMap<u32, Unhealthy> {
        &self.unhealthy
    }

    /// Applies one backend event at time `now` (unix seconds).
    pub fn apply(&mut self, ev: &HealthEvent, now: i64) -> Applied {
        let (cause, action, message) = match ev.kind {
            HealthEventKind::Xid(x) => (
                Cause::Xid(x),
                self.policy.xid_action(x),
                format!("XID {x} on gpu-{}", ev.minor),
            ),
            HealthEventKind::Lost => (
                Cause::Lost,
                self.policy.lost_action(),
                format!("gpu-{} is lost (fell off the bus)", ev.minor),
            ),
            HealthEventKind::Recovered => {
                if !self.unhealthy.contains_key(&ev.minor) || !self.policy.clear_on_recovery {
                    return Applied::Unchanged;
                }
                self.unhealthy.remove(&ev.minor);
                return Applied::Changed;
            }
        };
        if action == HealthAction::Ignore {
            return Applied::Ignored;
        }
        if let Some(cur) = self.unhealthy.get(&ev.minor)
            && cur.action >= action
        {
            return Applied::Unchanged;
        }
        self.unhealthy.insert(
            ev.minor,
            Unhealthy {
                cause,
                action,
                message,
                since: now,
            },
        );
        Applied::Changed
    }
}

/// Unix seconds now.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(minor: u32, kind: HealthEventKind) -> HealthEvent {
        HealthEvent {
            seq: 1,
            minor,
            kind,
        }
    }

    /// Default classes: application XIDs ignored, fatal ones and loss NoExecute, the
    /// rest NoSchedule; overrides win.
    #[test]
    fn xid_classes_and_overrides() {
        let d = HealthConfig::default();
        for x in APPLICATION_XIDS {
            assert_eq!(d.xid_action(x), HealthAction::Ignore, "{x}");
        }
        assert_eq!(d.xid_action(79), HealthAction::NoExecute);
        assert_eq!(d.xid_action(48), HealthAction::NoExecute);
        assert_eq!(d.xid_action(63), HealthAction::NoSchedule);
        assert_eq!(d.lost_action(), HealthAction::NoExecute);
        let c = HealthConfig {
            clear_on_recovery: true,
            gpu_lost: Some(HealthAction::NoSchedule),
            xids: vec![
                XidRule {
                    xid: 13,
                    action: HealthAction::NoSchedule,
                },
                XidRule {
                    xid: 79,
                    action: HealthAction::Ignore,
                },
            ],
        };
        assert_eq!(c.xid_action(13), HealthAction::NoSchedule);
        assert_eq!(c.xid_action(79), HealthAction::Ignore);
        assert_eq!(c.lost_action(), HealthAction::NoSchedule);
        assert_eq!(c.duplicate_xid(), None);
    }

    /// An XID taints, a stronger event replaces it, a weaker one keeps the first, an
    /// application XID changes nothing, recovery clears.
    #[test]
    fn events_move_a_gpu_between_states() {
        let mut h = NodeHealth::new(HealthConfig::default());
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Xid(13)), 10),
            Applied::Ignored
        );
        assert_eq!(h.gpu(1), DeviceHealth::Healthy);
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Xid(63)), 10),
            Applied::Changed
        );
        let u = h.unhealthy(1).unwrap();
        assert_eq!(
            (u.cause, u.action, u.since),
            (Cause::Xid(63), HealthAction::NoSchedule, 10)
        );
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Xid(64)), 11),
            Applied::Unchanged
        );
        assert_eq!(h.apply(&ev(1, HealthEventKind::Lost), 12), Applied::Changed);
        let t = h.unhealthy(1).unwrap().taint();
        assert_eq!(t.key, TAINT_KEY);
        assert_eq!(t.value.as_deref(), Some("gpu-lost"));
        assert_eq!(t.effect, "NoExecute");
        assert_eq!(t.time_added.unwrap().0.as_second(), 12);
        assert_eq!(h.gpu(0), DeviceHealth::Healthy);
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Recovered), 13),
            Applied::Changed
        );
        assert_eq!(h.gpu(1), DeviceHealth::Healthy);
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Recovered), 13),
            Applied::Unchanged
        );
    }

    /// With `clearOnRecovery: false` a taint stays after recovery.
    #[test]
    fn recovery_keeps_the_taint_when_policy_says_so() {
        let mut h = NodeHealth::new(HealthConfig {
            clear_on_recovery: false,
            ..Default::default()
        });
        h.apply(&ev(0, HealthEventKind::Xid(79)), 5);
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Recovered), 6),
            Applied::Unchanged
        );
        assert!(h.unhealthy(0).is_some());
    }
}
