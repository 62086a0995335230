#!/usr/bin/env bash
# Installs what building icecore's BPF programs needs on Debian 12:
# nightly rust-src (for -Z build-std=core), LLVM 22 (bpf-linker links the
# bitcode of nightly's LLVM 22) and bpf-linker itself. Idempotent: every step
# checks first, so a second run costs a few seconds.
set -euo pipefail

log() { printf 'setup: %s\n' "$*" >&2; }

need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
command -v clang >/dev/null || need_apt+=(clang)
[[ -d /usr/lib/llvm-22/lib/cmake/llvm ]] || need_apt+=(llvm-22-dev libpolly-22-dev)
# libz and libzstd: bpf-linker links LLVM dynamically, which wants them.
dpkg -s zlib1g-dev >/dev/null 2>&1 || need_apt+=(zlib1g-dev)
dpkg -s libzstd-dev >/dev/null 2>&1 || need_apt+=(libzstd-dev)
if ((${#need_apt[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing packages ${need_apt[*]}: run this script as root once"; exit 1
  fi
  log "installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# A fresh Debian 12 has no Rust: install rustup and a stable toolchain.
if ! command -v cargo >/dev/null && [[ -x $HOME/.cargo/bin/cargo ]]; then
  export PATH=$HOME/.cargo/bin:$PATH
fi
if ! command -v cargo >/dev/null; then
  log "installing Rust (rustup, stable toolchain)"
  command -v curl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null; }
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
  export PATH=$HOME/.cargo/bin:$PATH
fi

if ! rustup toolchain list | grep '^nightly' >/dev/null; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
sysroot=$(rustc +nightly --print sysroot)
if [[ ! -d $sysroot/lib/rustlib/src/rust/library/core ]]; then
  log "adding rust-src to nightly"
  if ! rustup component add rust-src --toolchain nightly; then
    # Offline fallback: a packed rust-src the caller points us at.
    if [[ -n ${ICECORE_RUST_SRC_TARBALL:-} && -f $ICECORE_RUST_SRC_TARBALL ]]; then
      tar -xJf "$ICECORE_RUST_SRC_TARBALL" -C "$sysroot/lib/rustlib/"
    else
      log "could not add rust-src for nightly"; exit 1
    fi
  fi
fi

if ! command -v bpf-linker >/dev/null || ! bpf-linker --version 2>/dev/null | grep '0\.13\.' >/dev/null; then
  log "building bpf-linker 0.13 against LLVM 22 (about a minute)"
  LLVM_PREFIX=/usr/lib/llvm-22 cargo install --locked bpf-linker@0.13.0 \
    --no-default-features --features llvm-22
fi
log "toolchain ready: $(bpf-linker --version), $(rustc +nightly -vV | grep LLVM)"
