#!/usr/bin/env bash
# Debian's own CPython builds for the tests, in a Debian sid chroot: 3.13, 3.14
# and 3.15 (statically linked, stripped, PGO'd executables, as Debian ships
# them) and their -dbg packages (the DWARF the layout test checks against),
# Debian's Ruby 3.3 and, from experimental, 3.4 (stripped libruby builds
# that export no data symbols), and Debian's OpenJDK 8 and 27 JREs (the
# oldest and newest HotSpot the JVM tests run).
# The runtime tests profile processes running in this chroot like a
# container's. Idempotent: a complete chroot is reused, so a machine pays
# the minute once.
#
#   scripts/cpython-chroots.sh [DIR]      (default /var/cache/icecore/sid)
set -euo pipefail

root=${1:-${ICECORE_SID_ROOT:-/var/cache/icecore/sid}}
versions=(3.13 3.14 3.15)
jdks=(8 27)
log() { printf 'cpython-chroots: %s\n' "$*" >&2; }

complete() {
  local v
  for v in "${versions[@]}"; do
    [[ -x $root/usr/bin/python$v ]] || return 1
    chroot "$root" dpkg -s "python$v-dbg" >/dev/null 2>&1 || return 1
  done
  [[ -x $root/usr/bin/ruby3.3 && -x $root/usr/bin/ruby3.4 ]] || return 1
  for v in "${jdks[@]}"; do
    chroot "$root" dpkg -s "openjdk-$v-jre-headless" 2>/dev/null \
      | grep -x 'Status: install ok installed' >/dev/null || return 1
  done
}

if [[ $(id -u) -ne 0 ]]; then
  log "needs root (debootstrap, chroot)"; exit 1
fi
if complete; then
  exit 0
fi
if [[ ! -x $root/usr/bin/apt-get ]]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  log "creating a Debian sid chroot in $root (about a minute)"
  rm -rf "$root.partial"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase sid "$root.partial" >/dev/null
  mv "$root.partial" "$root"
fi
packages=()
for v in "${versions[@]}"; do packages+=("python$v" "python$v-dbg"); done
packages+=(ruby3.3)
log "installing ${packages[*]}"
# The registry's Release files can be past their Valid-Until date.
chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
chroot "$root" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
# Ruby 3.4 is only in experimental.
experimental=$root/etc/apt/sources.list.d/experimental.list
if [[ ! -f $experimental ]]; then
  sed -n 's/^\(deb .*\) sid \(.*\)$/\1 experimental \2/p' "$root/etc/apt/sources.list" > "$experimental"
  chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
fi
log "installing ruby3.4 from experimental"
chroot "$root" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends -t experimental ruby3.4 >/dev/null
# A JRE's installation runs java, which needs /proc.
jre_packages=()
for v in "${jdks[@]}"; do jre_packages+=("openjdk-$v-jre-headless"); done
log "installing ${jre_packages[*]}"
mountpoint -q "$root/proc" || { mount -t proc proc "$root/proc"; trap 'umount "$root/proc"' EXIT; }
chroot "$root" env DEBIAN_FRONTEND=noninteractive dpkg --configure -a >/dev/null
chroot "$root" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${jre_packages[@]}" >/dev/null
complete || { log "the chroot in $root is still incomplete"; exit 1; }
log "ready: $(for v in "${versions[@]}"; do chroot "$root" "python$v" -c 'import sys; print(sys.version.split()[0], end=" ")'; done)"
