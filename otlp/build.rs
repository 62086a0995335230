//! Generates the pprof message types from the vendored `proto/profile.proto`.
//! protox parses the schema in-process because no `protoc` binary is available.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/profile.proto");
    let fds = protox::compile(["profile.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
