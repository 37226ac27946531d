#!/usr/bin/env bash
# The main job: builds kiln, emits the base Transformer and prints its summary, compiles
# the tiny golden model with `kiln compile` (Halide, ahead of time) and runs the compiled
# library against the PyTorch outputs, and does the same with the reference interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
kiln=build/tools/kiln
golden=tests/golden
mkdir -p out
echo "== kiln emit transformer --config base | kiln inspect -"
$kiln emit transformer --config base -o out/base.kir
$kiln inspect out/base.kir
echo
echo "== kiln opt (default pipeline) | kiln inspect --ops: the fused graph of the base model"
$kiln opt out/base.kir -o out/base.opt.kir
$kiln inspect out/base.opt.kir --ops
echo
echo "== kiln compile: the tiny golden model to a static and a shared library"
$kiln emit transformer --config tiny -o out/tiny.kir
$kiln compile out/tiny.kir --name tiny --emit=static,shared -o out/tiny
echo
echo "== the compiled model vs PyTorch (kiln run --compiled)"
for fn in forward encode; do
  $kiln run --compiled out/tiny --function $fn --weights $golden/tiny.weights.safetensors \
    --inputs $golden/tiny_b1.inputs.safetensors --expect $golden/tiny_b1.expected.safetensors
done
echo
echo "== the reference interpreter vs PyTorch (kiln run)"
for fn in forward encode; do
  $kiln run out/tiny.kir --function $fn --weights $golden/tiny.weights.safetensors \
    --inputs $golden/tiny_b1.inputs.safetensors --expect $golden/tiny_b1.expected.safetensors
done
