#!/usr/bin/env bash
# The user's guide (docs/*.md) and the README say only what kiln does:
#  1. every `kiln CMD --option` they mention (in a code block, or in an inline code span that
#     starts the command) is an option of `kiln CMD --help`, so a renamed or removed option
#     fails here;
#  2. a block after "<!-- kiln CMD SECTION -->" in a docs page ("options", "search options")
#     is that section of `kiln CMD --help`, word for word;
#  3. the examples marked runnable run. In each docs page, in order:
#       <!-- docs: file NAME -->     the next fenced block is written to NAME;
#       <!-- docs: run -->           the next fenced block (sh) is run with bash -euo pipefail;
#       <!-- docs: run python -->    the same, skipped where the Python module is not built;
#       <!-- docs: output -->        the next fenced block is the last run block's standard
#                                    output, exactly.
#     Each page runs in a scratch directory of its own, where `tests` and `examples` are the
#     source tree's, $PREFIX is an installed kiln (`cmake --install`: the ctest's fixture
#     kiln_installed), its `kiln` and `kiln-run` and `python3` (Debian's, with the kiln module)
#     are on PATH.
#   docs_check.sh SOURCE_DIR PREFIX [PYTHON PYTHON_MODULE_DIR]
set -euo pipefail
src="$1"
prefix="$2"
python="${3:-}"
python_dir="${4:-}"
kiln="$prefix/bin/kiln"
fail() {
  echo "docs_check.sh: $*" >&2
  exit 1
}
[ -x "$kiln" ] || fail "no kiln at '$kiln' (install kiln into '$prefix' first)"
shopt -s nullglob
pages=("$src"/docs/*.md)
((${#pages[@]})) || fail "no pages in $src/docs"

# --- 1. options ------------------------------------------------------------------------------
# The commands `kiln --help` lists (a new one is checked without changing this script), each
# with the options its own --help declares.
commands=$(awk '/^commands:$/ { on = 1; next } on && NF == 0 { exit } on && $1 ~ /^[a-z][a-z-]*$/ { print $1 }' \
  <<<"$("$kiln" --help)")
[ -n "$commands" ] || fail "kiln --help lists no commands"
commands=$(echo $commands)
declare -A known
for cmd in $commands; do
  help=$("$kiln" "$cmd" --help 2>/dev/null) || help=""
  # Option lines: "  --name ARG  help", "  -o FILE  help"; every name they declare.
  known[$cmd]=" --help $({ grep -oE '^ +(-[A-Za-z]|--[a-z0-9][a-z0-9-]*)' <<<"$help" || true; } |
    tr -d ' ' | tr '\n' ' ')"
done

# Prints "FILE:LINE CMD OPTION" for every option after `kiln CMD` (also `$kiln CMD`,
# `build/tools/kiln CMD`) in code blocks (continuation lines joined) and inline code spans, up
# to the end of the command (a pipe, `;`, `&&`, `)` or a comment).
mentions() {
  awk -v cmds="$commands" '
    function scan(text, where,    rest, cmd, opts, o) {
      while (match(text, /(^|[^A-Za-z0-9_.\/-])(\$kiln|kiln|build\/tools\/kiln) +[a-z][a-z-]*/)) {
        rest = substr(text, RSTART + RLENGTH)
        cmd = substr(text, RSTART, RLENGTH); sub(/.* /, "", cmd)
        text = rest
        if (index(" " cmds " ", " " cmd " ") == 0 || rest ~ /^[A-Za-z0-9_-]/) continue
        opts = rest
        sub(/( \| |;|&&|\)| #|`).*/, "", opts)
        while (match(opts, /(^|[ \[(|\/=])(--[a-z0-9][a-z0-9-]*|-[A-Za-z])([ \]=|\/.,:)]|$)/)) {
          o = substr(opts, RSTART, RLENGTH)
          opts = substr(opts, RSTART + RLENGTH - 1)
          sub(/^[^-]*/, "", o); sub(/[^a-zA-Z0-9]$/, "", o)
          print where " " cmd " " o
        }
      }
    }
    FNR == 1 { fence = 0; held = "" }
    /^```/ { fence = !fence; held = ""; next }
    fence {
      line = held $0
      if (line ~ /\\$/) { held = substr(line, 1, length(line) - 1) " "; next }
      held = ""
      scan(line, FILENAME ":" FNR)
      next
    }
    {
      n = split($0, parts, "`")
      for (i = 2; i <= n; i += 2) scan(parts[i], FILENAME ":" FNR)
    }' "$@"
}

bad=0
checked=0
while read -r where cmd option; do
  checked=$((checked + 1))
  if [[ "${known[$cmd]}" != *" $option "* ]]; then
    echo "docs_check.sh: $where: 'kiln $cmd $option': kiln $cmd --help has no $option" >&2
    bad=1
  fi
