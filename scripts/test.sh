#!/usr/bin/env bash
# Runs every test: lint, host unit tests, and the root end-to-end tests that
# load the BPF programs and profile real processes. Installs the BPF toolchain
# first when it is missing (scripts/setup-toolchain.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-toolchain.sh
command -v clang >/dev/null || { echo "test: clang is needed for the fixtures" >&2; exit 1; }

echo "== format"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== tests"
# One test thread for the end-to-end tests: each one samples the whole machine
# and they would disturb each other's proportions.
cargo test --locked -- --test-threads=1
