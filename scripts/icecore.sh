#!/usr/bin/env bash
# Builds icecore (installing the BPF toolchain when missing) and runs it with
# the given arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-toolchain.sh
export PATH=$HOME/.cargo/bin:$PATH  # where a fresh rustup install puts cargo
cargo build --release --locked
exec target/release/icecore "$@"
