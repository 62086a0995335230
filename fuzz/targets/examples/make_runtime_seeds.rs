//! Writes the `runtime_walk` and `runtime_objects` seeds (their modules'
//! `seeds`) to `fuzz/corpus/TARGET/`:
//! `cargo run -p icecore-fuzz-targets --example make_runtime_seeds`.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus");
    for (target, seeds) in [
        ("runtime_walk", icecore_fuzz_targets::runtime_walk::seeds()),
        (
            "runtime_objects",
            icecore_fuzz_targets::runtime_objects::seeds(),
        ),
    ] {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, input) in seeds {
            std::fs::write(dir.join(name), &input)?;
            println!("{target}/{name}: {} bytes", input.len());
        }
    }
    Ok(())
}
