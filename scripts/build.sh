#!/usr/bin/env bash
# Configures and builds kiln into build/ (Release with debug info, ccache, 2 jobs).
#   usage: build.sh [TARGET...]
# With target names it builds only those and what they need (scripts/demo.sh: the compiler,
# kiln-run and the runtime, without the test suite's ~170 targets and test models); without,
# everything (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "${KILN_JOBS:-2}" "${targets[@]}"
