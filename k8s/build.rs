//! Generates the gRPC code of the kubelet APIs from `proto/` with `protox` (a protobuf compiler
//! in Rust: no `protoc` on the build machine) and `tonic-prost-build`.
//!
//! The older versions the kubelet still speaks (DRA `v1beta1`, device health `v1alpha1`) carry
//! the same messages under another package: they are made here from the `v1` files, so the
//! interface is written once.

use std::path::Path;

/// `(written file, package line there, derived file, its package line)`.
const DERIVED: [(&str, &str, &str, &str); 2] = [
    (
        "dra/v1/api.proto",
        "package k8s.io.kubelet.pkg.apis.dra.v1;",
        "dra/v1beta1/api.proto",
        "package k8s.io.kubelet.pkg.apis.dra.v1beta1;",
    ),
    (
        "dra-health/v1/api.proto",
        "package v1;",
        "dra-health/v1alpha1/api.proto",
        "package v1alpha1;",
    ),
];

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let derived_dir = Path::new(&out).join("derived-proto");
    for (from, package, to, derived_package) in DERIVED {
        let source = Path::new("proto").join(from);
        println!("cargo:rerun-if-changed={}", source.display());
        let text = std::fs::read_to_string(&source)
            .unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        assert!(
            text.lines().filter(|l| *l == package).count() == 1,
            "{}: expected one line `{package}`",
            source.display()
        );
        let text = text.replace(package, derived_package);
        let target = derived_dir.join(to);
        std::fs::create_dir_all(target.parent().expect("a file in a folder"))
            .and_then(|()| std::fs::write(&target, text))
            .unwrap_or_else(|e| panic!("{}: {e}", target.display()));
    }
    let files = [
        "pluginregistration/v1/api.proto",
        "dra/v1/api.proto",
        "dra/v1beta1/api.proto",
        "dra-health/v1alpha1/api.proto",
        "dra-health/v1/api.proto",
    ];
    println!("cargo:rerun-if-changed=proto/pluginregistration/v1/api.proto");
    let includes = [Path::new("proto"), derived_dir.as_path()];
    let fds = protox::compile(files, includes).unwrap_or_else(|e| panic!("proto/: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating gRPC code: {e}"));
}
