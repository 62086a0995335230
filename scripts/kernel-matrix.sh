#!/usr/bin/env bash
# Boots icecore on several Debian kernels under qemu (software emulation) and
# checks that its BPF programs load, attach and produce pprof files.
#
# Usage: scripts/kernel-matrix.sh [-h] [KERNEL...]
#
#   KERNEL   a kernel series such as 5.10, 6.1, 6.12, 6.18, 7.3 (the newest
#            Debian build of that series is used) or a more exact version
#            such as 6.18.12; default: 5.10 6.1 6.12 6.18 7.3
#
# Environment:
#   ICECORE_KERNEL_CACHE      where kernels are downloaded and unpacked
#                             [default: /var/cache/icecore-kernels]
#   ICECORE_KERNEL_REFRESH=1  look up the newest kernel packages again instead
#                             of reusing the ones already in the cache
#   ICECORE_DEBIAN_MIRROR     Debian mirror [default: the one in /etc/apt]
#   ICECORE_BIN               icecore binary [default: target/release/icecore,
#                             built with cargo build --release if missing]
#   ICECORE_MATRIX_DIR        initramfs and serial logs
#                             [default: target/kernel-matrix]
#   ICECORE_MATRIX_TIMEOUT    seconds per kernel before qemu is killed [300]
#   ICECORE_MATRIX_LOG_LEVEL  icecore --log-level inside the VM [info]
#   ICECORE_MATRIX_ULIMIT=0   do not run `ulimit -l unlimited` before icecore
#   ICECORE_MATRIX_BOOT_RETRIES
#                             boots to retry when the guest kernel dies before
#                             it starts /init, so before icecore runs [1]
#   ICECORE_MATRIX_TCG_THREAD qemu's TCG threading, single or multi [single]:
#                             with one host thread per vCPU, about one boot in
#                             twenty of 7.3 died in early boot ("Oops: int3"
#                             while a static key was patched on the other
#                             vCPU); one thread runs the guest's two vCPUs
#                             in turn, about 30% slower
#   ICECORE_MATRIX_JOBS       guests booted at once [the number of CPUs]:
#                             each guest is one host thread (single TCG)
#
# Installs qemu-system-x86, busybox-static, cpio and zstd with apt-get when
# they are missing. Kernel packages are fetched with a private APT
# configuration in the cache (/etc/apt is never modified) and never installed.
# Exits 0 only when every kernel passes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE="$ROOT/scripts/kernel-matrix"
DEFAULT_KERNELS=(5.10 6.1 6.12 6.18 7.3)

CACHE=${ICECORE_KERNEL_CACHE:-/var/cache/icecore-kernels}
WORK=${ICECORE_MATRIX_DIR:-$ROOT/target/kernel-matrix}
TIMEOUT=${ICECORE_MATRIX_TIMEOUT:-300}
LOG_LEVEL=${ICECORE_MATRIX_LOG_LEVEL:-info}
ULIMIT=${ICECORE_MATRIX_ULIMIT:-1}
BOOT_RETRIES=${ICECORE_MATRIX_BOOT_RETRIES:-1}
TCG_THREAD=${ICECORE_MATRIX_TCG_THREAD:-single}
JOBS=${ICECORE_MATRIX_JOBS:-$(nproc)}
ICECORE_BIN=${ICECORE_BIN:-$ROOT/target/release/icecore}

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
say() { printf 'kernel-matrix: %s\n' "$*" >&2; }
die() {
	say "$*"
	exit 2
}

case ${1:-} in
-h | --help)
	usage
	exit 0
	;;
-*)
	usage >&2
	exit 2
	;;
