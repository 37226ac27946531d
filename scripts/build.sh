#!/usr/bin/env bash
# Configures and builds kiln into build/ (Release with debug info, ccache, 2 jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${KILN_JOBS:-2}"
