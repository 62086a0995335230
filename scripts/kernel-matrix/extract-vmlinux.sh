#!/usr/bin/env bash
# extract-vmlinux.sh VMLINUZ OUT
# Finds the compressed payload inside a bzImage and writes the uncompressed
# ELF vmlinux to OUT (same idea as the kernel's scripts/extract-vmlinux).
set -uo pipefail
img=$1 out=$2
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

is_elf() { readelf -h "$1" >/dev/null 2>&1; }

# try MAGIC_HEX_REGEX COMMAND...
try() {
	local magic=$1 off
	shift
	command -v "$1" >/dev/null || return 1
	for off in $(LC_ALL=C grep -obUaP "$magic" "$img" | cut -d: -f1); do
		tail -c "+$((off + 1))" "$img" | "$@" >"$tmp" 2>/dev/null
		if is_elf "$tmp"; then
			mv "$tmp" "$out"
			return 0
		fi
	done
	return 1
}

try '\x28\xb5\x2f\xfd' zstd -dc ||
	try '\xfd\x37\x7a\x58\x5a\x00' xz -dc --single-stream ||
	try '\x1f\x8b\x08' gzip -dc ||
	try '\x02\x21\x4c\x18' lz4 -dc ||
	try '\x42\x5a\x68' bzip2 -dc ||
	try '\x5d\x00\x00\x00' xz -dc --format=lzma ||
	try '\x89\x4c\x5a' lzop -dc || {
	echo "extract-vmlinux: no known compressed kernel found in $img" >&2
	exit 1
}
