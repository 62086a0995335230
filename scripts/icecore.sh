#!/usr/bin/env bash
# Builds icecore (installing the BPF toolchain when missing) and runs it with
# the given arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-toolchain.sh
cargo build --release --locked
exec target/release/icecore "$@"
