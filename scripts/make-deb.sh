#!/usr/bin/env bash
# Build the Debian packages from source with Debian's flags, and check them.
#   scripts/make-deb.sh [--results FILE] BUILD_DIR
# Out, in BUILD_DIR/deb: libperfq0, libperfq-dev and perfq (<version>_amd64),
# perfq-dkms (<version>_all), lintian.txt and build.log.  dpkg-buildpackage
# compiles in BUILD_DIR/deb/obj (dpkg-buildflags, hardening=+all; tests and
# benchmarks off), which is kept: a second run compiles only what changed.
# Checks, with --results as "PASS/FAIL name" lines for make test:
#   deb-build     the four packages are made (and how long it took)
#   deb-hardening every program and library is linked with BIND_NOW and
#                 RELRO, calls fortified functions where it calls ones that
#                 have a fortified variant, and every compile command had
#                 dpkg-buildflags' -D_FORTIFY_SOURCE=2 -fstack-protector-strong
#   deb-symbols   libperfq.so.0 exports what debian/libperfq0.symbols lists,
#                 no more, no less
#   lintian       no errors, no warnings (infos and pedantic tags printed)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
results=
case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  --results) results=${2:?--results needs a FILE}; shift 2 ;;
  -*) echo "make-deb.sh: unknown option $1 (--results FILE, --help)" >&2; exit 2 ;;
esac
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
packages=("libperfq0_${version}_amd64.deb" "libperfq-dev_${version}_amd64.deb"
          "perfq_${version}_amd64.deb" "perfq-dkms_${version}_all.deb")

# The source as committed plus what is new and not ignored, without build
# folders, in a fresh copy each time; dpkg-buildpackage writes its packages
# beside it.  The build folder (obj) is kept.
src=$OUT/src/perfq-$version
rm -rf "$OUT/src" "$OUT"/*.deb "$OUT"/*.changes "$OUT"/*.buildinfo
mkdir -p "$src"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c --no-recursion 2>/dev/null) \
    | tar -x -C "$src"
else
  tar -C "$ROOT" --exclude='./build*' --exclude=./.git -c . | tar -x -C "$src"
fi
echo "deb: building perfq $version with dpkg-buildpackage in $OUT/obj (log in $OUT/build.log)"
start=$(date +%s)
# --no-pre-clean: the source copy is fresh, and a clean would remove obj.
if ! (cd "$src" && PERFQ_DEB_BUILDDIR=$OUT/obj DEB_BUILD_OPTIONS="parallel=$(nproc) ${DEB_BUILD_OPTIONS:-}" \
        dpkg-buildpackage -b -uc -us --no-pre-clean) >"$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log"
  result FAIL deb-build "dpkg-buildpackage failed (log in $OUT/build.log)"
  finish
fi
seconds=$(($(date +%s) - start))
debs=()
for p in "${packages[@]}"; do
  if [ ! -s "$OUT/src/$p" ]; then
    result FAIL deb-build "$p was not made"
    finish
  fi
  mv "$OUT/src/$p" "$OUT/"
  debs+=("$OUT/$p")
done
mv "$OUT"/src/*.changes "$OUT"/src/*.buildinfo "$OUT"/src/*.ddeb "$OUT"/src/*-dbgsym_*.deb "$OUT/" 2>/dev/null
result PASS deb-build "${#debs[@]} packages in ${seconds} s: $(cd "$OUT" && ls -s --block-size=K "${packages[@]}" | tr '\n' ' ')"

# Hardening: what lintian's hardening-no-bindnow, -no-relro and
# -no-fortify-functions look at, for each ELF file shipped (fortify as
# lintian judges it: a file that calls a function of its list
# hardened-functions must call at least one __*_chk variant), and every
# compile command of the build with the flags of dpkg-buildflags.
fortifiable=/usr/share/lintian/data/binaries/hardened-functions
unpacked=$OUT/unpacked
rm -rf "$unpacked"
bad=()
count=0
chk=0
for d in "${debs[@]}"; do
  dir=$unpacked/$(basename "$d" .deb)
  mkdir -p "$dir"
  dpkg-deb -x "$d" "$dir"
  while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    count=$((count + 1))
    name=${f#"$dir"}
    readelf -d "$f" | grep -qE 'FLAGS.*\bBIND_NOW\b|FLAGS_1.*\bNOW\b' || bad+=("$name: no BIND_NOW")
    readelf -lW "$f" | grep -q 'GNU_RELRO' || bad+=("$name: no RELRO")
    und=$(readelf --dyn-syms -W "$f" | awk '$7 == "UND" { sub(/@.*/, "", $8); print $8 }' | sort -u)
    plain=$(grep -xFf <(grep -v '^#' "$fortifiable" | grep .) <<<"$und" | tr '\n' ' ')
    fortified=$(grep -xFf <(grep -v '^#' "$fortifiable" | grep . | sed 's/.*/__&_chk/') <<<"$und" | wc -l)
    chk=$((chk + fortified))
    if [ -n "$plain" ] && [ "$fortified" -eq 0 ]; then
      bad+=("$name: calls $plain and no fortified (__*_chk) function")
    fi
  done < <(find "$dir" -type f -print0)
