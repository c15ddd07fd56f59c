//! Device health: what the backend's health events (NVML XID errors, a GPU fallen off
//! the bus, a GPU answering again) mean for the devices Tessera publishes. Pure: no
//! I/O, the clock is a parameter ([`At`]: the wall clock for a taint's `timeAdded`,
//! the monotonic clock for quiet periods, so that a clock step never clears a taint
//! early or late).
//!
//! Health is kept per [`Scope`]: a physical GPU (by minor), or one MIG GPU instance
//! of it. An XID NVML reports with a GPU instance ID is the instance's: it makes
//! unhealthy the devices whose memory slices overlap the instance's placement (the
//! prepared MIG device itself, the published partitions overlapping it, and the whole
//! GPU), not the partitions beside it. Every other event (an XID without a GPU
//! instance, a loss) is the GPU's: every device of the GPU (the whole GPU, its MIG
//! partitions, its shared device or fallback slots) is unhealthy with it.
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
//! When health returns ([`NodeHealth::expire`], [`HealthEventKind::Recovered`]):
//!
//! * a `NoSchedule` XID taint clears once no new XID arrived for its scope for the
//!   quiet period `health.xidClearAfter` (default 5 minutes; per XID
//!   `health.xids[].clearAfter`); every new XID of the scope restarts the period;
//! * a `NoExecute` XID taint (the fatal class) and a loss clear only when the backend
//!   reports the GPU answering again after it was lost (NVML: a query no longer fails
//!   with `GPU_IS_LOST`, which is what a GPU reset or re-attach shows). NVML offers no
//!   other reset indication, so after resetting a GPU that had a fatal XID without
//!   falling off the bus the operator restarts the plugin on the node (health is kept
//!   in memory and starts healthy), or sets `clearAfter` for that XID;
//! * with `clearOnRecovery: false` nothing clears until the plugin restarts (a quiet
//!   period set with it is refused, as is a `clearAfter` on an `Ignore` rule:
//!   [`HealthConfig::problem`]).
//!
//! A stronger action replaces a weaker one (`NoExecute` over `NoSchedule`); an equal
//! or weaker event keeps the first cause and its time, so that repeated XIDs do not
//! churn the slices, but restarts the quiet period. Either way the state keeps the
//! stricter of the two quiet periods (none beats any).

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::inventory::{HealthEvent, HealthEventKind};

/// The taint key on every unhealthy device; the value names the cause.
pub const TAINT_KEY: &str = "gpu.tessera.dev/unhealthy";

/// XIDs a program causes on a healthy GPU (illegal address, MMU fault from a kernel,
/// reset channel, preemptive clean-up, video decoder exception, context switch
/// timeout): ignored by default.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// XIDs after which the GPU cannot be trusted with running work: `NoExecute` by default.
pub const FATAL_XIDS: [u64; 5] = [48, 79, 95, 119, 120];

/// The default quiet period after which a `NoSchedule` XID taint clears.
pub const DEFAULT_XID_CLEAR_AFTER_SECONDS: u64 = 300;

/// What an event does to the devices of its scope: the taint effect, or nothing.
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

/// A quiet period: `<n>s`, `<n>m` or `<n>h` (n ≥ 1, decimal digits without a sign or
/// leading zero), or `Never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Quiet {
    /// Clears after this many seconds without a new event.
    After(u64),
    /// Never clears by time.
    Never,
}

impl Quiet {
    /// The period in seconds; `None` for [`Quiet::Never`].
    pub fn seconds(self) -> Option<u64> {
        match self {
            Quiet::After(s) => Some(s),
            Quiet::Never => None,
        }
    }
}

