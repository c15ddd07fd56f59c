// Stands in for sigs.k8s.io/iptables-wrappers v1.0.0, which Kubernetes 1.38's kubelet
// imports and which the module proxy here does not serve (README.md).
module sigs.k8s.io/iptables-wrappers

go 1.26.0

require (
	k8s.io/api v0.38.0-beta.0
	k8s.io/klog/v2 v2.130.1
)
