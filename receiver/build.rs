//! Builds the BPF programs (`ebpf/`) with the nightly toolchain and bpf-linker
//! and leaves the object in OUT_DIR for `include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (lint and doc jobs, hosts without bpf-linker) an
//! empty placeholder is written instead; loading it fails with a clear error.
use std::{env, fs, path::PathBuf};

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let object = out_dir.join("icecore");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip = matches!(env::var("AYA_BUILD_SKIP").as_deref(), Ok("1" | "true"));
    if skip {
        println!("cargo:warning=AYA_BUILD_SKIP set: the BPF programs are not built");
        if let Err(e) = fs::write(&object, b"") {
            panic!("cannot write placeholder {}: {e}", object.display());
        }
        return;
    }
    if which_bpf_linker().is_none() {
        panic!(
            "bpf-linker not found: the BPF programs need it. Run scripts/setup-toolchain.sh \
             (installs nightly rust-src, LLVM 22 and bpf-linker), or set AYA_BUILD_SKIP=1 \
             to build without BPF programs"
        );
    }
    let metadata = match cargo_metadata::MetadataCommand::new().no_deps().exec() {
        Ok(m) => m,
        Err(e) => panic!("cargo metadata failed: {e}"),
    };
    let Some(ebpf) = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "icecore-ebpf")
    else {
        panic!("package icecore-ebpf not found in the workspace");
    };
    let root_dir = ebpf
        .manifest_path
        .parent()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let package = aya_build::Package {
        name: "icecore-ebpf",
        root_dir: &root_dir,
        ..Default::default()
    };
    if let Err(e) = aya_build::build_ebpf([package], aya_build::Toolchain::default()) {
        panic!("building the BPF programs failed: {e:#}");
    }
}

fn which_bpf_linker() -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join("bpf-linker"))
        .find(|p| p.is_file())
}