impl TryFrom<String> for Quiet {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        if s == "Never" {
            return Ok(Quiet::Never);
        }
        let bad = || format!("invalid quiet period {s:?}: want <n>s, <n>m, <n>h (n ≥ 1) or Never");
        // Split off the last character, not the last byte: a multi-byte unit ("5µ")
        // must be refused, not panic mid-character.
        let Some((at, unit)) = s.char_indices().next_back() else {
            return Err(bad());
        };
        let n = &s[..at];
        // Digits only, no leading zero: `u64::from_str` would also take "+5", and
        // "05m" would not print back as written.
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.starts_with('0') {
            return Err(bad());
        }
        let n: u64 = n.parse().map_err(|_| bad())?;
        let secs = match unit {
            's' => Some(n),
            'm' => n.checked_mul(60),
            'h' => n.checked_mul(3600),
            _ => None,
        };
        match secs {
            Some(s) if s > 0 => Ok(Quiet::After(s)),
            _ => Err(bad()),
        }
    }
}

impl From<Quiet> for String {
    fn from(q: Quiet) -> String {
        q.to_string()
    }
}

impl fmt::Display for Quiet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quiet::Never => f.write_str("Never"),
            Quiet::After(s) if s % 3600 == 0 => write!(f, "{}h", s / 3600),
            Quiet::After(s) if s % 60 == 0 => write!(f, "{}m", s / 60),
            Quiet::After(s) => write!(f, "{s}s"),
        }
    }
}

/// One `health.xids` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct XidRule {
    pub xid: u64,
    pub action: HealthAction,
    /// The quiet period for this XID; absent: `xidClearAfter` for `NoSchedule`, never
    /// for `NoExecute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear_after: Option<Quiet>,
}

fn default_true() -> bool {
    true
}

/// The node config's `health:` section. Every field is optional:
///
/// ```yaml
/// health:
///   clearOnRecovery: true      # default true: clear taints when health returns
///   xidClearAfter: 5m          # quiet period of NoSchedule XIDs (<n>s|<n>m|<n>h|Never)
///   gpuLost: NoExecute         # Ignore | NoSchedule | NoExecute (default NoExecute)
///   xids:                      # per-XID overrides of the default classes
///   - {xid: 94, action: NoExecute}
///   - {xid: 63, action: Ignore}
///   - {xid: 48, action: NoExecute, clearAfter: 1h}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthConfig {
    #[serde(default = "default_true")]
    pub clear_on_recovery: bool,
    /// Absent: [`DEFAULT_XID_CLEAR_AFTER_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_clear_after: Option<Quiet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_lost: Option<HealthAction>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<XidRule>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            clear_on_recovery: true,
            xid_clear_after: None,
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

    /// Seconds without a new XID after which this XID's taint clears; `None` when
    /// only a recovery clears it (the `NoExecute` class, unless overridden).
    pub fn xid_clear_after(&self, xid: u64) -> Option<u64> {
        let rule = self.xids.iter().find(|r| r.xid == xid);
        if let Some(q) = rule.and_then(|r| r.clear_after) {
            return q.seconds();
        }
        match self.xid_action(xid) {
            HealthAction::NoSchedule => self
                .xid_clear_after
                .map_or(Some(DEFAULT_XID_CLEAR_AFTER_SECONDS), Quiet::seconds),
            HealthAction::Ignore | HealthAction::NoExecute => None,
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

    /// The first setting the policy would silently never use, as (field under
    /// `health.`, why): a duplicated XID, a `clearAfter` on an `Ignore` rule (it never
    /// taints), or a quiet period with `clearOnRecovery: false` (nothing clears).
    /// Deterministic.
    pub fn problem(&self) -> Option<(String, String)> {
        if let Some((i, xid)) = self.duplicate_xid() {
            return Some((
                format!("xids[{i}].xid"),
                format!("XID {xid} is listed twice"),
            ));
        }
        if let Some((i, r)) = self
            .xids
            .iter()
            .enumerate()
            .find(|(_, r)| r.action == HealthAction::Ignore && r.clear_after.is_some())
        {
            return Some((
                format!("xids[{i}].clearAfter"),
                format!(
                    "XID {} is ignored (action: Ignore), so it has no taint to clear",
                    r.xid
                ),
            ));
        }
        if !self.clear_on_recovery {
            let keeps = "clearOnRecovery: false keeps every taint until the plugin restarts";
            if self.xid_clear_after.is_some() {
                return Some((
                    "xidClearAfter".into(),
                    format!("{keeps}; drop one of the two"),
                ));
            }
            if let Some(i) = self.xids.iter().position(|r| r.clear_after.is_some()) {
                return Some((
                    format!("xids[{i}].clearAfter"),
                    format!("{keeps}; drop one of the two"),
                ));
            }
        }
        None
    }
}

/// When an event is applied or quiet periods are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// Unix seconds: the taint's `timeAdded`.
    pub unix: i64,
    /// What quiet periods are measured on.
    pub mono: Instant,
}

