#!/usr/bin/env bash
# The README's command-line sections are what kiln prints, so they cannot drift from the one
# declaration of each option (tools/cli.cpp, tools/kiln.cpp):
#  - the block after "<!-- kiln usage -->" is every command's usage (`kiln CMD --help` up to
#    its first empty line, "usage: " dropped), then `kiln models` and `kiln --version`;
#  - the block after "<!-- kiln translate search options -->" is the "search options:" part
#    of `kiln translate --help`, the defaults included (kiln_search_options_init's);
#  - the block after "<!-- kiln serve options -->" is the "options:" part of `kiln serve --help`
#    (kiln-run answers it: tools/serve.cpp).
#   readme_cli.sh KILN SOURCE_DIR
set -euo pipefail
kiln="$1"
readme="$2/README.md"

# The lines of the fenced block after the line `$1` in the README.
block() {
  awk -v marker="$1" '
    $0 == marker { armed = 1; next }
    armed && /^```/ && !inside { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' "$readme"
}

check() {  # NAME EXPECTED ACTUAL
  if [ -z "$3" ]; then
    echo "readme_cli.sh: README.md has no block for $1" >&2
    exit 1
  fi
  if ! diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") >/dev/null; then
    echo "readme_cli.sh: README.md's $1 differs from what kiln prints (< kiln, > README):" >&2
    diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") >&2 || true
    exit 1
  fi
  echo "README's $1 matches kiln"
}

# Each --help is read whole before awk stops at its first empty line: awk leaving early would
# break the pipe under a help longer than one write (4096 bytes) and fail the script.
usage=""
for cmd in emit import inspect opt compile run translate generate serve pack-weights; do
  help=$("$kiln" "$cmd" --help)
  usage+=$(awk 'NF == 0 { exit } { print substr($0, 8) }' <<<"$help")$'\n'
done
usage+=$'kiln models\nkiln --version'
check "usage block" "$usage" "$(block '<!-- kiln usage -->')"

help=$("$kiln" translate --help)
search=$(awk '/^search options:$/ { on = 1 } on && NF == 0 { exit } on' <<<"$help")
check "translate search options" "$search" "$(block '<!-- kiln translate search options -->')"

help=$("$kiln" serve --help)
serve=$(awk '/^options:$/ { on = 1 } on && NF == 0 { exit } on' <<<"$help")
check "serve options" "$serve" "$(block '<!-- kiln serve options -->')"
