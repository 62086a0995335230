#!/usr/bin/env bash
# Fuzzes icecore's parsers of untrusted input with cargo-fuzz (libFuzzer,
# AddressSanitizer, debug assertions): builds every target of fuzz/, then
# runs each for SECONDS (default 60) from its seeds in fuzz/corpus/TARGET,
# printing one line per target. Exits non-zero if any target crashed, hung
# or ran out of memory; each such input is copied to fuzz/regressions/TARGET/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Installs cargo-fuzz (crates.io) and the nightly toolchain when missing.
# New inputs libFuzzer finds go to fuzz/target/work-corpus/TARGET, not to the
# committed seeds. FUZZ_NICE=N runs builds and fuzzers at that niceness.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'fuzz: %s\n' "$*" >&2; }

seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { log "SECONDS must be a whole number, not '$seconds'"; exit 2; }
shift $(($# > 0 ? 1 : 0))

# Toolchains as scripts/setup-toolchain.sh finds them: rustup's cargo, and
# a nightly toolchain (the sanitizer and coverage flags need it).
if ! command -v cargo >/dev/null && [[ -x $HOME/.cargo/bin/cargo ]]; then
  export PATH=$HOME/.cargo/bin:$PATH
fi
command -v rustup >/dev/null || { log "rustup is needed (scripts/setup-toolchain.sh installs it)"; exit 1; }
if ! rustup toolchain list | grep '^nightly' >/dev/null; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi
nice_cmd=(nice -n "${FUZZ_NICE:-0}")
fuzz() { "${nice_cmd[@]}" rustup run nightly cargo fuzz "$@"; }

# The targets need no BPF programs: receiver/build.rs writes a placeholder,
# and the sanitizer flags never reach the BPF build.
export AYA_BUILD_SKIP=1

targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(fuzz list --fuzz-dir fuzz)
fi

# Largest input of each target, in bytes: the seeds fit (the largest, an
# ELF file, is 14.5 KB) and inputs stay small enough to run fast.
max_len() {
  case $1 in
    relabel | gopclntab) echo 4096 ;;
    config_file | proc_maps | perf_map | jitdump) echo 8192 ;;
    *) echo 16384 ;;
  esac
}

log "building ${#targets[@]} targets (nightly, AddressSanitizer, debug assertions)"
started=$(date +%s)
fuzz build --fuzz-dir fuzz
log "built in $(($(date +%s) - started)) s"

logs=fuzz/target/fuzz-logs
mkdir -p "$logs"
failed=0
for target in "${targets[@]}"; do
  work=fuzz/target/work-corpus/$target
  seeds=fuzz/corpus/$target
  mkdir -p "$work" "$seeds" "fuzz/artifacts/$target"
  log="$logs/$target.log"
  rc=0
  # -timeout: an input running over 10 s is a hang. -rss_limit_mb (and the
  # malloc limit it implies): 2 GiB. The first corpus directory gets the
  # new inputs; the seeds are only read.
  fuzz run --fuzz-dir fuzz "$target" "$work" "$seeds" -- \
    -max_total_time="$seconds" -max_len="$(max_len "$target")" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  secs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -n 1)
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
  if [[ $rc -eq 0 && -n $runs ]]; then
    echo "fuzz: $target: $runs runs in $secs s, no crash"
    continue
  fi
  failed=1
  if [[ -n $artifact && -f $artifact ]]; then
    mkdir -p "fuzz/regressions/$target"
    cp "$artifact" "fuzz/regressions/$target/"
    reason=$(grep -m1 -E "panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|==ERROR" "$log" || true)
    echo "fuzz: $target: crashed: $artifact (copied to fuzz/regressions/$target/): ${reason:-see $log}"
  else
    echo "fuzz: $target: failed (exit $rc), no artifact; see $log"
  fi
done
rm -f /dev/shm/icecore-fuzz-* "${TMPDIR:-/tmp}"/icecore-fuzz-*
exit "$failed"
