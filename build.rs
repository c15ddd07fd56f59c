//! Compiles the kubelet protos with protox (pure Rust): no system or vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;

    // A minimal CRI `runtime.v1` subset: the containerd end-to-end test's client.
    let cri = "proto/cri/runtime_v1.proto";
    println!("cargo:rerun-if-changed={cri}");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(protox::compile([cri], ["proto"])?)?;
    Ok(())
}
