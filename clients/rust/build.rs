//! Compiles the crate's copy of `herald/v1/frames.proto` into Rust types (prost) and their
//! canonical JSON mapping (pbjson), in pure Rust: no `protoc`, nothing fetched. The same
//! generators and settings as the `herald-proto` crate, so the types are the same; the copy
//! keeps this crate buildable (and publishable) outside the repository, and a test checks
//! it is the contract verbatim.

use std::{env, error::Error, path::PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_source_info(true);
    compiler.open_files(["herald/v1/frames.proto"])?;
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
        // A server newer than this client may send fields or enum values it does not know.
        .ignore_unknown_fields()
        .ignore_unknown_enum_variants()
        .build(&[".herald.v1"])?;
    Ok(())
}