done < <(mentions "$src/README.md" "${pages[@]}")
((bad == 0)) || exit 1
((checked > 0)) || fail "found no 'kiln COMMAND --option' in the docs"
echo "docs: $checked 'kiln COMMAND --option' mentions, each an option of its command"

# The lines of the fenced block after the line `$2` in file $1.
block() {
  awk -v marker="$2" '
    $0 == marker { armed = 1; next }
    armed && /^```/ && !inside { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' "$1"
}

# --- 2. help sections ------------------------------------------------------------------------
sections=0
for page in "${pages[@]}"; do
  while read -r cmd section; do
    help=$("$kiln" "$cmd" --help)
    want=$(awk -v head="$section:" '$0 == head { on = 1 } on && NF == 0 { exit } on' <<<"$help")
    got=$(block "$page" "<!-- kiln $cmd $section -->")
    [ -n "$want" ] || fail "$page: kiln $cmd --help has no '$section:' section"
    if ! diff <(printf '%s\n' "$want") <(printf '%s\n' "$got") >/dev/null; then
      echo "docs_check.sh: $page: the block '<!-- kiln $cmd $section -->' differs from" \
        "kiln $cmd --help (< kiln, > docs):" >&2
      diff <(printf '%s\n' "$want") <(printf '%s\n' "$got") >&2 || true
      exit 1
    fi
    sections=$((sections + 1))
  done < <(sed -n 's/^<!-- kiln \([a-z]*\) \(options\|search options\) -->$/\1 \2/p' "$page")
done
echo "docs: $sections help sections equal to kiln's --help"

# --- 3. runnable examples --------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-docs.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
prefix=$(cd "$prefix" && pwd)
have_python=0
if [ -n "$python" ] && [ -n "$python_dir" ] && compgen -G "$python_dir/kiln.*.so" >/dev/null; then
  have_python=1
  ln -s "$python" "$work/bin/python3"
fi
ran=0
skipped=0
for page in "${pages[@]}"; do
  name=$(basename "$page" .md)
  dir="$work/$name"
  mkdir -p "$dir"
  ln -s "$src/tests" "$dir/tests"
  ln -s "$src/examples" "$dir/examples"
  # One record per marked block: KIND<TAB>ARG<TAB>LINE, the block's text in a file of its own.
  awk -v dir="$dir" '
    /^<!-- docs: (file [^ ]+|run|run python|output) -->$/ {
      kind = $0; sub(/^<!-- docs: /, "", kind); sub(/ -->$/, "", kind); armed = FNR; next }
    armed && /^```/ && !inside { inside = 1; n++; out = dir "/.block" n; printf "" > out; next }
    inside && /^```$/ {
      inside = 0; close(out)
      split(kind, k, " ")
      printf "%s\t%s\t%d\t%s\n", k[1], (k[2] == "" ? "-" : k[2]), armed, out
      armed = 0; next }
    inside { print > out }
    armed && !inside && NF > 0 { armed = 0 }' "$page" >"$dir/.blocks"
  last=""
  last_skipped=0
  while IFS=$'\t' read -r kind arg line file; do
    where="docs/$name.md:$line"
    case "$kind" in
      file) cp "$file" "$dir/$arg" ;;
      run)
        if [ "$arg" = python ] && ((!have_python)); then
          echo "docs: $where skipped (the Python module is not built)"
          skipped=$((skipped + 1))
          last_skipped=1
          continue
        fi
        last_skipped=0
        echo "docs: $where: running"
        if ! last=$(cd "$dir" && PATH="$work/bin:$prefix/bin:$PATH" PREFIX="$prefix" \
          PYTHONPATH="$python_dir" bash -euo pipefail "$file" 2>"$dir/.stderr"); then
          echo "docs_check.sh: $where: the example failed:" >&2
          sed 's/^/  /' "$file" >&2
          echo "its standard output:" >&2
          printf '%s\n' "$last" >&2
          echo "its standard error:" >&2
          cat "$dir/.stderr" >&2
          exit 1
        fi
        ran=$((ran + 1))
        ;;
      output)
        if ((last_skipped)); then
          echo "docs: $where skipped (its example was)"
          continue
        fi
        if ! diff <(cat "$file") <(printf '%s\n' "$last") >/dev/null; then
          echo "docs_check.sh: $where: the output shown differs from the example's (< docs," \
            "> the run):" >&2
          diff <(cat "$file") <(printf '%s\n' "$last") >&2 || true
          exit 1
        fi
        ;;
    esac
  done <"$dir/.blocks"
done
((ran > 0)) || fail "no '<!-- docs: run -->' example in docs/"
echo "docs: $ran examples ran ($skipped skipped), every shown output equal to the run's"
