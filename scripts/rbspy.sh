#!/usr/bin/env bash
# Installs rbspy, the reference profiler of the CRuby accuracy tests, into a
# cached root (about 5 minutes to build, once). Concurrent callers wait for
# the first: scripts/test.sh starts it early in the background, and the
# tests that need it call it again.
set -euo pipefail
root=${ICECORE_RBSPY_ROOT:-/var/cache/icecore/rbspy}
version=0.55.0
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if [[ -x $root/bin/rbspy ]] && "$root/bin/rbspy" --version 2>/dev/null | grep -F "$version" >/dev/null; then
  exit 0
fi
export PATH=$HOME/.cargo/bin:$PATH
nice -n 10 cargo install --quiet --locked rbspy --version "$version" --root "$root"
