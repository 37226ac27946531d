#!/usr/bin/env bash
# Configures and builds kiln into build/ (Release with debug info, ccache, 2 jobs).
#   usage: build.sh [TARGET...]
# With target names it builds only those and what they need (scripts/demo.sh: the compiler,
# kiln-run and the runtime, without the test suite's ~170 targets and test models); without,
# everything (scripts/test.sh). Then makes the Python module importable (below).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "${KILN_JOBS:-2}" "${targets[@]}"
# The Python module (build/python/kiln.*.so, where it was built): importable as `import kiln`
# by this user's Debian python3 (and any Python 3 of the same version) through a .pth file in
# the user's site-packages that names build/python.
if compgen -G "build/python/kiln.*.so" > /dev/null; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if site=$("$py" -m site --user-site 2>/dev/null) && mkdir -p "$site" 2>/dev/null; then
    echo "$PWD/build/python" > "$site/kiln.pth"
  else
    echo "build.sh: cannot write to the user site-packages; use PYTHONPATH=$PWD/build/python" >&2
  fi
fi
