#!/usr/bin/env bash
# Runs one text-IR test file the way LLVM's lit runs a ShTest: every `# RUN:` line is a
# shell command, run in order under bash with `set -o pipefail`; each must exit 0.
#
#   usage: check.sh KILN FILE
#
# A RUN line ending in `\` continues on the next RUN line. Substitutions:
#   %kiln       KILN, the kiln binary
#   %s          FILE, the test itself
#   %t          a path of this test's own, in a temporary directory removed at exit
#               (%t.log, %t.kir, ...)
#   FileCheck   FileCheck-14, FileCheck or /usr/lib/llvm-14/bin/FileCheck (LLVM's, from
#               Debian's llvm-14-tools), where it is a command (first word, or after a
#               `|`, `;`, `&&`, `||` or `(`)
#   not         /usr/lib/llvm-14/bin/not (inverts an exit status), where it is a command
# For example:
#   # RUN: %kiln opt %s --passes=fuse-linear --debug-passes=fuse-linear 2>%t.log | FileCheck %s
#   # RUN: FileCheck %s --check-prefix=LOG < %t.log
#   # RUN: not %kiln opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=ERR
# On a failure it prints the RUN line (as written and as run) and what the command
# printed, and exits 1; a file without a RUN line exits 2.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: check.sh KILN FILE" >&2; exit 2; }
kiln=$(realpath "$1")
file=$(realpath "$2")
[ -x "$kiln" ] || { echo "check.sh: '$1' is not an executable" >&2; exit 2; }
[ -f "$file" ] || { echo "check.sh: no test file '$2'" >&2; exit 2; }

tool() {  # the first of the candidates that exists
  local c
  for c in "$@"; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return; fi
  done
  echo "check.sh: none of $* found (install llvm-14-tools: bash scripts/setup.sh)" >&2
  exit 2
}
filecheck=$(tool FileCheck-14 FileCheck /usr/lib/llvm-14/bin/FileCheck)
not=$(tool /usr/lib/llvm-14/bin/not not)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The RUN lines, continuations joined: commands[k] was written at file line lines[k].
commands=() lines=()
pending="" pending_line=0 n=0
while IFS= read -r text || [ -n "$text" ]; do
  n=$((n + 1))
  [[ $text =~ ^#[[:space:]]*RUN:[[:space:]]?(.*)$ ]] || continue
  part=${BASH_REMATCH[1]}
  [ -n "$pending" ] || pending_line=$n
  if [[ $part =~ ^(.*)\\[[:space:]]*$ ]]; then
    pending+="${BASH_REMATCH[1]} "
    continue
  fi
  commands+=("$pending$part")
  lines+=("$pending_line")
  pending=""
done <"$file"
if [ -n "$pending" ]; then
  echo "check.sh: $file:$pending_line: its last RUN line ends in a backslash" >&2
  exit 2
fi
if [ ${#commands[@]} -eq 0 ]; then
  echo "check.sh: $file has no '# RUN:' line" >&2
  exit 2
fi

# `word` replaced by `path` wherever it is a command: the first word, or the first after
# a |, ;, &&, || or (.
at_command() {
  local cmd=$1 word=$2 path=$3 out="" prefix
  local re="^(|.*[|;&(][[:space:]]*)${word}([[:space:]].*|)$"
  # Replace from the right, one occurrence at a time.
  while [[ $cmd =~ $re ]]; do
    prefix=${BASH_REMATCH[1]}
    out="$path${BASH_REMATCH[2]}$out"
    cmd=$prefix
  done
  printf '%s' "$cmd$out"
}

for k in "${!commands[@]}"; do
  cmd=${commands[$k]}
  cmd=${cmd//'%kiln'/"$(printf '%q' "$kiln")"}
  cmd=${cmd//'%s'/"$(printf '%q' "$file")"}
  cmd=${cmd//'%t'/"$(printf '%q' "$tmp/t")"}
  cmd=$(at_command "$cmd" FileCheck "$(printf '%q' "$filecheck")")
  cmd=$(at_command "$cmd" not "$(printf '%q' "$not")")
  status=0
  output=$(bash -o pipefail -c "$cmd" 2>&1) || status=$?
  if [ $status -ne 0 ]; then
    {
      echo "check.sh: $file:${lines[$k]}: RUN line $((k + 1)) of ${#commands[@]} failed" \
        "(exit status $status)"
      echo "  as written: ${commands[$k]}"
      echo "  as run:     $cmd"
      echo "--- its output (standard output and standard error) ---"
      printf '%s\n' "$output"
    } >&2
    exit 1
  fi
done
