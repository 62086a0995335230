#!/bin/bash
# Measures what becomes of short-lived processes' samples (2,500 processes of
# 20 ms) and icecore's memory during and after a rustc loop, and writes the
# `robustness` section of BENCHMARKS.md. Needs root, a C compiler and rustc.
# Takes about 5 minutes; options go to the benchmark (see --help), for
# example --processes 500 or --skip-memory.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bin icecore -p icecore -p icecore-benches --bin robustness
exec target/release/robustness --icecore target/release/icecore "$@"
