//! The node configuration (`config.tessera.dev/v1alpha1`, kind `NodeConfig`): which
//! GPUs Tessera manages and in which mode. Decoding is strict and versioned; every
//! error names the offending field.
//!
//! ```yaml
//! apiVersion: config.tessera.dev/v1alpha1
//! kind: NodeConfig
//! gpus:                 # first matching rule wins; unmatched GPUs get the default mode
//! - match: {minor: 0}   # exactly one of uuid, minor, product
//!   mode: mig           # exclusive | mig | shared
//! - match: {product: "Tesla T4"}
//!   mode: exclusive
//! exclude:              # GPUs Tessera never publishes
//! - uuid: GPU-6c1f0d52-93a4-4e0b-8a27-51de3b9c7e44
//! sliceLayout: auto     # auto | split (1.35 and later) | combined (1.34)
//! sharedSlots: 4        # fallback slots per shared GPU; must divide 100
//! defaultMode: shared   # mode of unmatched GPUs (default: mig if MIG-capable, else exclusive)
//! health:               # optional: what device health events do (see `device_health::policy`)
//!   clearOnRecovery: true   # clear taints when health returns (default true)
//!   xidClearAfter: 5m       # NoSchedule XID taints clear after this long without a
//!                           # new XID (<n>s|<n>m|<n>h|Never; default 5m); NoExecute
//!                           # ones and losses clear when the lost GPU answers again
//!   gpuLost: NoExecute      # Ignore | NoSchedule | NoExecute (default NoExecute)
//!   xids:                   # overrides of the default XID classes: application XIDs
//!   - {xid: 63, action: Ignore}  # (13 31 43 45 68 109) Ignore, fatal ones (48 79 95
//!                               # 119 120) NoExecute, the rest NoSchedule
//!   - {xid: 94, action: NoSchedule, clearAfter: 30m}  # its own quiet period
//! ```
//!
//! Default mode: `mig` for MIG-capable GPUs, `exclusive` otherwise. `shared` is opt-in.

pub mod typemeta;

use serde::{Deserialize, Serialize};

use crate::device_health::policy::HealthConfig;
use crate::inventory::{GpuInfo, NodeInventory};

pub const API_VERSION: &str = "config.tessera.dev/v1alpha1";
pub const KIND: &str = "NodeConfig";

/// How Tessera offers one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// A plain whole GPU (`type: gpu`).
    Exclusive,
    /// The whole GPU plus its MIG partitions, made exclusive through counters.
    Mig,
    /// One multi-allocatable device with consumable memory and compute.
    Shared,
}

impl GpuMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuMode::Exclusive => "exclusive",
            GpuMode::Mig => "mig",
            GpuMode::Shared => "shared",
        }
    }
}

/// Which ResourceSlice layout to use for counters (see the slices module).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SliceLayout {
    /// Chosen from the API server version: `combined` on 1.34, `split` on ≥1.35.
    #[default]
    Auto,
    /// Counter sets in slices of their own (Kubernetes ≥1.35).
    Split,
    /// Counter sets in the same slice as the devices that consume them (1.34).
    Combined,
}

impl SliceLayout {
    /// Why a server of `version` cannot take this layout, if it cannot: 1.34 looks for
    /// a device's counter set in the device's own slice, and ≥1.35 refuses a slice
    /// holding both (KEP-4815). The plugin refuses to start with such a layout rather
    /// than publish a pool the server refuses or the scheduler cannot allocate from.
    pub fn problem_for(self, version: k8s_model::release::KubeVersion) -> Option<String> {
        match (self, version.counters_in_own_slices()) {
            (SliceLayout::Combined, true) => Some(format!(
                "sliceLayout: combined: Kubernetes {version} refuses a ResourceSlice holding both counter sets and devices (since 1.35); use auto or split"
            )),
            (SliceLayout::Split, false) => Some(format!(
                "sliceLayout: split: Kubernetes {version} looks for a device's counter set in the device's own ResourceSlice (until 1.35); use auto or combined"
            )),
            _ => None,
        }
    }
}

