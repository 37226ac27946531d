#!/usr/bin/env bash
# Builds examples/ as a downstream project against an installed kiln, runs it on the
# golden tiny model, and checks its outputs against PyTorch's (max abs error <= 1e-4).
#   downstream.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build="$1"; src="$2"; work="$3"
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The runtime library needs nothing but libc/libstdc++ at link time (fmt is compiled in).
needs_fmt=$(nm -u "$work/prefix/lib/libkiln_runtime.a" | grep -E '_ZN(K)?3fmt' || true)
if [[ -n "$needs_fmt" ]]; then
  echo "downstream.sh: libkiln_runtime.a has undefined fmt symbols:" >&2
  echo "$needs_fmt" | head -5 >&2
  exit 1
fi
cmake -S "$src/examples" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" -j 2
"$work/build/translate" "$src/tests/golden/tiny.weights.safetensors" \
  "$src/tests/golden/tiny_b1.inputs.safetensors" "$src/tests/golden/tiny_b1.expected.safetensors"
# The shipped number translator, linked the same way: translates the example sentences,
# then the held-out set (exit 1 below 95% exact match).
numbers="$src/examples/numbers"
"$work/build/translate_lines" "$numbers/numbers.weights.safetensors" "$numbers/vocab.src.txt" \
  "$numbers/vocab.tgt.txt" < "$numbers/examples.txt"
"$work/build/translate_lines" "$numbers/numbers.weights.safetensors" "$numbers/vocab.src.txt" \
  "$numbers/vocab.tgt.txt" 1 "$numbers/heldout.tsv" | tail -1
