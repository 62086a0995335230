#!/usr/bin/env bash
# Debian's Perl interpreters for the Perl tests, beside the host's 5.36:
# trixie's 5.40, sid's 5.42 and experimental's 5.44. Each is the statically
# linked /usr/bin/perl of its suite's perl-base package, unpacked under
# /opt/perl-SUITE of the Debian sid chroot, whose libc runs all three; the
# tests run them there with `chroot` and profile them like a container's.
# A script run with `-e` needs none of Perl's modules. Idempotent.
#
#   scripts/perl-versions.sh          (sid chroot: $ICECORE_SID_ROOT or /var/cache/icecore/sid)
set -euo pipefail

root=${ICECORE_SID_ROOT:-/var/cache/icecore/sid}
suites=(trixie sid experimental)
log() { printf 'perl-versions: %s\n' "$*" >&2; }

[[ $(id -u) -eq 0 ]] || { log "needs root (chroot)"; exit 1; }
[[ -x $root/usr/bin/apt-get ]] || { log "no sid chroot in $root (scripts/cpython-chroots.sh)"; exit 1; }

missing=()
for suite in "${suites[@]}"; do
  [[ -x $root/opt/perl-$suite/usr/bin/perl ]] || missing+=("$suite")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
trixie=$root/etc/apt/sources.list.d/icecore-trixie.list
if [[ ! -f $trixie ]]; then
  sed -n 's/^\(deb .*\) sid \(.*\)$/\1 trixie \2/p' "$root/etc/apt/sources.list" > "$trixie"
fi
experimental=$root/etc/apt/sources.list.d/experimental.list
if [[ ! -f $experimental ]]; then
  sed -n 's/^\(deb .*\) sid \(.*\)$/\1 experimental \2/p' "$root/etc/apt/sources.list" > "$experimental"
fi
# The registry's Release files can be past their Valid-Until date.
chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
work=$root/tmp/icecore-perl-debs
for suite in "${missing[@]}"; do
  rm -rf "$work" && mkdir -p "$work" && chmod 0777 "$work"  # apt downloads as _apt
  log "downloading perl-base from $suite"
  chroot "$root" sh -c "cd /tmp/icecore-perl-debs && apt-get download -qq perl-base/$suite" >/dev/null
  rm -rf "$root/opt/perl-$suite.partial"
  dpkg-deb -x "$work"/perl-base_*.deb "$root/opt/perl-$suite.partial"
  mv "$root/opt/perl-$suite.partial" "$root/opt/perl-$suite"
done
rm -rf "$work"
for suite in "${suites[@]}"; do
  printf '%s ' "$suite: $(chroot "$root" "/opt/perl-$suite/usr/bin/perl" -e 'print $^V')"
done
echo
