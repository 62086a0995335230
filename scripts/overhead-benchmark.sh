#!/bin/bash
# Measures what icecore costs a busy host, beside `perf record --call-graph
# dwarf` + `perf script`, and writes BENCHMARKS.md. Needs root, a C compiler,
# python3 and perf (Debian: linux-perf). Takes about 12 minutes; options go
# to the benchmark (see --help), for example --seconds 60 or --skip-perf.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bin icecore -p icecore -p icecore-benches --bin overhead
exec target/release/overhead --icecore target/release/icecore "$@"
