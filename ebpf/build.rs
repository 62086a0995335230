//! Rebuild the BPF programs when bpf-linker changes: the linker is part of the
//! toolchain that produces them.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
