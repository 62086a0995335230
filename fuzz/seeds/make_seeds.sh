#!/usr/bin/env bash
# Rebuilds the generated seeds of fuzz/corpus/ (the text ones, configs, maps
# and perf maps, are copied from the repository and kept as they are):
# small ELF files compiled here with clang, jitdump and .gopclntab files
# (make_seeds.py), and OTLP requests and pprof profiles made with icecore's
# own encoders (examples/make_seeds.rs). Needs clang, binutils, python3 and
# cargo; the ELF files differ with the compiler's version (and the DWARF one
# with the directory it is built in).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'seeds: %s\n' "$*" >&2; }
corpus=corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ELF seeds: a stripped dynamic binary (.eh_frame, .eh_frame_hdr, PLT), a
# tiny static one with .eh_frame only, the same with .debug_frame only, one
# with DWARF and a build ID, and one with a synthetic .gopclntab. Static
# ones are linked with 16-byte pages so that they stay under 3 KB.
small=(-nostdlib -static -Wl,-z,max-page-size=16 -Wl,-z,noseparate-code)
clang -Os -o "$work/hello" seeds/hello.c
strip "$work/hello"
clang -Os -fasynchronous-unwind-tables "${small[@]}" -Wl,--build-id=none -o "$work/tiny-eh" seeds/tiny.c
cp "$work/tiny-eh" "$work/tiny-sym"
strip "$work/tiny-eh"
clang -Os -fno-asynchronous-unwind-tables -fno-unwind-tables -g "${small[@]}" -Wl,--build-id=none \
  -o "$work/tiny-df" seeds/tiny.c
objcopy --strip-all --keep-section=.debug_frame "$work/tiny-df" "$work/tiny-debug-frame"
clang -O1 -fasynchronous-unwind-tables -g "${small[@]}" -Wl,--build-id=sha1 -o "$work/tiny-dwarf" seeds/tiny.c
text=$(readelf -SW "$work/tiny-sym" | awk '$3 == ".text" { print $5 }')
python3 seeds/make_seeds.py "$corpus" "$text" "$work/pclntab"
objcopy --add-section .gopclntab="$work/pclntab" --set-section-flags .gopclntab=readonly,data \
  "$work/tiny-sym" "$work/tiny-gopclntab"
mkdir -p "$corpus/elf_unwind_table" "$corpus/elf_symbols"
cp "$work/hello" "$corpus/elf_unwind_table/hello-clang-Os-stripped"
cp "$work/tiny-eh" "$corpus/elf_unwind_table/tiny-eh-frame"
cp "$work/tiny-debug-frame" "$corpus/elf_unwind_table/tiny-debug-frame"
cp "$work/hello" "$corpus/elf_symbols/hello-clang-Os-stripped"
cp "$work/tiny-dwarf" "$corpus/elf_symbols/tiny-dwarf"
cp "$work/tiny-gopclntab" "$corpus/elf_symbols/tiny-gopclntab"
log "ELF, jitdump and gopclntab seeds written"

# OTLP and pprof seeds. No sanitizer flags here: a plain build, in its own
# target directory so that cargo fuzz's artifacts are not rebuilt.
AYA_BUILD_SKIP=1 CARGO_TARGET_DIR=target/seeds \
  cargo run --quiet --manifest-path Cargo.toml --example make_seeds -- "$corpus"
log "OTLP and pprof seeds written"
