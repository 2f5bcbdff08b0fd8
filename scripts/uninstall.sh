#!/usr/bin/env bash
# Remove what `make install` put there, from the list it kept (its paths
# include the DESTDIR of that install).
#   scripts/uninstall.sh BUILD_DIR     (its perfq-installed.txt)
#   scripts/uninstall.sh LIST          a list of installed files
# Files go, then the folders only perfq uses once empty (include/perfq,
# lib/.../cmake/perfq, etc/perfq, share/doc/perfq and the folders in it).
# The perfq group stays: files on the system may still belong to it
# (groupdel perfq removes it).
set -euo pipefail
list=${1:?usage: scripts/uninstall.sh BUILD_DIR|LIST}
[ -d "$list" ] && list=$list/perfq-installed.txt
if [ ! -s "$list" ]; then
  echo "perfq uninstall: $list not found: nothing was installed from this build folder" \
       "(make install writes it)" >&2
  exit 1
fi
removed=0
dirs=()
while IFS= read -r f || [ -n "$f" ]; do  # the manifest has no final newline
  [ -n "$f" ] || continue
  if [ -e "$f" ] || [ -L "$f" ]; then
    rm -f -- "$f"
    removed=$((removed + 1))
  fi
  d=$(dirname -- "$f")
  # share/doc/perfq/examples/app: it, examples and share/doc/perfq.
  while [[ $d == */doc/perfq/* ]]; do dirs+=("$d"); d=$(dirname -- "$d"); done
  case "$d" in */perfq) dirs+=("$d") ;; esac
done <"$list"
# The deepest first: a folder goes once what was in it has gone.
for d in $(printf '%s\n' "${dirs[@]}" | sort -u | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-); do
  rmdir --ignore-fail-on-non-empty -- "$d" 2>/dev/null || true
done
if [ -z "${DESTDIR:-}" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload || true
fi
rm -f -- "$list"
echo "perfq uninstall: removed $removed files"
