#!/usr/bin/env bash
# libperfq.so.0 of a build exports no symbol that debian/libperfq0.symbols
# lacks: the deb's dpkg-gensymbols check (scripts/make-deb.sh, deb-symbols)
# fails on any new one, but only after the packages' seven-minute build, so
# a new exported function is caught here first, with the lines to add.
#   tests/install/check-symbols.sh LIBPERFQ_SO SYMBOLS_FILE
# A symbol the file lists and this build does not export is not an error
# here: the packages' build (Debian's flags) decides those.
set -euo pipefail
lib=${1:?usage: check-symbols.sh LIBPERFQ_SO SYMBOLS_FILE}
file=${2:?usage: check-symbols.sh LIBPERFQ_SO SYMBOLS_FILE}
[ -r "$lib" ] || { echo "check-symbols: cannot read $lib" >&2; exit 1; }
[ -r "$file" ] || { echo "check-symbols: cannot read $file" >&2; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk 'NF == 3 { print $3 }' | sort -u)
listed=$(sed -n 's/^ \((optional[^)]*)\)\{0,1\}\([^ @]*\)@Base .*/\2/p' "$file" | sort -u)
[ -n "$listed" ] || { echo "check-symbols: no symbols read from $file" >&2; exit 1; }
# A new symbol comes with the package's version (debian/changelog, as
# scripts/make-deb.sh reads it).
changelog=$(dirname "$file")/changelog
version=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$changelog" 2>/dev/null)
[ -n "$version" ] || { echo "check-symbols: no version read from $changelog" >&2; exit 1; }
new=$(comm -23 <(printf '%s\n' "$exported") <(printf '%s\n' "$listed"))
if [ -n "$new" ]; then
  echo "check-symbols: $lib exports $(wc -l <<<"$new") symbol(s) that $file does not list; add them (in order):" >&2
  sed "s/.*/ &@Base $version/" <<<"$new" >&2
  exit 1
fi
echo "check-symbols: every one of the $(wc -l <<<"$exported") symbols $lib exports is in $file"
