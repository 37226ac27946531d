#!/usr/bin/env bash
# Runs one text-IR pass test: `kiln opt FILE <RUN args>` piped into FileCheck FILE.
# The test file's first `# RUN:` line holds the kiln opt arguments, e.g.
#   # RUN: --passes=fuse-attention
# and its `# CHECK...:` lines are FileCheck directives on the output.
set -euo pipefail
kiln="$1"; file="$2"
filecheck=$(command -v FileCheck-14 || command -v FileCheck || echo /usr/lib/llvm-14/bin/FileCheck)
args=$(sed -n 's/^# RUN: *//p' "$file" | head -n 1)
[ -n "$args" ] || { echo "check.sh: $file has no '# RUN:' line" >&2; exit 2; }
# shellcheck disable=SC2086
"$kiln" opt "$file" $args | "$filecheck" --dump-input=fail "$file"
