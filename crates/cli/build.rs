//! Generates the kubelet device-plugin API (`proto/deviceplugin.proto`) for
//! `cumux device-plugin`, with a protobuf compiler in Rust (no `protoc`).

fn main() {
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    let files = protox::compile(["proto/deviceplugin.proto"], ["proto"])
        .expect("proto/deviceplugin.proto compiles");
    tonic_prost_build::configure()
        .compile_fds(files)
        .expect("the device-plugin API generates");
}
