//! Replays every fuzz target's committed inputs (`fuzz/corpus/TARGET/` and
//! `fuzz/regressions/TARGET/`) through the target's body, then a bounded
//! number of deterministic mutations of each: a cheap stand-in for
//! libFuzzer that fits CI's test run (the libFuzzer build alone takes
//! 6.5 minutes). It finds regressions on the committed inputs and the
//! shallow crashes near them; `scripts/fuzz.sh` is what explores.
//!
//! A panic fails the test, naming the target, the input and the mutation;
//! the mutated input is written to `target/fuzz-failures/` so that it can
//! be replayed (`cargo fuzz run TARGET FILE`, or this test's `run`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use icecore_fuzz_targets::{TARGETS, Target};

/// Time each target's mutations may take at most (release build, one
/// thread): 13 targets stay under a minute in all.
const MUTATION_BUDGET: Duration = Duration::from_secs(3);
/// Mutations per input at most; the budget usually stops them first.
const MUTATIONS_PER_INPUT: u32 = 50_000;

/// `fuzz/`: this crate is `fuzz/targets/`.
fn fuzz_dir() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest)
}

/// The files of `dir`, sorted; none when it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// A xorshift64 generator: deterministic, so that a failure reproduces.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number below `n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// FNV-1a: a seed per input that does not depend on the order of inputs.
fn seed_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

const BOUNDARY: [u8; 4] = [0, 0xff, 0x7f, 0x80];

/// Mutation `n` of `input`, and what it did. The first ones are
/// systematic (truncations, boundary bytes in the header), the rest drawn
/// from `rng`: bit flips, boundary bytes, random bytes, chunks removed or
/// duplicated, little-endian words set to boundary values.
fn mutate(input: &[u8], n: u32, rng: &mut XorShift, max_len: usize) -> (Vec<u8>, String) {
    let len = input.len();
    let mut out = input.to_vec();
    // Truncations: the first 16 lengths, then 16 spread over the input.
    if n < 32 {
        let at = if n < 16 {
            n as usize
        } else {
            len * (n as usize - 15) / 17
        };
        let at = at.min(len);
        out.truncate(at);
        return (out, format!("truncated to {at} bytes"));
    }
    // Every header byte (the first 64) set to each boundary value.
    if n < 32 + 64 * 4 {
        let i = (n as usize - 32) / 4;
        let value = BOUNDARY[(n as usize - 32) % 4];
        if i < len {
            out[i] = value;
            return (out, format!("byte {i} set to {value:#04x}"));
        }
    }
    if len == 0 {
        let bytes: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
        return (bytes, format!("{len} random bytes"));
    }
    let description = match rng.below(7) {
        0 => {
            let (i, bit) = (rng.below(len), rng.below(8));
            out[i] ^= 1 << bit;
            format!("bit {bit} of byte {i} flipped")
        }
        1 => {
            let (i, value) = (rng.below(len), BOUNDARY[rng.below(4)]);
            out[i] = value;
            format!("byte {i} set to {value:#04x}")
        }
        2 => {
            let (i, value) = (rng.below(len), rng.next() as u8);
            out[i] = value;
            format!("byte {i} set to {value:#04x}")
        }
        3 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            out.drain(start..end);
            format!("bytes {start}..{end} removed")
        }
        4 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            let at = rng.below(len + 1);
            let chunk = input[start..end].to_vec();
            out.splice(at..at, chunk);
            format!("bytes {start}..{end} copied to {at}")
        }
        5 => {
            let i = rng.below(len);
            let width = [2, 4, 8][rng.below(3)].min(len - i);
            let value = [0u64, u64::MAX, i64::MAX as u64, 1 << 63, 1][rng.below(5)];
            out[i..i + width].copy_from_slice(&value.to_le_bytes()[..width]);
            format!("{width} bytes at {i} set to {value:#x} (little-endian)")
        }
        _ => {
            let flips = 2 + rng.below(7);
            for _ in 0..flips {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            format!("{flips} random bit flips")
        }
    };
    out.truncate(max_len);
    (out, description)
}

/// Runs `data` through `target`; on a panic, saves it and describes the failure.
fn run_one(target: &Target, file: &Path, what: &str, data: &[u8]) -> Result<(), String> {
    if catch_unwind(AssertUnwindSafe(|| (target.run)(data))).is_ok() {
        return Ok(());
    }
    let root = fuzz_dir().parent().unwrap_or(fuzz_dir());
    let dir = root.join("target/fuzz-failures");
    let file_name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tag = seed_of(what);
    let saved = dir.join(format!("{}-{file_name}-{tag:016x}", target.name));
    let saved = match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&saved, data)) {
        Ok(()) => saved.display().to_string(),
        Err(e) => format!("(not saved: {e})"),
    };
    Err(format!(
        "{}: {} ({what}) panicked; input saved as {saved}",
        target.name,
        file.display()
    ))
}

/// A cargo-fuzz binary without an entry in `TARGETS` would never be
/// replayed, and an entry without a binary never fuzzed.
#[test]
fn every_cargo_fuzz_binary_is_replayed() {
    let mut binaries: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    binaries.sort();
    let mut listed: Vec<String> = TARGETS.iter().map(|t| t.name.to_owned()).collect();
    listed.sort();
    assert!(!binaries.is_empty(), "no fuzz/fuzz_targets/*.rs");
    assert_eq!(binaries, listed);
}

#[test]
fn every_target_survives_its_corpus_and_mutations_of_it() {
    let started = Instant::now();
    let mut failures = Vec::new();
    for target in TARGETS {
        let target_started = Instant::now();
        let corpus = files(&fuzz_dir().join("corpus").join(target.name));
        if corpus.is_empty() {
            failures.push(format!(
                "{}: fuzz/corpus/{} is missing or empty",
                target.name, target.name
            ));
            continue;
        }
        let regressions = files(&fuzz_dir().join("regressions").join(target.name));
        let inputs: Vec<(PathBuf, Vec<u8>)> = corpus
            .into_iter()
            .chain(regressions)
            .filter_map(|path| match std::fs::read(&path) {
                Ok(data) => Some((path, data)),
                Err(e) => {
                    failures.push(format!("{}: {}: {e}", target.name, path.display()));
                    None
                }
            })
            .collect();
        let mut failed = false;
        for (path, data) in &inputs {
            if let Err(e) = run_one(target, path, "as committed", data) {
                failures.push(e);
                failed = true;
            }
        }
        // Mutations, round-robin over the inputs so that each gets its
        // share of the budget.
        let mut rngs: Vec<XorShift> = inputs
            .iter()
            .map(|(path, _)| XorShift::new(seed_of(&path.to_string_lossy())))
            .collect();
        let deadline = Instant::now() + MUTATION_BUDGET;
        let mut mutations = 0u64;
        'rounds: for n in 0..MUTATIONS_PER_INPUT {
            for ((path, data), rng) in inputs.iter().zip(&mut rngs) {
                if failed || Instant::now() >= deadline {
                    break 'rounds;
                }
                let (mutated, description) = mutate(data, n, rng, target.max_len);
                let what = format!("mutation {n}: {description}");
                mutations += 1;
                if let Err(e) = run_one(target, path, &what, &mutated) {
                    failures.push(e);
                    failed = true;
                }
            }
        }
        println!(
            "replay: {}: {} inputs replayed, {mutations} mutations run, {:.1} s",
            target.name,
            inputs.len(),
            target_started.elapsed().as_secs_f64()
        );
    }
    icecore_fuzz_targets::remove_scratch_files();
    println!(
        "replay: {} targets in {:.1} s",
        TARGETS.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