done
commands=$OUT/obj/compile_commands.json
unflagged=$(grep '"command"' "$commands" 2>/dev/null | grep -v -- '-target bpf' |
              grep -vc -- '-D_FORTIFY_SOURCE=2 .*-fstack-protector-strong\|-fstack-protector-strong.*-D_FORTIFY_SOURCE=2')
compiled=$(grep -c '"command"' "$commands" 2>/dev/null)
if [ "${compiled:-0}" -eq 0 ]; then
  bad+=("no compile commands in $commands")
elif [ "$unflagged" -ne 0 ]; then
  bad+=("$unflagged of $compiled compile commands lack -D_FORTIFY_SOURCE=2 or -fstack-protector-strong ($commands)")
fi
if [ "$count" -eq 0 ]; then
  result FAIL deb-hardening "no ELF file found in the packages"
elif ((${#bad[@]})); then
  result FAIL deb-hardening "$(printf '%s; ' "${bad[@]}")"
else
  result PASS deb-hardening "$count ELF files with BIND_NOW and RELRO, $chk fortified calls and none unfortified where one could be; $compiled compile commands with _FORTIFY_SOURCE=2 and the stack protector"
fi

# The symbols file: what libperfq.so.0 exports, compared at the strictest
# level (a new symbol is a failure too: add it to debian/libperfq0.symbols).
# An -O file that exists already would be the basis of the comparison
# instead of debian/libperfq0.symbols (dpkg-gensymbols(1)): the last run's.
rm -f "$OUT/libperfq0.symbols"
if (cd "$src" && dpkg-gensymbols -plibperfq0 -Pdebian/libperfq0 -v"$version" -c4 \
      -O"$OUT/libperfq0.symbols") >"$OUT/symbols.diff" 2>&1; then
  result PASS deb-symbols "libperfq.so.0 exports the $(grep -c '^ ' "$OUT/libperfq0.symbols") symbols of debian/libperfq0.symbols"
else
  sed 's/^/deb: symbols| /' "$OUT/symbols.diff" | head -n 40
  result FAIL deb-symbols "libperfq.so.0 and debian/libperfq0.symbols differ (diff in $OUT/symbols.diff; the new file is $OUT/libperfq0.symbols)"
fi

# lintian: no errors and no warnings; the infos and pedantic tags are
# printed (each one left is fixed, or overridden in debian/*.lintian-overrides
# with the reason).
lintian --fail-on error,warning --info --pedantic "${debs[@]}" >"$OUT/lintian.txt" 2>&1
rc=$?
grep -v '^running with root privileges' "$OUT/lintian.txt" | sed 's/^/deb: lintian| /'
errors=$(grep -c '^E: ' "$OUT/lintian.txt")
warnings=$(grep -c '^W: ' "$OUT/lintian.txt")
infos=$(grep -c '^[IP]: ' "$OUT/lintian.txt")
if [ $rc -eq 0 ] && [ "$errors" -eq 0 ] && [ "$warnings" -eq 0 ]; then
  result PASS lintian "no errors, no warnings ($infos info or pedantic tags)"
else
  result FAIL lintian "$errors errors, $warnings warnings (exit $rc), see $OUT/lintian.txt"
fi
finish