/// Selects GPUs. Exactly one field must be set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// Exact NVML product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
}

impl GpuSelector {
    pub fn matches(&self, gpu: &GpuInfo) -> bool {
        match (&self.uuid, self.minor, &self.product) {
            (Some(u), _, _) => u.eq_ignore_ascii_case(&gpu.uuid),
            (_, Some(m), _) => m == gpu.minor,
            (_, _, Some(p)) => p == &gpu.product_name,
            _ => false,
        }
    }

    fn set_fields(&self) -> usize {
        usize::from(self.uuid.is_some())
            + usize::from(self.minor.is_some())
            + usize::from(self.product.is_some())
    }
}

/// One `gpus[]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuRule {
    #[serde(rename = "match")]
    pub selector: GpuSelector,
    pub mode: GpuMode,
}

fn default_shared_slots() -> u32 {
    4
}

/// The decoded node configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub gpus: Vec<GpuRule>,
    #[serde(default)]
    pub exclude: Vec<GpuSelector>,
    #[serde(default)]
    pub slice_layout: SliceLayout,
    #[serde(default = "default_shared_slots")]
    pub shared_slots: u32,
    /// Mode of GPUs no rule matches; absent: `mig` if MIG-capable, else `exclusive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<GpuMode>,
    /// What device health events do; absent: the defaults of [`HealthConfig`].
    #[serde(default, skip_serializing_if = "HealthConfig::is_default")]
    pub health: HealthConfig,
    /// Write KEP-5304 device metadata files at prepare and mount them into the
    /// containers (`src/prepare/device_metadata.rs`); off unless set, as in the Go
    /// helper library (the shipped configs set it).
    #[serde(default)]
    pub device_metadata: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            gpus: Vec::new(),
            exclude: Vec::new(),
            slice_layout: SliceLayout::Auto,
            shared_slots: default_shared_slots(),
            default_mode: None,
            health: HealthConfig::default(),
            device_metadata: false,
        }
    }
}

/// A configuration error, naming the field (`gpus[1].mode`) it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node config {source_name}: {field}: {message}")]
pub struct ConfigError {
    /// Where the config came from (a file path, or `built-in`).
    pub source_name: String,
    /// The offending field path; `.` for the document itself.
    pub field: String,
    pub message: String,
}

/// One GPU with the mode the config gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedGpu {
    pub gpu: GpuInfo,
    pub mode: GpuMode,
}

impl NodeConfig {
    /// The config a mock node description embeds, if any, decoded strictly.
    pub fn embedded_in(
        node: &crate::inventory::mock::MockNode,
    ) -> Result<Option<Self>, ConfigError> {
        node.embedded_config_document()
            .map(|(v, name)| Self::from_value(v.clone(), &name))
            .transpose()
    }
}

impl ManagedGpu {
    /// Whether a `mig`-mode GPU gets dynamic partitions: its model is catalogued and it
    /// either switches MIG without a reset (Hopper+) or already has MIG on (Ampere, which
    /// Tessera never resets). Otherwise it behaves as `exclusive`.
    pub fn mig_model(&self) -> Option<&'static crate::mig::GpuModel> {
        if self.mode != GpuMode::Mig || !self.gpu.mig_capable {
            return None;
        }
        let model = crate::mig::model_for_product(&self.gpu.product_name)?;
        (model.reset_free_mig_toggle || self.gpu.mig_enabled).then_some(model)
    }
}

