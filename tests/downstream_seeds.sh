#!/usr/bin/env bash
# Builds examples/seeds (the five seed write-ups written with the installed DSL,
# kiln_add_model ... SOURCES) as a downstream project against the kiln installed by
# downstream.sh, and checks each model against its PyTorch twin's golden (max abs error
# <= 1e-4): through the interpreter (`kiln run` on the .kir its generator wrote), through the
# compiled library (check_MODEL), and by greedy generation through the compiled code
# (greedy_MODEL, tokens as PyTorch's). Then the fused ops of the default pipeline
# (`kiln opt`, `kiln inspect --ops`): the counts are printed for every model and asserted for
# the models in FUSED. Every model is tried; the status is 1 if any check failed.
#   downstream_seeds.sh SOURCE_DIR WORK_DIR PREFIX MODELS FUSED
set -uo pipefail
src="$1"; work="$2"; prefix="$3"; models="${4:-}"
fused=" $(tr -s '[:space:]' ' ' <<<"${5:-}") "  # lists may span lines
seeds="$src/examples/seeds"
golden="$seeds/golden"
if [[ ! -x "$prefix/bin/kiln" ]]; then
  echo "downstream_seeds.sh: no installed kiln in $prefix (downstream.sh installs it)" >&2
  exit 1
fi
rm -rf "$work" && mkdir -p "$work"
cmake -S "$seeds" -B "$work" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null || exit 1
failed=()
# Fused-op counts of each model after the default pipeline (2 encoder and 2 decoder layers):
# attention: one per attention sublayer (2 + 2*2 = 6), no softmax left; add_layernorm: one per
# residual sum + LayerNorm (post-norm: 2 per encoder layer, 3 per decoder layer = 10);
# layernorm: a stack's final norm, which follows the last layer's norm with no sum before it.
declare -A want_layernorm=([seed0_neginf_fill]=2 [seed1_custom_layernorm]=0
                           [seed2_tied_generator]=2 [seed3_query_mask]=1
                           [seed4_no_final_norm]=0)
for m in $models; do
  w="$golden/$m.weights.safetensors"
  # The interpreter, on the IR the user's generator program wrote.
  if cmake --build "$work" --target "${m}_kir" >"$work/$m.kir.log" 2>&1; then
    "$prefix/bin/kiln" run "$work/$m.kiln/$m.input.kir" --weights "$w" \
      --inputs "$golden/$m.inputs.safetensors" --expect "$golden/$m.expected.safetensors" \
      --atol 1e-4 | sed "s|^|interpreted $m |; s| vs $golden/| vs |" || failed+=("$m (interpreted)")
  else
    cat "$work/$m.kir.log" >&2
    failed+=("$m (generator)")
    continue
  fi
  # The same source is a registered model of the installed kiln: `kiln emit` (its only config,
  # small, by default) writes the same IR.
  if "$prefix/bin/kiln" emit "$m" -o "$work/$m.emitted.kir" &&
     cmp -s "$work/$m.emitted.kir" "$work/$m.kiln/$m.input.kir"; then
    echo "registered $m: kiln emit $m writes the generator's IR"
  else
    failed+=("$m (kiln emit: not the generator's IR)")
  fi
  # The compiled library, linked by an application, and greedy generation through it.
  if cmake --build "$work" --target "check_$m" "greedy_$m" -j 2 >"$work/$m.build.log" 2>&1; then
    (cd "$work" && ./check_$m "$w" "$golden/$m.inputs.safetensors" \
      "$golden/$m.expected.safetensors" 1e-4 src,tgt logits) || failed+=("$m (compiled)")
    (cd "$work" && ./greedy_$m "$w" "$golden/$m.greedy.safetensors") ||
      failed+=("$m (greedy generation)")
  else
    grep -E "error|Error" "$work/$m.build.log" | head -20 >&2
    failed+=("$m (kiln compile)")
  fi
  # The fused ops of the default pipeline.
  kir="$work/$m.kiln/$m.input.kir"
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
    if [[ $(count attention) != 6 || $(count softmax) != 0 || $(count add_layernorm) != 10 ||
          $(count layernorm) != "${want_layernorm[$m]}" ]]; then
      echo "$m: expected attention 6, softmax 0, add_layernorm 10, layernorm ${want_layernorm[$m]}" >&2
      failed+=("$m (fusion)")
    fi
  else
    echo "ops $m: not asserted (not in the list of models whose fusions fire)"
  fi
done
if (( ${#failed[@]} )); then
  echo "downstream_seeds.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "downstream_seeds.sh: every check that ran passed"
