#!/usr/bin/env bash
# Fails when a tracked C or C++ file is not formatted as .clang-format says (Debian's
# clang-format 14, the version the tree was formatted with). Fix with:
#   git ls-files '*.cpp' '*.h' '*.c' | xargs clang-format-14 -i
set -euo pipefail
cd "$(dirname "$0")/.."
format=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$format" ] || { echo "check_format: clang-format-14 is not installed (scripts/setup.sh)" >&2; exit 1; }
files=$(git ls-files '*.cpp' '*.h' '*.c' '*.cc')
if ! out=$(echo "$files" | xargs "$format" --dry-run --Werror 2>&1); then
  echo "$out" | grep -E '^[^ ].*(warning|error):' | head -20 >&2
  echo "check_format: the files above are not formatted; run:" >&2
  echo "  git ls-files '*.cpp' '*.h' '*.c' | xargs $format -i" >&2
  exit 1
fi
echo "check_format: $(echo "$files" | wc -l) files formatted"
