//! Generated kubelet gRPC types (see `proto/` and `build.rs`). Package names and field
//! numbers are the kubelet's wire contract.

#![allow(clippy::all, missing_docs)]

/// DRA node service `k8s.io.kubelet.pkg.apis.dra.v1` (advertised as `v1.DRAPlugin`).
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// DRA node service `k8s.io.kubelet.pkg.apis.dra.v1beta1` (advertised as `v1beta1.DRAPlugin`).
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Plugin registration (`pluginregistration`).
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// DRA resource health `v1alpha1`.
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// A minimal CRI `runtime.v1` client subset (containerd end-to-end tests only).
pub mod cri {
    tonic::include_proto!("runtime.v1");
}
