//! Writes the `runtime_walk` seeds (`runtime_walk::seeds`) to
//! `fuzz/corpus/runtime_walk/`: `cargo run -p icecore-fuzz-targets --example make_runtime_seeds`.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus/runtime_walk");
    std::fs::create_dir_all(&dir)?;
    for (name, input) in icecore_fuzz_targets::runtime_walk::seeds() {
        std::fs::write(dir.join(name), &input)?;
        println!("{name}: {} bytes", input.len());
    }
    Ok(())
}
