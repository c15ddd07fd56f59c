//! ResourceClaims as the scheduler leaves them, for the tests, benchmarks and demo: one
//! builder ([`ClaimBuilder`]) for the claim's metadata, its requests, and the allocation
//! status (results, opaque configs, the pod it is reserved for). Deterministic: no I/O.

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClaim,
    DeviceRequest, DeviceRequestAllocationResult, DeviceSubRequest, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimSpec,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

/// The driver name the tests run the plugin under.
pub const DRIVER: &str = "gpu.tessera.dev";
/// The mock node's name, which is also its pool's.
pub const NODE: &str = "node-a";
/// The namespace of the tests' claims.
pub const NS: &str = "default";
/// The device class of the tests' requests.
pub const DEVICE_CLASS: &str = "gpu.tessera.dev";

/// An allocation result of [`DRIVER`] for `request` (`req/sub` for a subrequest):
/// `device` of `pool`.
pub fn result(request: &str, pool: &str, device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.into(),
        driver: DRIVER.into(),
        pool: pool.into(),
        device: device.into(),
        ..Default::default()
    }
}

/// An allocation result for a share (`share_id`) of a shared GPU of [`NODE`], with the
/// `consumedCapacity` the scheduler would have computed.
pub fn shared_result(
    request: &str,
    device: &str,
    share_id: &str,
    memory: &str,
    compute: &str,
) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        share_id: Some(share_id.into()),
        consumed_capacity: Some(
            [("memory", memory), ("compute", compute)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        ),
        ..result(request, NODE, device)
    }
}

/// A ResourceClaim, built up from its name: metadata, requests, then the allocation.
/// [`ClaimBuilder::build`] sets a status only when something was allocated or
/// reserved. The one builder of the tests, benchmarks and demo.
#[derive(Clone, Debug)]
pub struct ClaimBuilder {
    claim: ResourceClaim,
    results: Vec<DeviceRequestAllocationResult>,
    configs: Vec<DeviceAllocationConfiguration>,
    allocation: Option<AllocationResult>,
    reserved_for: Option<Vec<ResourceClaimConsumerReference>>,
}

impl ClaimBuilder {
    /// A claim `name` in [`NS`], without spec or status.
    pub fn new(name: &str) -> Self {
        Self::from_claim(ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            spec: None,
            status: None,
        })
    }

    /// Starts from `claim` (its metadata and spec kept; its status replaced when
    /// something is allocated or reserved).
    pub fn from_claim(claim: ResourceClaim) -> Self {
        ClaimBuilder {
            claim,
            results: Vec::new(),
            configs: Vec::new(),
            allocation: None,
            reserved_for: None,
        }
    }

    /// Sets the UID (as the API server would have).
    pub fn uid(mut self, uid: &str) -> Self {
        self.claim.metadata.uid = Some(uid.into());
        self
    }

    /// Sets the spec.
    pub fn spec(mut self, spec: ResourceClaimSpec) -> Self {
        self.claim.spec = Some(spec);
        self
    }

    /// Allocates `result`.
    pub fn allocated(mut self, result: DeviceRequestAllocationResult) -> Self {
        self.results.push(result);
        self
    }

    /// Takes `allocation` as it is (one the scheduler's model computed), instead of
    /// one made of the results and configs given here.
    pub fn allocation(mut self, allocation: AllocationResult) -> Self {
        self.allocation = Some(allocation);
        self
    }

    /// Allocates `device` of `pool` for `request` (see [`result`]).
    pub fn device(self, request: &str, pool: &str, device: &str) -> Self {
        self.allocated(result(request, pool, device))
    }

    /// Adds an opaque config of [`DRIVER`] from `source` (`FromClaim`, `FromClass`) for
    /// `requests` (all of them when empty).
    pub fn opaque_config(
        mut self,
        source: &str,
        requests: &[&str],
        parameters: serde_json::Value,
    ) -> Self {
        self.configs.push(DeviceAllocationConfiguration {
            source: source.into(),
            requests: Some(requests.iter().map(|s| s.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: DRIVER.into(),
                parameters: RawExtension(parameters),
            }),
        });
        self
    }

    /// Reserves the claim for the pod `<name>-pod` (UID `<name>-pod-uid`).
    pub fn reserved_for_its_pod(mut self) -> Self {
        let name = self.claim.metadata.name.clone().unwrap_or_default();
        self.reserved_for = Some(vec![ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: format!("{name}-pod"),
            uid: format!("{name}-pod-uid"),
            api_group: None,
        }]);
        self
    }

    /// Reserves the claim for the PodGroup `group` (UID `<group>-uid`) rather than for
    /// pods, as the 1.37 scheduler does for a PodGroup's claim (DRAWorkloadResourceClaims).
    pub fn reserved_for_pod_group(mut self, group: &str) -> Self {
        self.reserved_for = Some(vec![ResourceClaimConsumerReference {
            api_group: Some("scheduling.k8s.io".into()),
            resource: "podgroups".into(),
            name: group.into(),
            uid: format!("{group}-uid"),
        }]);
        self
    }

    /// A spec with one request per allocated request name, in the order of the results:
    /// an exact request of [`DEVICE_CLASS`], or, for a `req/sub` result, a
    /// `firstAvailable` request with that subrequest.
    pub fn requests_of_results(mut self) -> Self {
        let mut requests: Vec<(String, Option<String>)> = self
            .results
            .iter()
            .map(|r| match r.request.split_once('/') {
                Some((req, sub)) => (req.to_string(), Some(sub.to_string())),
                None => (r.request.clone(), None),
            })
            .collect();
        requests.dedup();
        let requests = requests
            .into_iter()
            .map(|(name, sub)| match sub {
                None => DeviceRequest {
                    name,
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: DEVICE_CLASS.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Some(sub) => DeviceRequest {
                    name,
                    first_available: Some(vec![DeviceSubRequest {
                        name: sub,
                        device_class_name: DEVICE_CLASS.into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            })
            .collect();
        self.claim.spec = Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        });
        self
    }

    /// The status: the allocation given, or else the one of the results and configs
    /// (`config` absent when there are none); and the reservation.
    pub fn status(&self) -> ResourceClaimStatus {
        let allocation = self.allocation.clone().unwrap_or_else(|| AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(self.results.clone()),
                config: (!self.configs.is_empty()).then(|| self.configs.clone()),
            }),
            ..Default::default()
        });
        ResourceClaimStatus {
            allocation: Some(allocation),
            reserved_for: self.reserved_for.clone(),
            devices: None,
        }
    }

    /// The claim: with [`ClaimBuilder::status`] when something was allocated or
    /// reserved, else as given.
    pub fn build(self) -> ResourceClaim {
        let mut claim = self.claim.clone();
        if !self.results.is_empty() || self.allocation.is_some() || self.reserved_for.is_some() {
            claim.status = Some(self.status());
        }
        claim
    }
}