esac
KERNELS=("$@")
[ ${#KERNELS[@]} -gt 0 ] || KERNELS=("${DEFAULT_KERNELS[@]}")
for k in "${KERNELS[@]}"; do
	[[ $k =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die "not a kernel version: $k (expected like 6.1 or 6.18.12)"
done

START=$SECONDS

# ---------------------------------------------------------------- host tools
as_root() {
	if [ "$(id -u)" = 0 ]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		die "need root to run: $*"
	fi
}

ensure_tools() {
	local missing=()
	command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
	dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
	command -v cpio >/dev/null || missing+=(cpio)
	command -v zstd >/dev/null || missing+=(zstd)
	[ ${#missing[@]} -eq 0 ] && return
	say "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	as_root apt-get install -y --no-install-recommends "${missing[@]}" ||
		{ as_root apt-get update && as_root apt-get install -y --no-install-recommends "${missing[@]}"; }
}

for tool in gcc dpkg-deb apt-get readelf timeout gzip; do
	command -v "$tool" >/dev/null || die "$tool is required"
done
ensure_tools
BUSYBOX=$(dpkg -L busybox-static | grep -m1 '/bin/busybox$')
[ -x "$BUSYBOX" ] || die "busybox-static is installed but its binary is missing"

# ------------------------------------------------------- private APT config
APTDIR="$CACHE/apt"
APT_UPDATED=0

# The mirror the machine already uses (first Debian archive / security URI).
machine_uris() {
	{
		cat /etc/apt/sources.list 2>/dev/null
		cat /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null
	} | grep -v '^[[:space:]]*#' | grep -oE 'https?://[^[:space:]]+' | sed 's:/*$::'
}

setup_apt() {
	local main security
	if [ -n "${ICECORE_DEBIAN_MIRROR:-}" ]; then
		main=${ICECORE_DEBIAN_MIRROR%/}
	else
		main=$(machine_uris | grep -m1 -E '/debian$' || true)
	fi
	main=${main:-http://deb.debian.org/debian}
	security=$(machine_uris | grep -m1 -E '/debian-security$' || true)
	security=${security:-${main%/debian}/debian-security}
	local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	[ -r "$keyring" ] || die "$keyring is missing (package debian-archive-keyring)"

	mkdir -p "$APTDIR"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d}
	cat >"$APTDIR/sources.list" <<-EOF
		deb [signed-by=$keyring] $security bullseye-security main
		deb [signed-by=$keyring] $security bookworm-security main
		deb [signed-by=$keyring] $main trixie-backports main
	EOF
	cat >"$APTDIR/apt.conf" <<-EOF
		Dir::Etc::SourceList "$APTDIR/sources.list";
		Dir::Etc::SourceParts "$APTDIR/sources.list.d";
		Dir::Etc::Preferences "$APTDIR/preferences";
		Dir::Etc::PreferencesParts "$APTDIR/preferences.d";
		Dir::State::Lists "$APTDIR/lists";
		Dir::Cache "$APTDIR/cache";
		APT::Architectures { "amd64"; };
		APT::Sandbox::User "root";
		Acquire::Languages "none";
	EOF
}

papt() { APT_CONFIG="$APTDIR/apt.conf" "$@"; }

apt_update() {
	[ "$APT_UPDATED" = 1 ] && return
	setup_apt
	say "apt-get update (private configuration $APTDIR/apt.conf)"
	papt apt-get update -qq >&2 || die "apt-get update failed"
	APT_UPDATED=1
}

# ------------------------------------------------------------- the kernels
# Prints the ABI name (like 6.1.0-56-amd64 or 6.18.15+deb13-amd64) of the
# newest Debian amd64 kernel of series $1, and the packages to fetch for it.
resolve_kernel() {
	local series=$1 re abi pkgs=()
	re="^linux-(image|binary)-${series//./\\.}[.+-][^ ]*-amd64(-unsigned)?\$"
	abi=$(papt apt-cache pkgnames linux- | grep -E "$re" |
		grep -vE -- '-(rt|cloud|dbg)-|\.deb1[0-9]\.' |
		sed -E 's/^linux-(image|binary)-//; s/-unsigned$//' | sort -uV | tail -n 1)
	[ -n "$abi" ] || return 1
	# Newer packaging splits the kernel (linux-binary) from its modules and
	# config (linux-base); older ships one linux-image, prefer -unsigned.
	local p
	for p in "linux-binary-$abi" "linux-image-$abi-unsigned" "linux-image-$abi"; do
		if papt apt-cache show "$p" 2>/dev/null | grep '^Package:' >/dev/null; then
			pkgs+=("$p")
			break
		fi
	done
	[ ${#pkgs[@]} -gt 0 ] || return 1
	if papt apt-cache show "linux-base-$abi" 2>/dev/null | grep '^Package:' >/dev/null; then
		pkgs+=("linux-base-$abi")
	fi
	echo "$abi ${pkgs[*]}"
}

# Makes $CACHE/kernels/ABI/ with vmlinux (or vmlinuz) for series $1 and
# sets KDIR to that directory.
fetch_kernel() {
	local series=$1 pin="$CACHE/resolved/$1" line abi pkgs dir
	if [ "${ICECORE_KERNEL_REFRESH:-0}" != 1 ] && [ -s "$pin" ] &&
		[ -e "$CACHE/kernels/$(cat "$pin")/.complete" ]; then
		KDIR="$CACHE/kernels/$(cat "$pin")"
		return
	fi
	apt_update
	line=$(resolve_kernel "$series") || {
		say "no Debian amd64 kernel package found for $series"
		return 1
	}
	read -r abi pkgs <<<"$line"
	dir="$CACHE/kernels/$abi"
	if [ ! -e "$dir/.complete" ]; then
		say "$series: downloading $pkgs"
		rm -rf "$dir"
		mkdir -p "$dir/debs" "$dir/root"
		(cd "$dir/debs" && papt apt-get download -q $pkgs) >&2 || {
			say "apt-get download $pkgs failed"
			return 1
		}
		local deb
		for deb in "$dir"/debs/*.deb; do
			dpkg-deb -x "$deb" "$dir/root" || return 1
		done
		# The kernel is /boot/vmlinuz-ABI in older packages and
		# /usr/lib/modules/ABI/vmlinuz in newer ones; the config likewise.
		local f
		for f in "$dir"/root/boot/vmlinuz-* "$dir"/root/{usr/,}lib/modules/*/vmlinuz; do
			[ -f "$f" ] && { cp "$f" "$dir/vmlinuz"; break; }
		done
		for f in "$dir"/root/boot/config-* "$dir"/root/{usr/,}lib/modules/*/config; do
			[ -f "$f" ] && { cp "$f" "$dir/config"; break; }
		done
		# Every kernel here has what the test needs built in: drop the
		# modules (hundreds of MB) and the packages.
		rm -rf "$dir/debs" "$dir"/root/{usr/,}lib/modules
		[ -f "$dir/vmlinuz" ] || {
			say "no kernel image (vmlinuz) in $pkgs"
			return 1
		}
		if "$HERE/extract-vmlinux.sh" "$dir/vmlinuz" "$dir/vmlinux" &&
			readelf -n "$dir/vmlinux" 2>/dev/null | grep Xen >/dev/null; then
			:
		else
			say "$abi: no PVH-bootable vmlinux, will boot vmlinuz"
			rm -f "$dir/vmlinux"
		fi
		touch "$dir/.complete"
	fi
	mkdir -p "$CACHE/resolved"
	echo "$abi" >"$pin"
	KDIR=$dir
}

# -------------------------------------------------------------- initramfs
build_initramfs() {
	local stage="$WORK/initramfs" lib libdirs="" dir
	if [ ! -x "$ICECORE_BIN" ]; then
		say "building icecore (cargo build --release)"
		(cd "$ROOT" && cargo build --release) >&2
	fi
	[ -x "$ICECORE_BIN" ] || die "no icecore binary at $ICECORE_BIN"
	rm -rf "$stage"
	mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,out,etc}
	cp "$BUSYBOX" "$stage/bin/busybox"
	gcc -static -O1 -fno-omit-frame-pointer -o "$stage/bin/busy" "$HERE/busy.c"
	# Debug info is not needed to load BPF programs and makes the image 6x larger.
	objcopy --strip-debug "$ICECORE_BIN" "$stage/bin/icecore"
	# Libraries and the dynamic loader, at the paths the binary asks for.
	for lib in $(ldd "$ICECORE_BIN" | grep -oE '/[^ ]+'); do
		mkdir -p "$stage$(dirname "$lib")"
		cp -L "$lib" "$stage$lib"
		dir=$(dirname "$lib")
		case ":$libdirs:" in *":$dir:"*) ;; *) libdirs=${libdirs:+$libdirs:}$dir ;; esac
	done
	sed "s|@LD_LIBRARY_PATH@|$libdirs|" "$HERE/init" >"$stage/init"
	chmod 755 "$stage/init"
	(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$WORK/initrd.gz"
	say "initramfs $WORK/initrd.gz ($(du -h "$WORK/initrd.gz" | cut -f1)), icecore from $ICECORE_BIN"
}

# ------------------------------------------------------------------- boot
# boot SERIES KERNEL_DIR LOG: prints "PASS|FAIL detail".
boot() {
	local series=$1 dir=$2 log=$3 image rc line
	image="$dir/vmlinux"
	[ -e "$image" ] || image="$dir/vmlinuz"
	rc=0
	timeout "$TIMEOUT" qemu-system-x86_64 -accel "tcg,thread=$TCG_THREAD" -cpu max -m 1G -smp 2 \
		-kernel "$image" -initrd "$WORK/initrd.gz" \
		-append "console=ttyS0 panic=-1 quiet icecore_matrix.ulimit=$ULIMIT icecore_matrix.log=$LOG_LEVEL" \
		-display none -serial "file:$log" -no-reboot -nodefaults </dev/null >"$log.qemu" 2>&1 || rc=$?
	line=$(tr -d '\r' <"$log" | grep -a '^ICECORE-MATRIX: ' | tail -n 1 || true)
	case $line in
	"ICECORE-MATRIX: PASS "*) echo "PASS ${line#ICECORE-MATRIX: PASS }" ;;
	"ICECORE-MATRIX: FAIL "*)
		line=${line#ICECORE-MATRIX: FAIL }
		echo "FAIL ${line#* }" # the guest's reason, without its uname -r
		;;
	*)
		# Software emulation occasionally crashes a guest kernel in early
		# boot (seen once on 7.3: an oops in an interrupt while unpacking
		# the initramfs). Such a boot says nothing about icecore: report it
		# as BOOTFAIL so the caller can boot again. Anything after /init's
		# first line is icecore's responsibility and stays a FAIL.
		local verdict=FAIL
		grep -aq '^icecore-matrix: kernel' "$log" || verdict=BOOTFAIL
		if [ "$rc" = 124 ]; then
			echo "$verdict no marker: timed out after ${TIMEOUT}s$(first_oops "$log")"
		else
			echo "$verdict no marker: qemu exited $rc$(first_oops "$log")"
		fi
		;;
	esac
}

# first_oops LOG: prints ", guest: <first oops or panic line>" if LOG has one.
first_oops() {
	local oops
	oops=$(tr -d '\r' <"$1" | grep -a -m 1 -E 'BUG:|Oops|general protection|invalid opcode|Kernel panic' |
		sed -E 's/^\[ *[0-9.]+\] //' || true)
	[ -z "$oops" ] || printf ', guest: %s' "$oops"
}

mkdir -p "$WORK/logs" "$CACHE"
build_initramfs

# boot_series SERIES KERNEL_DIR: boots (again after a BOOTFAIL, up to
# BOOT_RETRIES times) and writes "series|abi|result|seconds|detail" to
# $WORK/results/SERIES; its report goes to $WORK/logs/SERIES.report.
boot_series() {
	local series=$1 dir=$2 abi log t0 attempt=1 retried="" result detail secs
	abi=$(basename "$dir")
	log="$WORK/logs/$series.log"
	t0=$SECONDS
	while :; do
		read -r result detail <<<"$(boot "$series" "$dir" "$log")"
		[ "$result" = BOOTFAIL ] || break
		if [ "$attempt" -gt "$BOOT_RETRIES" ]; then
			result=FAIL
			detail="guest kernel did not reach /init on any of $attempt boots: $detail"
			break
		fi
		mv -f "$log" "$log.boot$attempt" 2>/dev/null || : >"$log.boot$attempt"
		say "$series: guest kernel did not reach /init ($detail); serial log kept in $log.boot$attempt, booting again"
		# The oops itself, so that a CI log shows what the emulated kernel hit.
		tr -d '\r' <"$log.boot$attempt" |
			sed -n -E '/BUG:|Oops|general protection|invalid opcode|Kernel panic/,$p' |
			head -n 60 | sed 's/^/  | /' >&2
		retried="after $attempt failed boot(s) before /init, see $log.boot1"
		attempt=$((attempt + 1))
	done
	secs=$((SECONDS - t0))
	[ "$result" != PASS ] || detail=$retried
	if [ "$result" = PASS ]; then
		say "$series: PASS in ${secs}s${detail:+ ($detail)}"
	else
		say "$series: FAIL in ${secs}s: $detail (serial log: $log)"
		# The guest's report: icecore's stderr (with the verifier log) and dmesg.
		if grep -aq 'icecore-matrix:' "$log" 2>/dev/null; then
			tr -d '\r' <"$log" | sed -n '/^icecore-matrix: kernel/,$p' | sed 's/^/  | /'
		else
			tr -d '\r' <"$log" | tail -n 40 | sed 's/^/  | /'
			sed 's/^/  | qemu: /' "$log.qemu"
		fi >"$WORK/logs/$series.report"
	fi
	echo "$series|$abi|$result|$secs|$detail" >"$WORK/results/$series"
}

# Kernels are fetched one after the other (they share the APT cache), then
# booted JOBS at a time: each guest runs on one TCG thread, so on a host
# with two cores two guests take the time of one.
rm -rf "$WORK/results"
mkdir -p "$WORK/results"
declare -A KDIRS=()
for series in "${KERNELS[@]}"; do
	rm -f "$WORK/logs/$series".*
	if fetch_kernel "$series"; then
		KDIRS[$series]=$KDIR
	else
		echo "$series|-|FAIL|0|kernel not available" >"$WORK/results/$series"
	fi
done
running=0
for series in "${KERNELS[@]}"; do
	[ -n "${KDIRS[$series]:-}" ] || continue
	if [ "$running" -ge "$JOBS" ]; then
		wait -n || :
		running=$((running - 1))
	fi
	say "$series: booting $(basename "${KDIRS[$series]}")"
	boot_series "$series" "${KDIRS[$series]}" &
	running=$((running + 1))
done
wait

RESULTS=()
FAILURES=0
for series in "${KERNELS[@]}"; do
	row=$(cat "$WORK/results/$series" 2>/dev/null || echo "$series|-|FAIL|0|no result (the boot's shell died)")
	RESULTS+=("$row")
	IFS='|' read -r _ _ result _ _ <<<"$row"
	if [ "$result" != PASS ]; then
		FAILURES=$((FAILURES + 1))
		[ ! -s "$WORK/logs/$series.report" ] || {
			say "$series: report"
			cat "$WORK/logs/$series.report" >&2
		}
	fi
done

echo
printf '%-8s %-24s %-6s %7s  %s\n' KERNEL PACKAGE RESULT SECONDS DETAIL
for row in "${RESULTS[@]}"; do
	IFS='|' read -r series abi result secs detail <<<"$row"
	printf '%-8s %-24s %-6s %7s  %s\n' "$series" "$abi" "$result" "$secs" "$detail"
done
echo "total: $((SECONDS - START))s, ${#KERNELS[@]} kernel(s), $FAILURES failed; serial logs in $WORK/logs"
[ "$FAILURES" = 0 ]
