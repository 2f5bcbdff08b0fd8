#!/usr/bin/env bash
# tests/install/check-docs.sh BUILD_DIR: the man pages built in BUILD_DIR/man
# render without warnings and document every option (with its default and
# environment variable) that the programs in BUILD_DIR/bin list in --help;
# perfqctl's bash completion offers every subcommand, every option and the
# values of the enumerated ones; perfq(3) names every function, macro, type
# and class of perfq.h and perfq.hpp.  The --help of the built binaries and
# the installed headers are the reference, so neither the pages nor the
# completion can drift from the code.
# One line per check; exits 1 if any failed.
set -euo pipefail

build=${1:?usage: check-docs.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$build/bin
completion=$src/tools/perfqctl/perfqctl.bash-completion
failed=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failed=1; }

# The options of one --help text, one line each: "NAMES<TAB>DEFAULT<TAB>ENV",
# NAMES like "-o,--output".  CLI11 prints an option as two spaces, its names
# and type (TYPE=DEFAULT, and "(Env:NAME)"), then two or more spaces and the
# description (or the description on the next lines).
help_options() {
  sed -n '/^Options:/,/^[^ ]/p' | grep -E '^  -' | sed -E 's/^  //; s/  .*//' |
    while IFS= read -r head; do
      local names=${head%% *} default="" env=""
      # --config=/etc/... has its default glued to the name.
      if [[ $names == *=* ]]; then default=${names#*=}; names=${names%%=*}; fi
      local rest=${head#"${head%% *}"}
      [[ $rest =~ (^|[^=])=([^ ]+) ]] && default=${BASH_REMATCH[2]}
      [[ $rest =~ \(Env:([A-Za-z_0-9]+)\) ]] && env=${BASH_REMATCH[1]}
      printf '%s\t%s\t%s\n' "$names" "$default" "$env"
    done
}

# The subcommands of a --help text.
help_subcommands() {
  sed -n '/^Subcommands:/,/^[^ ]/p' | grep -E '^  [a-z]' | awk '{print $1}'
}

# A page as plain text, wide enough that no line wraps.
render() { MANWIDTH=1000 man -E ascii -l "$1" 2>/dev/null; }

# Lines of a rendered page in section SEC ("OPTIONS"), or in its subsection
# SUB when given ("COMMANDS" "start").
section() {
  awk -v sec="$1" -v subsec="${2:-}" '
    /^[A-Z]/ { insec = ($0 == sec); insub = (subsec == ""); next }
    insec && /^   [^ ]/ { insub = (subsec != "" && $0 == "   " subsec); next }
    insec && insub { print }'
}

# The entry of option OPT within a section's text: from the line that names
# it as a term to the next term.
entry() {
  awk -v opt="$1" '
    /^       -/ {
      n = split($0, w, /[ ,=]+/); inside = 0
      for (i = 1; i <= n; i++) if (w[i] == opt) inside = 1
    }
    inside { print }'
}

has_word() { grep -qE -- "(^|[^A-Za-z0-9_-])$1([^A-Za-z0-9_-]|\$)"; }

# Check the options of one --help text (HELP) against the section text TEXT.
# Options listed in SKIP are documented elsewhere (in GLOBAL_TEXT).
check_options() {
  local what=$1 help=$2 text=$3 skip=${4:-} global_text=${5:-}
  local names default env name where missing=() count=0
  while IFS=$'\t' read -r names default env; do
    local first=${names##*,}
    where=$text
    [[ " $skip " == *" $first "* ]] && where=$global_text
    for name in ${names//,/ }; do
      count=$((count + 1))
      has_word "$name" <<<"$where" || { missing+=("$name"); continue; }
    done
    if ! has_word "$first" <<<"$where"; then continue; fi
    local e
    e=$(entry "$first" <<<"$where")
    if [[ -n $default ]] && ! grep -qF -- "$default" <<<"$e"; then
      missing+=("$first (default $default)")
    fi
    if [[ -n $env ]] && ! grep -qF -- "$env" <<<"$e"; then
      missing+=("$first (environment $env)")
    fi
  done < <(help_options <<<"$help")
  if ((${#missing[@]})); then
    fail "$what: missing from the page: ${missing[*]}"
  elif ((count == 0)); then
    fail "$what: no options found in --help (its format changed?)"
  else
    pass "$what: all $count option names, defaults and variables documented"
  fi
}

# --- (a) the pages render without warnings, with the sections a user needs.
pages=(perfqctl.1 perfq-daemon.8 perfq-devsim.1 perfq-demo-app.1 perfq.3)
for page in "${pages[@]}"; do
  f=$build/man/$page
  if [[ ! -s $f ]]; then
    fail "$page: not built in $build/man (scdoc missing? build target perfq_man)"
    continue
  fi
  warnings=$({ LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$f" >/dev/null
                groff -man -ww -z "$f"; } 2>&1 || true)
  if [[ -n $warnings ]]; then
    fail "$page: renders with warnings: $(tr '\n' ' ' <<<"$warnings")"
  else
    pass "$page: renders without warnings (man --warnings, groff -ww)"
  fi
  want=(NAME SYNOPSIS DESCRIPTION OPTIONS FILES "EXIT STATUS" EXAMPLES "SEE ALSO")
  [[ $page == perfq-devsim.1 ]] || want+=(ENVIRONMENT)
  [[ $page != *.3 ]] || want=(NAME SYNOPSIS DESCRIPTION "RETURN VALUE" ERRORS ENVIRONMENT EXAMPLES "SEE ALSO")
  text=$(render "$f")
  missing=()
  for s in "${want[@]}"; do grep -qx -- "$s" <<<"$text" || missing+=("$s"); done
  if ((${#missing[@]})); then
    fail "$page: sections missing: ${missing[*]}"
  else
    pass "$page: has ${want[*]}"
  fi
done

# --- (a') perfq(3) names everything public of the application API: the
# functions, macros and types of perfq.h, the classes, functions and
# enumerators of perfq.hpp (not the helpers that end in '_').
if [[ -s $build/man/perfq.3 ]]; then
  inc=$src/libperfq/include/perfq
  api=$( {
    grep -oE '^[a-z][^(]*[^a-z_0-9]perfq_[a-z_0-9]+\(' "$inc/perfq.h" | grep -oE 'perfq_[a-z_0-9]+\($' | tr -d '('
    grep -oE '^#define PERFQ_[A-Z_0-9]+' "$inc/perfq.h" | awk '{print $2}' | grep -vE '_$|^PERFQ_H$'
    grep -oE '^struct perfq_[a-z_]+ \{' "$inc/perfq.h" | awk '{print $2}'
    grep -oE '^(class|enum class) [A-Za-z]+' "$inc/perfq.hpp" | awk '{print $NF}'
    grep -oE '^(inline|constexpr) [a-z_0-9]+ [a-z_0-9]+\(' "$inc/perfq.hpp" | awk '{print $3}' | tr -d '('
    grep -oE '^  k[A-Za-z]+ =' "$inc/perfq.hpp" | awk '{print $1}'
  } | sort -u)
  page=$(render "$build/man/perfq.3")
  missing=()
  for name in $api; do has_word "$name" <<<"$page" || missing+=("$name"); done
  if ((${#missing[@]})); then
    fail "perfq.3: does not name ${missing[*]}"
  else
    pass "perfq.3: names all $(wc -w <<<"$api") public names of perfq.h and perfq.hpp"
  fi
fi

# --- (b) every option of every program, from its --help, is in its page.
if [[ -s $build/man/perfq-daemon.8 ]]; then
  check_options "perfq-daemon.8: perfq-daemon --help" "$("$bin/perfq-daemon" --help)" \
    "$(render "$build/man/perfq-daemon.8" | section OPTIONS)"
  text=$(render "$build/man/perfq-daemon.8")
  for f in /etc/perfq/perfq-daemon.conf /run/perfq/perfqd.sock; do
    grep -qF "$f" <<<"$(section FILES <<<"$text")" || fail "perfq-daemon.8: FILES lacks $f"
  done
fi
if [[ -s $build/man/perfq-devsim.1 ]]; then
  check_options "perfq-devsim.1: perfq-devsim --help" "$("$bin/perfq-devsim" --help)" \
    "$(render "$build/man/perfq-devsim.1" | section OPTIONS)"
fi
if [[ -s $build/man/perfq-demo-app.1 ]]; then
  check_options "perfq-demo-app.1: perfq-demo-app --help" "$("$bin/perfq-demo-app" --help)" \
    "$(render "$build/man/perfq-demo-app.1" | section OPTIONS)"
fi
if [[ -s $build/man/perfqctl.1 ]]; then
  page=$(render "$build/man/perfqctl.1")
  global=$(section OPTIONS <<<"$page")
  check_options "perfqctl.1: perfqctl --help" "$("$bin/perfqctl" --help)" "$global"
  for sub in $("$bin/perfqctl" --help | help_subcommands); do
    text=$(section COMMANDS "$sub" <<<"$page")
    if [[ -z $text ]]; then
      fail "perfqctl.1: no subsection for subcommand $sub under COMMANDS"
      continue
    fi
    # -h/--help is described once, under OPTIONS.
    check_options "perfqctl.1: perfqctl $sub --help" "$("$bin/perfqctl" "$sub" --help)" \
      "$text" "--help" "$global"
  done
  grep -qF PERFQ_SOCKET <<<"$(section ENVIRONMENT <<<"$page")" ||
    fail "perfqctl.1: ENVIRONMENT lacks PERFQ_SOCKET"
fi

# --- (c) the bash completion, as bash calls it.  It needs no bash-completion
# helpers, so a bare bash with the file sourced is what a user gets too.
# complete_words WORD...: the candidates for the last word, sorted, one line.
complete_words() {
  bash --norc --noprofile -c '
    source "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    _perfqctl perfqctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    if ((${#COMPREPLY[@]})); then printf "%s\n" "${COMPREPLY[@]}" | sort | tr "\n" " "; fi' _ "$completion" "$@"
}

# expect DESCRIPTION WANT(space-separated, any order) WORD...: exact set.
expect() {
  local what=$1 want got
  want=$(tr ' ' '\n' <<<"$2" | { grep -v '^$' || true; } | sort | tr '\n' ' ')
  shift 2
  got=$(complete_words "$@")
  if [[ $got == "$want" ]]; then
    pass "completion: $what -> ${got% }"
  else
    fail "completion: $what: got '$got', want '$want'"
  fi
}

# expect_all DESCRIPTION WANT WORD...: at least WANT.
expect_all() {
  local what=$1 want=$2 got w missing=()
  shift 2
  got=" $(complete_words "$@") "
  for w in $want; do [[ $got == *" $w "* ]] || missing+=("$w"); done
  if ((${#missing[@]})); then
    fail "completion: $what: missing ${missing[*]}"
  else
    pass "completion: $what -> all $(wc -w <<<"$want") expected"
  fi
}

subs=$("$bin/perfqctl" --help | help_subcommands | tr '\n' ' ')
expect "perfqctl st<TAB>" "start status stop" perfqctl st
expect "perfqctl <TAB>" "$subs" perfqctl ""
expect "perfqctl --socket S st<TAB>" "start status stop" perfqctl --socket /tmp/s st
for sub in $subs; do
  help=$("$bin/perfqctl" "$sub" --help)
  longs=$(help_options <<<"$help" | cut -f1 | tr ',' '\n' | grep '^--' | tr '\n' ' ')
  all=$(help_options <<<"$help" | cut -f1 | tr ',' '\n' | tr '\n' ' ')
  expect "perfqctl $sub --<TAB>" "$longs" perfqctl "$sub" --
  expect "perfqctl $sub -<TAB>" "$all" perfqctl "$sub" -
  # Enumerated values: TYPE:{a,b,...} in --help.
  while IFS=$'\t' read -r names _ _; do
    line=$(grep -E "^  ${names}( |$)" <<<"$help" || true)
    if [[ $line =~ :\{([^}]*)\} ]]; then
      for name in ${names//,/ }; do
        expect "perfqctl $sub $name <TAB>" "${BASH_REMATCH[1]//,/ }" perfqctl "$sub" "$name" ""
      done
    fi
  done < <(help_options <<<"$help")
done
expect "perfqctl export --format=c<TAB>" "chrome-json csv ctf" perfqctl export --format = c
# --kernel-events lists its classes in prose: sched, syscalls or both.
expect "perfqctl start --kernel-events <TAB>" "sched syscalls sched,syscalls" \
  perfqctl start --kernel-events ""

# File names: for -o/--output, --pci-dump and the trace argument.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
touch "$tmp/run.trace" "$tmp/bus.txt"
expect "perfqctl start -o DIR/ru<TAB>" "$tmp/run.trace" perfqctl start -o "$tmp/ru"
expect "perfqctl export -f csv --output DIR/ru<TAB>" "$tmp/run.trace" \
  perfqctl export -f csv --output "$tmp/ru"
expect "perfqctl report DIR/r<TAB>" "$tmp/run.trace" perfqctl report "$tmp/r"
expect "perfqctl devices --pci-dump DIR/b<TAB>" "$tmp/bus.txt" perfqctl devices --pci-dump "$tmp/b"
# shm:PATH: bash splits the word at ':'; candidates are the part after it.
expect "perfqctl record --device shm:DIR/ru<TAB>" "$tmp/run.trace" \
  perfqctl record --device shm : "$tmp/ru"
expect "perfqctl start --duration <TAB>" "" perfqctl start --duration ""

if ((failed)); then
  echo "check-docs: FAILED"
  exit 1
fi
echo "check-docs: all passed"
