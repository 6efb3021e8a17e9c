//! Generates the gRPC code of the kubelet APIs from `proto/` with `protox` (a protobuf compiler
//! in Rust: no `protoc` on the build machine) and `tonic-prost-build`.

fn main() {
    let files = [
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/dra-health/v1alpha1/api.proto",
        "proto/dra-health/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"]).unwrap_or_else(|e| panic!("proto/: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating gRPC code: {e}"));
}