impl NodeConfig {
    /// Decodes and validates a YAML (or JSON) document. Unknown fields, a wrong
    /// `apiVersion`/`kind`, and invalid values are errors naming the field.
    pub fn from_yaml(text: &str, source_name: &str) -> Result<Self, ConfigError> {
        yaml_guard::check(text).map_err(|e| ConfigError {
            source_name: source_name.into(),
            field: ".".into(),
            message: e.to_string(),
        })?;
        let value: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError {
                source_name: source_name.into(),
                field: ".".into(),
                message: format!("not valid YAML: {e}"),
            })?;
        Self::from_value(value, source_name)
    }

    /// Decodes from an already parsed YAML value (e.g. the `config:` of a mock node).
    pub fn from_value(value: serde_yaml_ng::Value, source_name: &str) -> Result<Self, ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            source_name: source_name.into(),
            field: field.into(),
            message,
        };
        crate::config::typemeta::check(
            value.get("apiVersion").and_then(|v| v.as_str()),
            value.get("kind").and_then(|v| v.as_str()),
            API_VERSION,
            KIND,
        )
        .map_err(|(field, message)| err(field, message))?;
        let cfg: NodeConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            err(&path, e.into_inner().to_string())
        })?;
        cfg.validate(source_name)?;
        Ok(cfg)
    }

    fn validate(&self, source_name: &str) -> Result<(), ConfigError> {
        let err = |field: String, message: String| ConfigError {
            source_name: source_name.into(),
            field,
            message,
        };
        for (i, rule) in self.gpus.iter().enumerate() {
            if rule.selector.set_fields() != 1 {
                return Err(err(
                    format!("gpus[{i}].match"),
                    "exactly one of uuid, minor, product must be set".into(),
                ));
            }
        }
        for (i, sel) in self.exclude.iter().enumerate() {
            if sel.set_fields() != 1 {
                return Err(err(
                    format!("exclude[{i}]"),
                    "exactly one of uuid, minor, product must be set".into(),
                ));
            }
        }
        if let Some((field, why)) = self.health.problem() {
            return Err(err(format!("health.{field}"), why));
        }
        if self.shared_slots == 0 || 100 % self.shared_slots != 0 {
            return Err(err(
                "sharedSlots".into(),
                format!(
                    "{} does not divide 100 (each slot's compute share is 100/N percent)",
                    self.shared_slots
                ),
            ));
        }
        Ok(())
    }

    /// Decides each GPU's mode: excluded GPUs are dropped, the first matching rule
    /// wins, and unmatched GPUs get the default (`mig` if MIG-capable, else
    /// `exclusive`). Deterministic. Fails when a rule asks for `mig` on a GPU that is
    /// not MIG-capable, naming the rule.
    pub fn resolve(
        &self,
        inventory: &NodeInventory,
        source_name: &str,
    ) -> Result<Vec<ManagedGpu>, ConfigError> {
        let mut out = Vec::with_capacity(inventory.gpus.len());
        for gpu in &inventory.gpus {
            if self.exclude.iter().any(|s| s.matches(gpu)) {
                continue;
            }
            let rule = self
                .gpus
                .iter()
                .enumerate()
                .find(|(_, r)| r.selector.matches(gpu));
            let mode = match rule {
                Some((i, r)) => {
                    if r.mode == GpuMode::Mig && !gpu.mig_capable {
                        return Err(ConfigError {
                            source_name: source_name.into(),
                            field: format!("gpus[{i}].mode"),
                            message: format!(
                                "gpu-{} ({}) is not MIG-capable",
                                gpu.minor, gpu.product_name
                            ),
                        });
                    }
                    r.mode
                }
                // `defaultMode: mig` applies to MIG-capable GPUs only; the rest are whole.
                None => match self.default_mode {
                    Some(GpuMode::Mig) | None if gpu.mig_capable => GpuMode::Mig,
                    Some(GpuMode::Mig) | None => GpuMode::Exclusive,
                    Some(m) => m,
                },
            };
            let least = min_shared_memory(self.shared_slots);
            if mode == GpuMode::Shared && gpu.memory_bytes < least {
                return Err(ConfigError {
                    source_name: source_name.into(),
                    field: rule.map_or("defaultMode".into(), |(i, _)| format!("gpus[{i}].mode")),
                    message: format!(
                        "gpu-{} has {} bytes of memory, too little to share: a shared GPU needs at least {} MiB (one 1 MiB step above the 1 MiB minimum, and 1 MiB per fallback slot)",
                        gpu.minor,
                        gpu.memory_bytes,
                        least / crate::inventory::sizing::MIB
                    ),
                });
            }
            out.push(ManagedGpu {
                gpu: gpu.clone(),
                mode,
            });
        }
        Ok(out)
    }
}

