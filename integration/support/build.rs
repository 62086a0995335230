// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

//! Building fixtures from `integration/fixtures/` with the system's compilers
//! (gcc, g++, rustc) and binutils, for the tests that need particular code
//! generation (no frame pointers, stripped debug info, shared libraries).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Path of `integration/fixtures/NAME`.
pub fn fixture_source(name: &str) -> PathBuf {
    super::package_dir().join("integration/fixtures").join(name)
}

/// Runs `program ARGS` (a compiler, strip, …) and panics with its output if it fails.
pub fn run_tool<S: AsRef<std::ffi::OsStr>>(program: &str, args: &[S]) {
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    println!("build: {program} {}", shown.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (needed to build a fixture): {e}"));
    assert!(
        out.status.success(),
        "{program} {shown:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles `integration/fixtures/SOURCE` with `compiler FLAGS -o DIR/OUTPUT SOURCE
/// LIBS` and returns the canonical path of the output.
pub fn compile(
    compiler: &str,
    flags: &[&str],
    source: &str,
    libs: &[&str],
    dir: &Path,
    output: &str,
) -> PathBuf {
    let out = dir.join(output);
    let mut args: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    args.push("-o".into());
    args.push(out.display().to_string());
    args.push(fixture_source(source).display().to_string());
    args.extend(libs.iter().map(|l| l.to_string()));
    run_tool(compiler, &args);
    out.canonicalize().expect("canonicalize fixture path")
}

/// `strip --strip-debug INPUT -o DIR/OUTPUT`: drops `.debug_*`, keeps `.symtab`
/// and `.eh_frame`.
pub fn strip_debug(input: &Path, dir: &Path, output: &str) -> PathBuf {
    let out = dir.join(output);
    run_tool(
        "strip",
        &[
            "--strip-debug".to_string(),
            input.display().to_string(),
            "-o".into(),
            out.display().to_string(),
        ],
    );
    out.canonicalize()
        .expect("canonicalize stripped fixture path")
}

/// Section names of an ELF file (from `readelf -SW`).
pub fn elf_sections(path: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-SW")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf: {e}"));
    assert!(
        out.status.success(),
        "readelf -SW {} failed",
        path.display()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // "  [Nr] Name Type …": the name follows the closing bracket.
            let rest = l.trim_start().strip_prefix('[')?;
            let (_, rest) = rest.split_once(']')?;
            rest.split_whitespace().next().map(str::to_string)
        })
        .filter(|name| name.starts_with('.'))
        .collect()
}

/// The `LOAD` program headers of an ELF file, as `readelf -lW` prints them.
pub fn load_segments(path: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf: {e}"));
    assert!(
        out.status.success(),
        "readelf -lW {} failed",
        path.display()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}
