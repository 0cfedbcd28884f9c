//! Generates the kubelet's gRPC APIs from our .proto files. protox parses them in Rust,
//! so no protoc is needed on any machine that builds us.

use std::path::PathBuf;

const PROTOS: [&str; 6] = [
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1beta1/api.proto",
    "dra-health/v1/api.proto",
    "pluginregistration/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // At run time, not `env!`: a build script compiled for one checkout is run again for
    // another that shares the target directory (CI's newcomer copy), and must read the
    // protos of the one it builds.
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?,
    )
    .join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let descriptors = protox::compile(PROTOS, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