/// The least memory a `shared` GPU can be published with: its `memory` capacity's
/// request policy (minimum 1 MiB, step 1 MiB) needs one step above the minimum, and each
/// fallback slot at least 1 MiB (the API server refuses the pool otherwise).
fn min_shared_memory(slots: u32) -> u64 {
    u64::from(slots.max(2)) * crate::inventory::sizing::MIB
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::mock::MockNode;

    /// Regression (fuzz target node_config): a shared GPU reporting 1000 bytes of memory
    /// published a `memory` capacity of 0 with a 1 MiB minimum, and the API server
    /// refused the whole pool. It is refused by the config, naming the GPU.
    #[test]
    fn a_gpu_too_small_to_share_is_refused() {
        let node = MockNode::embedded_default().unwrap();
        let mut inv = node.inventory();
        inv.gpus[1].memory_bytes = 1000;
        let cfg = NodeConfig::from_yaml(&format!("{HEAD}defaultMode: shared\n"), "t").unwrap();
        let e = cfg.resolve(&inv, "t").unwrap_err();
        assert_eq!(e.field, "defaultMode");
        assert!(
            e.message
                .starts_with("gpu-1 has 1000 bytes of memory, too little to share"),
            "{}",
            e.message
        );
        // With 4 slots, 4 MiB is enough; 4 MiB - 1 is not.
        inv.gpus[1].memory_bytes = 4 << 20;
        assert!(cfg.resolve(&inv, "t").is_ok());
        inv.gpus[1].memory_bytes = (4 << 20) - 1;
        assert!(cfg.resolve(&inv, "t").is_err());
    }

    const HEAD: &str = "apiVersion: config.tessera.dev/v1alpha1\nkind: NodeConfig\n";

    /// Regression (fuzz target node_config): `sliceLayout: combined` published slices
    /// that a 1.36 server refuses. Each explicit layout fits one side of the 1.35 shape
    /// change; `auto` fits every release.
    #[test]
    fn a_slice_layout_is_refused_for_releases_that_cannot_take_it() {
        use k8s_model::release::KubeVersion;
        let v = |m| KubeVersion::new(m).unwrap();
        for m in KubeVersion::ALL.map(KubeVersion::minor) {
            assert_eq!(SliceLayout::Auto.problem_for(v(m)), None);
        }
        assert_eq!(SliceLayout::Combined.problem_for(v(34)), None);
        let p = SliceLayout::Combined.problem_for(v(36)).unwrap();
        assert!(
            p.starts_with("sliceLayout: combined: Kubernetes 1.36 refuses"),
            "{p}"
        );
        assert_eq!(SliceLayout::Split.problem_for(v(35)), None);
        let p = SliceLayout::Split.problem_for(v(34)).unwrap();
        assert!(p.starts_with("sliceLayout: split: Kubernetes 1.34"), "{p}");
    }

    /// Each malformed config is refused with an error naming its field.
    #[test]
    fn config_errors_name_the_field() {
        let cases = [
            (
                "apiVersion: config.tessera.dev/v2\nkind: NodeConfig\n",
                "apiVersion",
            ),
            ("kind: NodeConfig\n", "apiVersion"),
            (
                "apiVersion: config.tessera.dev/v1alpha1\nkind: Other\n",
                "kind",
            ),
            ("colour: blue\n", "colour"),
            (
                "gpus:\n- match: {minor: 0}\n  mode: fractional\n",
                "gpus[0].mode",
            ),
            (
                "gpus:\n- match: {minor: 0}\n  mode: mig\n  extra: 1\n",
                "gpus[0].extra",
            ),
            (
                "gpus:\n- match: {minor: 0, uuid: GPU-x}\n  mode: mig\n",
                "gpus[0].match",
            ),
            ("gpus:\n- match: {}\n  mode: mig\n", "gpus[0].match"),
            (
                "gpus:\n- match: {minor: -1}\n  mode: mig\n",
                "gpus[0].match.minor",
            ),
            ("exclude:\n- {}\n", "exclude[0]"),
            ("sliceLayout: sideways\n", "sliceLayout"),
            ("sharedSlots: 3\n", "sharedSlots"),
            ("sharedSlots: 0\n", "sharedSlots"),
            ("gpus: {minor: 0}\n", "gpus"),
            ("health: {gpuLost: Evict}\n", "health.gpuLost"),
            ("health: {colour: red}\n", "health.colour"),
            ("health: {xidClearAfter: 0s}\n", "health.xidClearAfter"),
            ("health: {xidClearAfter: 5}\n", "health.xidClearAfter"),
            ("health: {xidClearAfter: forever}\n", "health.xidClearAfter"),
            // Regression: a multi-byte last character panicked the decoder.
            ("health: {xidClearAfter: 5µ}\n", "health.xidClearAfter"),
            ("health: {xidClearAfter: +5m}\n", "health.xidClearAfter"),
            (
                "health:\n  xids:\n  - {xid: 63, action: NoSchedule, clearAfter: 2d}\n",
                "health.xids[0].clearAfter",
            ),
            (
                "health:\n  xids:\n  - {xid: 63, action: NoSchedule, after: 2m}\n",
                "health.xids[0].after",
            ),
            (
                "health:\n  xids:\n  - {xid: 79, action: Ignore}\n  - {xid: 79, action: NoExecute}\n",
                "health.xids[1].xid",
            ),
            // Settings that would be silently ignored.
            (
                "health:\n  xids:\n  - {xid: 63, action: NoSchedule}\n  - {xid: 79, action: Ignore, clearAfter: 1h}\n",
                "health.xids[1].clearAfter",
            ),
            (
                "health: {clearOnRecovery: false, xidClearAfter: 5m}\n",
                "health.xidClearAfter",
            ),
            (
                "health:\n  clearOnRecovery: false\n  xids:\n  - {xid: 48, action: NoExecute, clearAfter: 1h}\n",
                "health.xids[0].clearAfter",
            ),
        ];
        for (body, field) in cases {
            let text = if body.starts_with("apiVersion") || body.starts_with("kind") {
                body.to_string()
            } else {
                format!("{HEAD}{body}")
            };
            let err = NodeConfig::from_yaml(&text, "test.yaml").unwrap_err();
            assert_eq!(err.field, field, "{body:?}: {err}");
            assert!(
                err.to_string().starts_with("node config test.yaml: "),
                "{err}"
            );
        }
    }

    /// The `health:` section decodes, and a config without it gets the defaults.
    #[test]
    fn health_section_decodes_with_defaults() {
        let c = NodeConfig::from_yaml(
            &format!("{HEAD}health:\n  clearOnRecovery: false\n  xids:\n  - {{xid: 13, action: NoSchedule}}\n"),
            "t",
        )
        .unwrap();
        assert!(!c.health.clear_on_recovery);
        assert_eq!(
            c.health.xid_action(13),
            crate::device_health::policy::HealthAction::NoSchedule
        );
        let d = NodeConfig::from_yaml(HEAD, "t").unwrap();
        assert!(d.health.is_default() && d.health.clear_on_recovery);
        assert_eq!(d.health.xid_clear_after(63), Some(300));
        let q = NodeConfig::from_yaml(
            &format!("{HEAD}health:\n  xidClearAfter: 90s\n  xids:\n  - {{xid: 48, action: NoExecute, clearAfter: 1h}}\n  - {{xid: 64, action: NoSchedule, clearAfter: Never}}\n"),
            "t",
        )
        .unwrap();
        let got: Vec<_> = [63, 48, 64, 79]
            .into_iter()
            .map(|x| q.health.xid_clear_after(x))
            .collect();
        assert_eq!(got, [Some(90), Some(3600), None, None]);
        // It serializes back to what it decoded.
        let again = NodeConfig::from_value(serde_yaml_ng::to_value(&q).unwrap(), "t").unwrap();
        assert_eq!(again, q);
    }

    /// Not valid YAML at all is an error about the document.
    #[test]
    fn invalid_yaml_is_an_error_about_the_document() {
        let err = NodeConfig::from_yaml("gpus: [", "x").unwrap_err();
        assert_eq!(err.field, ".");
        // Nesting deeper than the parser accepts is refused before it scans (fuzzing
        // found 20,000 nested flow collections taking it seconds).
        let deep = format!("{HEAD}gpus: {}", "[".repeat(20_000));
        let err = NodeConfig::from_yaml(&deep, "x").unwrap_err();
        assert!(err.message.contains("nested more than 128 deep"), "{err}");
    }

    /// `defaultMode` sets unmatched GPUs' mode; `mig` still only on MIG-capable GPUs.
    #[test]
    fn default_mode_applies_to_unmatched_gpus() {
        let inv = MockNode::embedded_default().unwrap().inventory();
        let modes = |yaml: &str| -> Vec<GpuMode> {
            NodeConfig::from_yaml(&format!("{HEAD}{yaml}"), "t")
                .unwrap()
                .resolve(&inv, "t")
                .unwrap()
                .iter()
                .map(|m| m.mode)
                .collect()
        };
        use GpuMode::*;
        assert_eq!(
            modes("defaultMode: shared\n"),
            [Shared, Shared, Shared, Shared]
        );
        assert_eq!(
            modes("defaultMode: exclusive\ngpus:\n- match: {minor: 1}\n  mode: shared\n"),
            [Exclusive, Shared, Exclusive, Exclusive]
        );
        assert_eq!(
            modes("defaultMode: mig\n"),
            [Mig, Mig, Exclusive, Exclusive]
        );
        assert!(NodeConfig::from_yaml(&format!("{HEAD}defaultMode: half\n"), "t").is_err());
    }

    /// Modes resolve: first matching rule wins, exclusions drop GPUs, defaults follow
    /// MIG capability, and `mig` on a GPU without MIG is refused naming the rule.
    #[test]
    fn modes_resolve_by_rule_then_default() {
        let inv = MockNode::embedded_default().unwrap().inventory();
        let cfg = NodeConfig::from_yaml(
            &format!(
                "{HEAD}gpus:\n- match: {{product: Tesla T4}}\n  mode: shared\n- match: {{minor: 2}}\n  mode: exclusive\nexclude:\n- minor: 3\n"
            ),
            "t",
        )
        .unwrap();
        let got: Vec<_> = cfg
            .resolve(&inv, "t")
            .unwrap()
            .iter()
            .map(|m| (m.gpu.minor, m.mode))
            .collect();
        assert_eq!(
            got,
            [(0, GpuMode::Mig), (1, GpuMode::Mig), (2, GpuMode::Shared)]
        );
        let bad = NodeConfig::from_yaml(&format!("{HEAD}gpus:\n- match: {{minor: 0}}\n  mode: exclusive\n- match: {{minor: 3}}\n  mode: mig\n"), "t").unwrap();
        let err = bad.resolve(&inv, "t").unwrap_err();
        assert_eq!(err.field, "gpus[1].mode");
        assert!(err.message.contains("not MIG-capable"), "{err}");
        let defaults = NodeConfig::default().resolve(&inv, "t").unwrap();
        let modes: Vec<_> = defaults.iter().map(|m| m.mode).collect();
        assert_eq!(
            modes,
            [
                GpuMode::Mig,
                GpuMode::Mig,
                GpuMode::Exclusive,
                GpuMode::Exclusive
            ]
        );
    }
}
