#!/usr/bin/env bash
# A thread-safe (ZTS) PHP CLI for the PHP tests: Debian's distributions
# build PHP without thread safety, so this builds Debian bookworm's php8.2
# source (fetched through the sid chroot's apt, scripts/cpython-chroots.sh)
# with --enable-zts and little else, and strips it as Debian strips its
# binaries. About 2.5 minutes on two cores, once: the result is cached.
#
#   scripts/php-zts.sh [PREFIX]      (default /var/cache/icecore/php-zts)
set -euo pipefail

prefix=${1:-${ICECORE_PHP_ZTS:-/var/cache/icecore/php-zts}}
root=${ICECORE_SID_ROOT:-/var/cache/icecore/sid}
log() { printf 'php-zts: %s\n' "$*" >&2; }

if [[ -x $prefix/bin/php ]] && "$prefix/bin/php" -v 2>/dev/null | grep '(ZTS)' >/dev/null; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  log "needs root (chroot)"; exit 1
fi
if [[ ! -x $root/usr/bin/apt-get ]]; then
  log "no sid chroot in $root (scripts/cpython-chroots.sh makes it)"; exit 1
fi
command -v cc >/dev/null && command -v make >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc make libc6-dev >/dev/null
}
# Debian's source of bookworm's PHP, downloaded with the chroot's apt.
sources=$root/etc/apt/sources.list.d/icecore-php-source.list
if [[ ! -f $sources ]]; then
  mirror=$(awk '/^deb /{print $2; exit}' "$root/etc/apt/sources.list")
  echo "deb-src $mirror bookworm main" > "$sources"
fi
chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
work=$root/tmp/icecore-php-zts
rm -rf "$work" && mkdir -p "$work"
# Only the upstream tarball is used: apt may fail on a missing .dsc after
# downloading it.
chroot "$root" sh -c 'cd /tmp/icecore-php-zts && apt-get -o Acquire::Check-Valid-Until=false source --download-only -qq php8.2' >/dev/null 2>&1 || true
tarball=$(ls "$work"/php8.2_*.orig.tar.xz) || { log "no php8.2 source tarball from Debian"; exit 1; }
build=$(mktemp -d /tmp/icecore-php-zts-build.XXXXXX)
trap 'rm -rf "$build" "$work"' EXIT
tar -xf "$tarball" -C "$build"
cd "$build"/php-*
log "building $(basename "$tarball") with --enable-zts into $prefix"
./configure --quiet --prefix="$prefix" --enable-zts --disable-all --enable-cli \
  --disable-cgi --disable-phpdbg --without-pear >/dev/null
make -j"$(nproc)" >/dev/null 2>&1 || make >/dev/null
rm -rf "$prefix"
make install-cli >/dev/null
strip "$prefix/bin/php"
"$prefix/bin/php" -v | sed -n 1p >&2
