#!/usr/bin/env bash
# The main job: builds kiln, emits the base Transformer and prints its summary, then
# runs the tiny golden model through the reference interpreter and reports the match
# against the PyTorch outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
kiln=build/tools/kiln
mkdir -p out
echo "== kiln emit transformer --config base | kiln inspect -"
$kiln emit transformer --config base -o out/base.kir
$kiln inspect out/base.kir
echo
echo "== tiny golden model through the interpreter vs PyTorch"
$kiln emit transformer --config tiny -o out/tiny.kir
for fn in forward encode; do
  $kiln run out/tiny.kir --function $fn --weights tests/golden/tiny.weights.safetensors \
    --inputs tests/golden/tiny_b1.inputs.safetensors --expect tests/golden/tiny_b1.expected.safetensors
done
