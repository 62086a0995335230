#!/usr/bin/env bash
# The PHP builds the PHP tests profile: Debian's 8.2 on the host, sid's 8.4
# and experimental's 8.5 in the sid chroot (scripts/cpython-chroots.sh makes
# it), each with its php-fpm, opcache (built into 8.5) and the php-excimer
# sampler the tests compare with (Debian builds none for 8.5: it is built
# from Debian's php-excimer source in the chroot). Idempotent: a complete
# set is left alone.
#
#   scripts/php.sh [SID_ROOT]      (default /var/cache/icecore/sid)
set -euo pipefail

root=${1:-${ICECORE_SID_ROOT:-/var/cache/icecore/sid}}
log() { printf 'php: %s\n' "$*" >&2; }
host_packages=(php8.2-cli php8.2-opcache php8.2-fpm php-excimer)
sid_packages=(php8.4-cli php8.4-opcache php8.4-fpm php8.4-excimer)
experimental_packages=(php8.5-cli php8.5-fpm)
# To build php-excimer for 8.5 (perl, which automake needs, from sid).
excimer_build_packages=(php8.5-dev/experimental gcc make libc6-dev)

installed() {
  local chroot=$1; shift
  local p
  for p in "$@"; do
    if [[ -n $chroot ]]; then
      chroot "$chroot" dpkg -s "$p" 2>/dev/null | grep -x 'Status: install ok installed' >/dev/null || return 1
    else
      dpkg -s "$p" 2>/dev/null | grep -x 'Status: install ok installed' >/dev/null || return 1
    fi
  done
}

if [[ $(id -u) -ne 0 ]]; then
  log "needs root (apt-get, chroot)"; exit 1
fi
# Debian's packages start their php-fpm service on install: not here.
no_services() {
  printf '#!/bin/sh\nexit 101\n' > "$1/usr/sbin/policy-rc.d"
  chmod +x "$1/usr/sbin/policy-rc.d"
}
if ! installed "" "${host_packages[@]}"; then
  log "installing ${host_packages[*]}"
  created_policy=0
  [[ -e /usr/sbin/policy-rc.d ]] || { no_services ""; created_policy=1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${host_packages[@]}" >/dev/null
  ((created_policy)) && rm -f /usr/sbin/policy-rc.d
fi
if [[ ! -x $root/usr/bin/apt-get ]]; then
  log "no sid chroot in $root (scripts/cpython-chroots.sh makes it)"; exit 1
fi
if ! installed "$root" "${sid_packages[@]}" "${experimental_packages[@]}"; then
  no_services "$root"
  experimental=$root/etc/apt/sources.list.d/experimental.list
  if [[ ! -f $experimental ]]; then
    sed -n 's/^\(deb .*\) sid \(.*\)$/\1 experimental \2/p' "$root/etc/apt/sources.list" > "$experimental"
  fi
  # The registry's Release files can be past their Valid-Until date.
  chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
  log "installing ${sid_packages[*]} in $root"
  chroot "$root" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${sid_packages[@]}" >/dev/null
  log "installing ${experimental_packages[*]} from experimental in $root"
  chroot "$root" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends -t experimental "${experimental_packages[@]}" >/dev/null
fi
if [[ $(chroot "$root" php8.5 -r 'echo extension_loaded("excimer") ? 1 : 0;') != 1 ]]; then
  log "building php-excimer for 8.5 from Debian's source in $root"
  chroot "$root" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${excimer_build_packages[@]}" >/dev/null
  mirror=$(awk '/^deb /{print $2; exit}' "$root/etc/apt/sources.list")
  echo "deb-src $mirror sid main" > "$root/etc/apt/sources.list.d/icecore-excimer-source.list"
  chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
  chroot "$root" sh -ec '
    rm -rf /tmp/icecore-excimer && mkdir -p /tmp/icecore-excimer && cd /tmp/icecore-excimer
    # The registry serves the upstream tarball but not always the .dsc:
    # apt then fails after downloading what is needed here.
    apt-get -o Acquire::Check-Valid-Until=false source --download-only -qq php-excimer >/dev/null 2>&1 || true
    tar -xzf php-excimer_*.orig.tar.gz && cd excimer-*
    phpize8.5 >/dev/null 2>&1 && ./configure --with-php-config=php-config8.5 >/dev/null
    make -j2 >/dev/null 2>&1 && make install >/dev/null 2>&1
    echo "extension=excimer.so" > /etc/php/8.5/mods-available/excimer.ini
    ln -sf /etc/php/8.5/mods-available/excimer.ini /etc/php/8.5/cli/conf.d/20-excimer.ini
    rm -rf /tmp/icecore-excimer'
fi
log "ready: $(php8.2 -n -r 'echo PHP_VERSION;') $(for v in 8.4 8.5; do chroot "$root" "php$v" -n -r 'echo PHP_VERSION, " ";'; done)"
