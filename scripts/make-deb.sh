#!/usr/bin/env bash
# Build the Debian packages from a built tree, and check them with lintian.
#   scripts/make-deb.sh [--results FILE] BUILD_DIR
# Out: BUILD_DIR/deb/perfq_<version>_amd64.deb, perfq-dkms_<version>_all.deb
# (and lintian.txt).  The tree is configured for /usr for the package and
# set back to its own install prefix afterwards (configuring only: nothing
# recompiles).  With --results, "PASS/FAIL name" lines for make test.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
results=
if [ "${1:-}" = --results ]; then results=$2; shift 2; fi
BUILD=$(realpath -m "${1:?usage: scripts/make-deb.sh [--results FILE] BUILD_DIR}")
OUT=$BUILD/deb
declare -a lines=()
result() {  # result PASS|FAIL name text
  lines+=("$1 $2")
  echo "deb: $1 $2: $3"
}
finish() {
  if [ -n "$results" ]; then
    mkdir -p "$(dirname "$results")"
    printf '%s\n' "${lines[@]}" >"$results"
  fi
  for l in "${lines[@]}"; do [[ $l == PASS* ]] || exit 1; done
  exit 0
}

version=$(sed -n '1s/^perfq (\([^)]*\)).*/\1/p' "$ROOT/debian/changelog")
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ -z "$prefix" ]; then
  result FAIL deb-build "$BUILD is not a configured build folder (make build first)"
  finish
fi
restore() { cmake -S "$ROOT" -B "$BUILD" -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null; }
trap restore EXIT

# The source as committed plus what is new and not ignored, without build
# folders; dpkg-buildpackage writes its packages beside it, into OUT.
rm -rf "$OUT"
src=$OUT/perfq-$version
mkdir -p "$src"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c --no-recursion 2>/dev/null) \
    | tar -x -C "$src"
else
  tar -C "$ROOT" --exclude='./build*' --exclude=./.git -c . | tar -x -C "$src"
fi
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_INSTALL_PREFIX=/usr >/dev/null &&
  cmake --build "$BUILD" >/dev/null || {
  result FAIL deb-build "configuring $BUILD for /usr failed"; finish; }
echo "deb: packaging $BUILD as perfq $version (dpkg-buildpackage, log in $OUT/build.log)"
if ! (cd "$src" && PERFQ_PREBUILT=$BUILD dpkg-buildpackage -b -uc -us) >"$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log"
  result FAIL deb-build "dpkg-buildpackage failed (log in $OUT/build.log)"
  finish
fi
debs=("$OUT/perfq_${version}_amd64.deb" "$OUT/perfq-dkms_${version}_all.deb")
for d in "${debs[@]}"; do
  if [ ! -s "$d" ]; then
    result FAIL deb-build "$(basename "$d") was not made"
    finish
  fi
done
result PASS deb-build "$(cd "$OUT" && ls -s --block-size=K ./*.deb | tr '\n' ' ')"

# lintian: no errors (warnings and notes are printed, not fatal).
lintian --fail-on error --display-level '>=warning' "${debs[@]}" >"$OUT/lintian.txt" 2>&1
rc=$?
sed 's/^/deb: lintian| /' "$OUT/lintian.txt"
errors=$(grep -c '^E: ' "$OUT/lintian.txt")
if [ $rc -eq 0 ] && [ "$errors" -eq 0 ]; then
  result PASS lintian "no errors ($(grep -c '^W: ' "$OUT/lintian.txt") warnings)"
else
  result FAIL lintian "$errors errors (exit $rc), see $OUT/lintian.txt"
fi
finish
