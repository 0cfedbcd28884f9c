//! Generates the kubelet's gRPC APIs from our .proto files. protox parses them in Rust,
//! so no protoc is needed on any machine that builds us.

use std::path::PathBuf;

const PROTOS: [&str; 3] = [
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let descriptors = protox::compile(PROTOS, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
