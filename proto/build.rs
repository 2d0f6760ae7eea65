//! Compiles `herald/v1/*.proto` into Rust types (prost) and, for the client frames, their
//! canonical JSON mapping (pbjson), all in pure Rust: no `protoc`, nothing fetched at build
//! time. The node-to-node frames (`peer.proto`) are protobuf only.

use std::{env, error::Error, path::PathBuf};

const PROTO_ROOT: &str = "herald";
const PROTO_FILES: &[&str] = &["herald/v1/frames.proto", "herald/v1/peer.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    println!("cargo:rerun-if-changed=build.rs");

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_source_info(true);
    compiler.open_files(PROTO_FILES)?;
    let descriptors = compiler.file_descriptor_set();
    let encoded_descriptors = compiler.encode_file_descriptor_set();

    prost_build::Config::new()
        .out_dir(&out_dir)
        // Decoding from a `Bytes` buffer then slices payloads instead of copying them.
        .bytes(["."])
        .compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .out_dir(&out_dir)
        .register_descriptors(&encoded_descriptors)?
        // Forward compatibility, as protobuf's binary form already has: a peer that is
        // newer than us may send fields or enum values we do not know yet.
        .ignore_unknown_fields()
        .ignore_unknown_enum_variants()
        .build(&[".herald.v1"])?;

    Ok(())
}
