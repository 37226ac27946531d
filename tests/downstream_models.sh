#!/usr/bin/env bash
# Builds examples/models (seven models written outside kiln, kiln_add_model ... SOURCES) as
# a downstream project against the kiln installed by downstream.sh, and checks each model
# against its PyTorch golden (max abs error <= 1e-4): through the interpreter (`kiln run`
# on the .kir the model's generator wrote) and through the compiled library; the GPT model
# also generates greedily. Every model is tried; the status is 1 if any check failed.
#   downstream_models.sh SOURCE_DIR WORK_DIR PREFIX COMPILED FUSED
# COMPILED: the models checked compiled too (space-separated); a model kiln does not compile
# yet is left out of it, and the script says so. FUSED: the models whose fused-op counts
# are asserted (classifier, gpt, transformer); the counts of the others are printed.
set -uo pipefail
src="$1"; work="$2"; prefix="$3"; compiled=" ${4:-} "; fused=" ${5:-} "
models="$src/examples/models"
golden="$models/golden"
if [[ ! -x "$prefix/bin/kiln" ]]; then
  echo "downstream_models.sh: no installed kiln in $prefix (downstream.sh installs it)" >&2
  exit 1
fi
rm -rf "$work" && mkdir -p "$work"
cmake -S "$models" -B "$work" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null || exit 1
failed=()
for m in classifier gpt multilabel transformer llama gpt2 t5; do
  outputs=$(case $m in classifier) echo "logits probs" ;; gpt | transformer | llama | gpt2 | t5) echo logits ;;
            *) echo scores ;; esac)
  inputs=$([[ $m == transformer || $m == t5 ]] && echo src,tgt || echo ids)
  # The interpreter, on the IR the user's generator program wrote.
  if cmake --build "$work" --target "${m}_kir" >"$work/$m.kir.log" 2>&1; then
    "$prefix/bin/kiln" run "$work/$m.kiln/$m.input.kir" --weights "$golden/$m.weights.safetensors" \
      --inputs "$golden/$m.inputs.safetensors" --expect "$golden/$m.expected.safetensors" \
      --atol 1e-4 | sed "s|^|interpreted $m |; s| vs $golden/| vs |" || failed+=("$m (interpreted)")
  else
    cat "$work/$m.kir.log" >&2
    failed+=("$m (generator)")
  fi
  # The compiled library, linked by an application.
  if [[ "$compiled" != *" $m "* ]]; then
    echo "compiled $m: not checked (not in the list of models kiln compiles)"
  elif cmake --build "$work" --target "check_$m" -j 2 >"$work/$m.build.log" 2>&1; then
    (cd "$work" && ./check_$m "$golden/$m.weights.safetensors" "$golden/$m.inputs.safetensors" \
      "$golden/$m.expected.safetensors" 1e-4 "$inputs" $outputs) || failed+=("$m (compiled)")
  else
    grep -E "error|Error" "$work/$m.build.log" | head -20 >&2
    failed+=("$m (kiln compile)")
  fi
done
# The models generating through derived entry points (nn::add_causal_lm, nn::add_seq2seq):
# greedy, beam 4 and sampling against their twins' search with a KV cache.
for m in llama gpt2 t5; do
  if [[ "$compiled" != *" $m "* ]]; then
    echo "generation with $m: not checked ($m is not compiled)"
  elif cmake --build "$work" --target "generate_check_$m" >"$work/generate_$m.log" 2>&1; then
    (cd "$work" && ./generate_check_$m "$golden/$m.weights.safetensors" \
      "$golden/$m.generate.safetensors") || failed+=("$m (generation)")
  else
    grep -E "error|Error" "$work/generate_$m.log" | head -20 >&2
    failed+=("generate_check_$m (build)")
  fi
done
if [[ "$compiled" != *" gpt "* ]]; then
  echo "greedy generation with gpt: not checked (gpt is not compiled)"
elif cmake --build "$work" --target gpt_generate >"$work/gpt_generate.log" 2>&1; then
  "$work/gpt_generate" "$golden/gpt.weights.safetensors" "$golden/gpt.greedy.safetensors" ||
    failed+=("gpt (greedy generation)")
else
  failed+=("gpt_generate (build)")
fi
# A misuse in a user's model is reported at the user's line with the module path.
want="dsl error at classifier.cpp:32 in 'layers.0.self_attn' (function 'forward'): heads = 3 does not divide d_model = 20"
if got=$("$work/classifier_generator" --set heads=3 -o "$work/bad.kir" 2>&1); then
  failed+=("classifier_generator --set heads=3 (no error)")
elif [[ "$got" != *"$want"* ]]; then
  echo "classifier_generator --set heads=3: expected '$want', got '$got'" >&2
  failed+=("classifier_generator --set heads=3 (message)")
else
  echo "misuse: $got"
fi
# The fused ops of the default pipeline (`kiln inspect --ops` after `kiln opt`): for the
# models in FUSED, each attention fused (no softmax left but the classifier's output), and
# every LayerNorm after a residual sum fused with it. The classifier and gpt: 2 layers, 2
# attention ops, 5 add_layernorm (2 per layer, layer 0's norm1 on the embeddings' sum of
# tokens [B,L,D] and positions [L,D] broadcast over the batch included, and the final
# norm), no plain layernorm. The transformer: 2 encoder layers (1 attention and 2 norms
# each) and 2 decoder layers (2 attention and 3 norms each), and the two stacks' final
# norms, which follow a norm, not a sum: plain layernorm.
#              attention softmax add_layernorm layernorm
declare -A want=([classifier]="2 1 5 0" [gpt]="2 0 5 0" [transformer]="6 0 10 2")
for m in classifier gpt transformer; do
  kir="$work/$m.kiln/$m.input.kir"
  [[ -f "$kir" ]] || continue
  if ! "$prefix/bin/kiln" opt "$kir" -o "$work/$m.opt.kir" ||
     ! "$prefix/bin/kiln" inspect "$work/$m.opt.kir" --ops >"$work/$m.ops"; then
    failed+=("$m (kiln opt)")
    continue
  fi
  count() { awk -v op="$1" '$2 == op { n = $3 } END { print n + 0 }' "$work/$m.ops"; }
  line="ops $m: attention $(count attention), softmax $(count softmax), add_layernorm"
  line+=" $(count add_layernorm), layernorm $(count layernorm), linear $(count linear)"
  echo "$line"
  if [[ "$fused" == *" $m "* ]]; then
    got="$(count attention) $(count softmax) $(count add_layernorm) $(count layernorm)"
    if [[ "$got" != "${want[$m]}" ]]; then
      echo "$m: expected attention, softmax, add_layernorm, layernorm ${want[$m]}; got $got" >&2
      failed+=("$m (fusion)")
    fi
  fi
done
if (( ${#failed[@]} )); then
  echo "downstream_models.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "downstream_models.sh: every check that ran passed"