impl At {
    /// Both clocks now (tokio's monotonic clock, so that a paused test clock applies).
    pub fn now() -> At {
        At {
            unix: crate::clock::unix_secs() as i64,
            mono: tokio::time::Instant::now().into_std(),
        }
    }
}

/// Memory slices `[start, start + size)` of a GPU: a MIG placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    pub start: u32,
    pub size: u32,
}

impl Span {
    pub fn overlaps(self, other: Span) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

/// What a health state is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The whole physical GPU: every device of it.
    Gpu,
    /// One MIG GPU instance, at the placement it had when the event arrived.
    Instance { gi_id: u32, span: Span },
}

impl Scope {
    /// Whether a device occupying `device` (its MIG placement; `None` for a device
    /// using the whole GPU) is affected.
    pub fn covers(self, device: Option<Span>) -> bool {
        match (self, device) {
            (Scope::Gpu, _) | (Scope::Instance { .. }, None) => true,
            (Scope::Instance { span, .. }, Some(d)) => span.overlaps(d),
        }
    }
}

/// Why a scope is unhealthy.
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

/// An unhealthy scope: its cause, the action the policy chose, a message, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy {
    pub cause: Cause,
    /// Never [`HealthAction::Ignore`].
    pub action: HealthAction,
    pub message: String,
    /// Unix seconds: when the scope became unhealthy (the taint's `timeAdded`).
    pub since: i64,
    /// The latest event that kept it so (monotonic).
    pub last_event: Instant,
    /// Quiet seconds after [`Unhealthy::last_event`] that clear it; `None`: only a
    /// recovery does.
    pub clear_after: Option<u64>,
}

impl Unhealthy {
    /// The taint the scope's devices carry.
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

/// The health of the node's GPUs and MIG instances under a policy. Scopes not listed
/// are healthy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    policy: HealthConfig,
    unhealthy: BTreeMap<(u32, Scope), Unhealthy>,
}

/// What applying one event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A scope's state changed.
    Changed,
    /// The policy ignores the event.
    Ignored,
    /// The scope already had this or a stronger state (or the policy keeps taints).
    Unchanged,
}

