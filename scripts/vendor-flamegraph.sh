#!/usr/bin/env bash
# Fetches the flame graph page's libraries again from the npm registry into
# src/flame_page/assets/vendor/, checking each tarball's SHA-256. The files
# are committed (the page must work with no network, and builds must not
# need npm); this script is how they were obtained and how to update them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=src/flame_page/assets/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fetch() { # package version sha256
  local tarball="$work/$1-$2.tgz"
  curl -fsSL "https://registry.npmjs.org/$1/-/$1-$2.tgz" -o "$tarball"
  echo "$3  $tarball" | sha256sum -c --quiet -
  mkdir -p "$work/$1" && tar xzf "$tarball" -C "$work/$1"
}
fetch d3 7.9.2 f0c1d2c2479907a6e3265370d0fd715f7aef0f561cdd2b415df385ba7df9d1aa
fetch d3-flame-graph 5.0.0 f12f7540b6e6e787277908d70b7169da7ced5be8737bcff2bd27f3fe4b9961c9

cp "$work/d3/package/dist/d3.min.js" "$out/d3.v7.min.js"
cp "$work/d3-flame-graph/package/dist/d3-flamegraph.umd.min.js" "$work/d3-flame-graph/package/dist/d3-flamegraph.css" "$out/"
echo "vendor-flamegraph: updated $out (LICENSES.txt is kept by hand)"
