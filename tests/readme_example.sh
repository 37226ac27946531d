#!/usr/bin/env bash
# The README's model example (the ```cpp block after "<!-- example: FILE -->") is FILE,
# byte for byte: the README shows code that builds and is tested (downstream_models).
#   readme_example.sh SOURCE_DIR
set -euo pipefail
src="$1"
found=0
while read -r file; do
  found=1
  block=$(awk -v marker="<!-- example: $file -->" '
    $0 == marker { armed = 1; next }
    armed && /^```cpp$/ { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' "$src/README.md")
  if ! diff <(printf '%s\n' "$block") "$src/$file" >/dev/null; then
    echo "readme_example.sh: README's example differs from $file:" >&2
    diff <(printf '%s\n' "$block") "$src/$file" >&2 || true
    exit 1
  fi
  echo "README example matches $file"
done < <(sed -n 's/^<!-- example: \(.*\) -->$/\1/p' "$src/README.md")
if (( !found )); then
  echo "readme_example.sh: no '<!-- example: FILE -->' marker in README.md" >&2
  exit 1
fi