/// The stricter of two quiet periods (`None` = never).
fn stricter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.max(b?))
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

    /// The GPU-level health of GPU `minor` (instance-level states not included).
    pub fn gpu(&self, minor: u32) -> DeviceHealth {
        match self.unhealthy(minor) {
            Some(u) => DeviceHealth::Unhealthy(u.clone()),
            None => DeviceHealth::Healthy,
        }
    }

    /// The GPU-level unhealthy state of GPU `minor`, if any.
    pub fn unhealthy(&self, minor: u32) -> Option<&Unhealthy> {
        self.unhealthy.get(&(minor, Scope::Gpu))
    }

    /// The state a device of GPU `minor` occupying `span` (its MIG placement; `None`
    /// for one using the whole GPU) carries: the strongest of the GPU's and of the
    /// instances overlapping it, the GPU's first on a tie.
    pub fn device(&self, minor: u32, span: Option<Span>) -> Option<&Unhealthy> {
        self.unhealthy
            .range((minor, Scope::Gpu)..)
            .take_while(|((m, _), _)| *m == minor)
            .filter(|((_, scope), _)| scope.covers(span))
            .map(|(_, u)| u)
            .fold(None, |best: Option<&Unhealthy>, u| match best {
                Some(b) if b.action >= u.action => Some(b),
                _ => Some(u),
            })
    }

    /// [`NodeHealth::device`] as the health stream reports it.
    pub fn device_health(&self, minor: u32, span: Option<Span>) -> DeviceHealth {
        match self.device(minor, span) {
            Some(u) => DeviceHealth::Unhealthy(u.clone()),
            None => DeviceHealth::Healthy,
        }
    }

    /// Every unhealthy scope by (GPU minor, scope).
    pub fn all_unhealthy(&self) -> &BTreeMap<(u32, Scope), Unhealthy> {
        &self.unhealthy
    }

    /// Applies one backend event at `now` to the whole GPU: what
    /// [`NodeHealth::apply_in`] does with [`Scope::Gpu`].
    pub fn apply(&mut self, ev: &HealthEvent, now: At) -> Applied {
        self.apply_in(ev, Scope::Gpu, now)
    }

    /// Applies one backend event at `now`. `scope` is where an XID
    /// happened (the caller resolves the event's GPU instance ID to its placement);
    /// a loss is always the GPU's, and a recovery clears every scope of the GPU.
    pub fn apply_in(&mut self, ev: &HealthEvent, scope: Scope, now: At) -> Applied {
        let minor = ev.minor;
        let (cause, action, clear_after, scope, message) = match ev.kind {
            HealthEventKind::Xid(x) => {
                let place = match scope {
                    Scope::Gpu => format!("gpu-{minor}"),
                    Scope::Instance { gi_id, .. } => {
                        format!("gpu-{minor} GPU instance {gi_id}")
                    }
                };
                (
                    Cause::Xid(x),
                    self.policy.xid_action(x),
                    self.policy.xid_clear_after(x),
                    scope,
                    format!("XID {x} on {place}"),
                )
            }
            HealthEventKind::Lost => (
                Cause::Lost,
                self.policy.lost_action(),
                None,
                Scope::Gpu,
                format!("gpu-{minor} is lost (fell off the bus)"),
            ),
            HealthEventKind::Recovered => {
                if !self.policy.clear_on_recovery {
                    return Applied::Unchanged;
                }
                let before = self.unhealthy.len();
                self.unhealthy.retain(|(m, _), _| *m != minor);
                return if self.unhealthy.len() < before {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                };
            }
        };
        if action == HealthAction::Ignore {
            return Applied::Ignored;
        }
        let mut clear_after = clear_after;
        if let Some(cur) = self.unhealthy.get_mut(&(minor, scope)) {
            // Whichever state stays, it clears no sooner than either event allows: a
            // stronger XID with a quiet period must not expire a loss that never
            // clears by time.
            clear_after = stricter(cur.clear_after, clear_after);
            if cur.action >= action {
                cur.last_event = now.mono;
                cur.clear_after = clear_after;
                return Applied::Unchanged;
            }
        }
        self.unhealthy.insert(
            (minor, scope),
            Unhealthy {
                cause,
                action,
                message,
                since: now.unix,
                last_event: now.mono,
                clear_after,
            },
        );
        Applied::Changed
    }

    /// Clears every state whose quiet period has passed at `now` (monotonic) and
    /// returns the scopes cleared, in order. Nothing clears with `clearOnRecovery:
    /// false`.
    pub fn expire(&mut self, now: Instant) -> Vec<((u32, Scope), Unhealthy)> {
        if !self.policy.clear_on_recovery {
            return Vec::new();
        }
        let due: Vec<(u32, Scope)> = self
            .unhealthy
            .iter()
            .filter(|(_, u)| {
                u.clear_after
                    .and_then(|d| u.last_event.checked_add(Duration::from_secs(d)))
                    .is_some_and(|due| now >= due)
            })
            .map(|(k, _)| *k)
            .collect();
        due.into_iter()
            .filter_map(|k| self.unhealthy.remove(&k).map(|u| (k, u)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(minor: u32, kind: HealthEventKind) -> HealthEvent {
        HealthEvent {
            seq: 1,
            minor,
            gi_id: None,
            kind,
        }
    }

    static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

    /// `secs` seconds on the monotonic clock of the tests.
    fn mono(secs: u64) -> Instant {
        *START + Duration::from_secs(secs)
    }

    /// Unix second `secs`, which is also `mono(secs)`.
    fn at(secs: u64) -> At {
        At {
            unix: secs as i64,
            mono: mono(secs),
        }
    }

    fn rule(xid: u64, action: HealthAction, clear_after: Option<Quiet>) -> XidRule {
        XidRule {
            xid,
            action,
            clear_after,
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
            gpu_lost: Some(HealthAction::NoSchedule),
            xids: vec![
                rule(13, HealthAction::NoSchedule, None),
                rule(79, HealthAction::Ignore, None),
            ],
            ..Default::default()
        };
        assert_eq!(c.xid_action(13), HealthAction::NoSchedule);
        assert_eq!(c.xid_action(79), HealthAction::Ignore);
        assert_eq!(c.lost_action(), HealthAction::NoSchedule);
        assert_eq!(c.duplicate_xid(), None);
    }

    /// Quiet periods per XID: NoSchedule XIDs take `xidClearAfter` (5 min by default),
    /// NoExecute ones need a recovery, a rule's `clearAfter` wins either way.
    #[test]
    fn quiet_periods_per_xid_class() {
        let d = HealthConfig::default();
        assert_eq!(d.xid_clear_after(63), Some(300));
        for x in FATAL_XIDS {
            assert_eq!(d.xid_clear_after(x), None, "{x}");
        }
        let c = HealthConfig {
            xid_clear_after: Some(Quiet::After(60)),
            xids: vec![
                rule(48, HealthAction::NoExecute, Some(Quiet::After(3600))),
                rule(63, HealthAction::NoSchedule, Some(Quiet::Never)),
                rule(94, HealthAction::NoExecute, None),
                rule(95, HealthAction::NoSchedule, None),
            ],
            ..Default::default()
        };
        let got: Vec<_> = [48, 63, 94, 95, 64]
            .into_iter()
            .map(|x| c.xid_clear_after(x))
            .collect();
        assert_eq!(got, [Some(3600), None, None, Some(60), Some(60)]);
    }

    /// `<n>s|<n>m|<n>h` and `Never` parse and print back; anything else is refused.
    #[test]
    fn quiet_periods_parse() {
        for (text, want) in [
            ("30s", Some(Quiet::After(30))),
            ("5m", Some(Quiet::After(300))),
            ("2h", Some(Quiet::After(7200))),
            ("Never", Some(Quiet::Never)),
            ("0s", None),
            ("5", None),
            ("m", None),
            ("-1m", None),
            ("1d", None),
            ("never", None),
            ("", None),
            ("99999999999999999999h", None),
            // Regressions: a multi-byte last character panicked (byte split); a sign
            // was accepted.
            ("5µ", None),
            ("µ", None),
            ("5mµ", None),
            ("+5m", None),
            ("05m", None),
            (" 5m", None),
        ] {
            let got = Quiet::try_from(text.to_string()).ok();
            assert_eq!(got, want, "{text:?}");
            if let Some(q) = got {
                assert_eq!(q.to_string(), text);
            }
        }
    }

    /// An XID taints, a stronger event replaces it, a weaker one keeps the first, an
    /// application XID changes nothing, recovery clears.
    #[test]
    fn events_move_a_gpu_between_states() {
        let mut h = NodeHealth::new(HealthConfig::default());
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Xid(13)), at(10)),
            Applied::Ignored
        );
        assert_eq!(h.gpu(1), DeviceHealth::Healthy);
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Xid(63)), at(10)),
            Applied::Changed
        );
        let u = h.unhealthy(1).unwrap();
        assert_eq!(
            (u.cause, u.action, u.since),
            (Cause::Xid(63), HealthAction::NoSchedule, 10)
        );
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Xid(64)), at(11)),
            Applied::Unchanged
        );
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Lost), at(12)),
            Applied::Changed
        );
        let t = h.unhealthy(1).unwrap().taint();
        assert_eq!(t.key, TAINT_KEY);
        assert_eq!(t.value.as_deref(), Some("gpu-lost"));
        assert_eq!(t.effect, "NoExecute");
        assert_eq!(t.time_added.unwrap().0.as_second(), 12);
        assert_eq!(h.gpu(0), DeviceHealth::Healthy);
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Recovered), at(13)),
            Applied::Changed
        );
        assert_eq!(h.gpu(1), DeviceHealth::Healthy);
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Recovered), at(13)),
            Applied::Unchanged
        );
    }

    /// A NoSchedule XID clears once its scope was quiet for the period; a new XID of
    /// the scope (even an equal one that changes nothing visible) restarts the period.
    #[test]
    fn a_noschedule_xid_clears_after_a_quiet_period() {
        let mut h = NodeHealth::new(HealthConfig::default());
        h.apply(&ev(0, HealthEventKind::Xid(63)), at(1_000));
        assert!(h.expire(mono(1_299)).is_empty());
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Xid(64)), at(1_200)),
            Applied::Unchanged
        );
        assert!(
            h.expire(mono(1_300)).is_empty(),
            "the second XID restarted it"
        );
        assert!(h.expire(mono(1_499)).is_empty());
        let cleared = h.expire(mono(1_500));
        assert_eq!(cleared.len(), 1);
        assert_eq!(cleared[0].0, (0, Scope::Gpu));
        assert_eq!(cleared[0].1.since, 1_000, "the taint kept its first time");
        assert_eq!(h.gpu(0), DeviceHealth::Healthy);
        assert!(h.expire(mono(10_000)).is_empty());
    }

    /// Regression (quiet periods ran on the wall clock at 1 s resolution, so an NTP
    /// step cleared taints early or late): they run on the monotonic clock; a wall
    /// clock stepped back an hour changes nothing but the unix times recorded.
    #[test]
    fn quiet_periods_ignore_wall_clock_steps() {
        let mut h = NodeHealth::new(HealthConfig::default());
        h.apply(
            &ev(0, HealthEventKind::Xid(63)),
            At {
                unix: 10_000,
                mono: mono(0),
            },
        );
        h.apply(
            &ev(0, HealthEventKind::Xid(64)),
            At {
                unix: 10_000 - 3_600,
                mono: mono(100),
            },
        );
        assert!(h.expire(mono(399)).is_empty());
        let cleared = h.expire(mono(400));
        assert_eq!(cleared.len(), 1);
        assert_eq!(cleared[0].1.since, 10_000);
    }

    /// Fatal XIDs and losses never clear by time, only when the GPU answers again; a
    /// fatal XID over a NoSchedule one stops its quiet period.
    #[test]
    fn fatal_xids_and_losses_wait_for_recovery() {
        let mut h = NodeHealth::new(HealthConfig::default());
        h.apply(&ev(0, HealthEventKind::Xid(63)), at(0));
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Xid(48)), at(10)),
            Applied::Changed
        );
        h.apply(&ev(1, HealthEventKind::Lost), at(0));
        assert!(h.expire(mono(1_000_000)).is_empty());
        assert_eq!(h.unhealthy(0).unwrap().cause, Cause::Xid(48));
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Recovered), at(20)),
            Applied::Changed
        );
        assert_eq!(
            h.apply(&ev(1, HealthEventKind::Recovered), at(20)),
            Applied::Changed
        );
        assert!(h.all_unhealthy().is_empty());
    }

    /// Regression (a stronger event kept only its own quiet period): with `gpuLost:
    /// NoSchedule`, a NoExecute XID with `clearAfter: 1m` replaces the loss but the
    /// state still never clears by time, since the GPU is still lost.
    #[test]
    fn a_stronger_event_keeps_the_stricter_quiet_period() {
        let mut h = NodeHealth::new(HealthConfig {
            gpu_lost: Some(HealthAction::NoSchedule),
            xids: vec![rule(94, HealthAction::NoExecute, Some(Quiet::After(60)))],
            ..Default::default()
        });
        h.apply(&ev(0, HealthEventKind::Lost), at(0));
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Xid(94)), at(10)),
            Applied::Changed
        );
        let u = h.unhealthy(0).unwrap();
        assert_eq!(
            (u.cause, u.action),
            (Cause::Xid(94), HealthAction::NoExecute)
        );
        assert_eq!(u.clear_after, None);
        assert!(h.expire(mono(1_000_000)).is_empty(), "still lost");
        // The other way round too: the longer of two periods wins.
        let mut h = NodeHealth::new(HealthConfig {
            xids: vec![rule(94, HealthAction::NoExecute, Some(Quiet::After(60)))],
            ..Default::default()
        });
        h.apply(&ev(0, HealthEventKind::Xid(63)), at(0));
        h.apply(&ev(0, HealthEventKind::Xid(94)), at(10));
        assert_eq!(h.unhealthy(0).unwrap().clear_after, Some(300));
        assert!(h.expire(mono(309)).is_empty());
        assert_eq!(h.expire(mono(310)).len(), 1);
    }

    /// With `clearOnRecovery: false` nothing clears: not a recovery, not quiet.
    #[test]
    fn recovery_keeps_the_taint_when_policy_says_so() {
        let mut h = NodeHealth::new(HealthConfig {
            clear_on_recovery: false,
            ..Default::default()
        });
        h.apply(&ev(0, HealthEventKind::Xid(79)), at(5));
        h.apply(&ev(1, HealthEventKind::Xid(63)), at(5));
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Recovered), at(6)),
            Applied::Unchanged
        );
        assert!(h.expire(mono(1_000_000)).is_empty());
        assert!(h.unhealthy(0).is_some() && h.unhealthy(1).is_some());
    }

    /// An XID on a MIG GPU instance (placement 4+2 of 8 memory slices) makes unhealthy
    /// the devices overlapping that placement and the whole GPU, not the partitions
    /// beside it; a GPU-level event covers every device; the stronger state wins per
    /// device; a recovery clears the instance too.
    #[test]
    fn an_instance_xid_covers_only_overlapping_devices() {
        let mut h = NodeHealth::new(HealthConfig::default());
        let gi = Scope::Instance {
            gi_id: 5,
            span: Span { start: 4, size: 2 },
        };
        let e = HealthEvent {
            gi_id: Some(5),
            ..ev(0, HealthEventKind::Xid(48))
        };
        assert_eq!(h.apply_in(&e, gi, at(10)), Applied::Changed);
        assert_eq!(h.unhealthy(0), None, "the GPU itself stays healthy");
        let place = |start, size| Some(Span { start, size });
        for (device, hit) in [
            (None, true),
            (place(4, 2), true),
            (place(5, 1), true),
            (place(4, 4), true),
            (place(0, 8), true),
            (place(0, 4), false),
            (place(6, 1), false),
            (place(3, 1), false),
        ] {
            assert_eq!(h.device(0, device).is_some(), hit, "{device:?}");
        }
        assert_eq!(h.device(1, None), None);
        let u = h.device(0, place(4, 2)).unwrap();
        assert_eq!(u.action, HealthAction::NoExecute);
        assert!(u.message.contains("GPU instance 5"), "{}", u.message);
        // A weaker GPU-level XID: everything NoSchedule, the instance still NoExecute.
        h.apply(&ev(0, HealthEventKind::Xid(63)), at(11));
        assert_eq!(
            h.device(0, place(0, 1)).unwrap().action,
            HealthAction::NoSchedule
        );
        assert_eq!(
            h.device(0, place(4, 1)).unwrap().action,
            HealthAction::NoExecute
        );
        assert_eq!(
            h.apply(&ev(0, HealthEventKind::Recovered), at(12)),
            Applied::Changed
        );
        assert_eq!(h.device(0, place(4, 2)), None);
    }
}
