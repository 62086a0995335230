//! Generates the pprof message types from the vendored `proto/profile.proto`,
//! Parca's profile store API from `proto/parca/…/profilestore.proto` and
//! the messages of Pyroscope's push API from `proto/pyroscope/push.proto`.
//! protox parses the schemas in-process because no `protoc` binary is available.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let pprof = protox::compile(["profile.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(pprof)?;
    let parca = protox::compile(
        ["parca/profilestore/v1alpha1/profilestore.proto"],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_fds(parca)?;
    let pyroscope = protox::compile(["pyroscope/push.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(pyroscope)?;
    Ok(())
}
