#!/usr/bin/env bash
# The main job: builds kiln, compiles the shipped number translator (examples/numbers) with
# `kiln compile` and translates example sentences with `kiln translate`, measures its
# held-out accuracy through the compiled model; then emits the base Transformer and prints
# its summary, compiles the tiny golden model and runs the compiled library against the
# PyTorch outputs, and does the same with the reference interpreter. It builds only what it
# runs: kiln, kiln-run and the runtime (scripts/test.sh builds the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh kiln kiln-run kiln_runtime kiln_python
kiln=build/tools/kiln
golden=tests/golden
mkdir -p out
numbers=examples/numbers
echo "== kiln compile: the number translator (English words -> digits, examples/numbers)"
$kiln emit transformer --config numbers -o out/numbers.kir
$kiln compile out/numbers.kir --name numbers --emit=static,shared -o out/numbers
echo
echo "== kiln translate: example sentences (greedy, then beam 4)"
translate=($kiln translate --compiled out/numbers --weights $numbers/numbers.weights.safetensors
  --src-vocab $numbers/vocab.src.txt --tgt-vocab $numbers/vocab.tgt.txt)
"${translate[@]}" < $numbers/examples.txt
"${translate[@]}" --beam 4 "three hundred and twelve thousand and one"
echo
echo "== the same from Python (import kiln: examples/python/translate_numbers.py)"
PYTHONPATH=build/python /usr/bin/python3 examples/python/translate_numbers.py out/numbers \
  "three hundred and twelve thousand and one" "forty two"
echo
echo "== held-out accuracy through the compiled model ($numbers/heldout.tsv)"
cut -f1 $numbers/heldout.tsv | "${translate[@]}" | sed 's/.* -> //' > out/numbers.heldout.txt
paste out/numbers.heldout.txt <(cut -f2 $numbers/heldout.tsv) |
  awk -F'\t' '$1 == $2 { right++ } END { printf "exact match: %d of %d (%.1f%%)\n", right, NR, 100 * right / NR }'
echo
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
