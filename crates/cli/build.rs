//! Generates the kubelet's device-plugin and pod-resources APIs (`proto/`) for
//! `cumux device-plugin`, with a protobuf compiler in Rust (no `protoc`).

fn main() {
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    println!("cargo:rerun-if-changed=proto/podresources.proto");
    let files = protox::compile(
        ["proto/deviceplugin.proto", "proto/podresources.proto"],
        ["proto"],
    )
    .expect("the kubelet's APIs in proto/ compile");
    tonic_prost_build::configure()
        .compile_fds(files)
        .expect("the device-plugin API generates");
}
