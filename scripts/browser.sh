#!/usr/bin/env bash
# The browser tests' prerequisites: Debian's Chromium (/usr/bin/chromium,
# from bookworm-security, installed with apt-get when missing; about 390 MB
# with its libraries) and playwright-core, pinned, from the npm registry in a
# fixed cache directory (/var/cache/icecore/playwright/node_modules/
# playwright-core: integration/browser/lib.mjs loads it from there).
# playwright-core never downloads a browser: it drives Debian's. Idempotent;
# concurrent callers wait for the first. Prints one line when all is there:
#   browser: ready: chromium <version>, playwright-core <version>
set -euo pipefail

dir=${ICECORE_PLAYWRIGHT_DIR:-/var/cache/icecore/playwright}
chromium=${ICECORE_CHROMIUM:-/usr/bin/chromium}
# 1.64 is the release built against Chromium 156, Debian's in bookworm-security;
# it needs Node >= 20.
playwright_version=1.64.1
log() { printf 'browser: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

command -v node >/dev/null || die "no node on PATH (Debian's nodejs, >= 20, runs the harness)"
command -v npm >/dev/null || die "no npm on PATH (it installs playwright-core)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || die "node $(node --version) is too old: playwright-core $playwright_version needs >= 20"

mkdir -p "$dir"
exec 9>"$dir/.install.lock"
flock 9

if [[ ! -x $chromium ]]; then
  [[ $chromium == /usr/bin/chromium ]] || die "ICECORE_CHROMIUM=$chromium is not an executable"
  [[ $(id -u) -eq 0 ]] || die "no $chromium, and installing Debian's chromium needs root (apt-get)"
  log "installing Debian's chromium"
  apt-get update -qq || die "apt-get update failed"
  # Not `grep -q`: it stops reading at the first match, and apt-cache's
  # SIGPIPE then fails the pipeline (pipefail) even though the line is there.
  if ! apt-cache policy chromium | grep '^  Candidate: [0-9]' >/dev/null; then
    die "apt has no chromium package: are bookworm and bookworm-security in the apt sources?"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=300 chromium >/dev/null \
    || die "apt-get install chromium failed"
  [[ -x $chromium ]] || die "apt-get installed chromium but there is no $chromium"
fi
# Debian's launcher script may complain on stderr (its /etc/chromium.d/dev-shm
# test trips over a /dev/shm that findmnt lists twice): harmless, hidden.
chromium_version=$("$chromium" --version 2>/dev/null | grep -oE '[0-9]+(\.[0-9]+){3}' | sed -n 1p) \
  || die "$chromium --version failed"
[[ -n $chromium_version ]] || die "$chromium --version printed no version"

package=$dir/node_modules/playwright-core/package.json
installed_version() { [[ -f $package ]] && node -p "require('$package').version" 2>/dev/null || true; }
if [[ $(installed_version) != "$playwright_version" ]]; then
  log "installing playwright-core@$playwright_version into $dir"
  (cd "$dir" && npm install --silent --no-save --no-audit --no-fund --ignore-scripts \
    --prefix "$dir" "playwright-core@$playwright_version" >/dev/null) \
    || die "npm install playwright-core@$playwright_version failed"
  [[ $(installed_version) == "$playwright_version" ]] \
    || die "npm installed no playwright-core $playwright_version in $dir/node_modules"
fi

echo "browser: ready: chromium $chromium_version, playwright-core $playwright_version"
