#!/usr/bin/env bash
# Runs kiln's whole test suite: installs what is missing, builds, checks the formatting
# (scripts/check_format.sh), runs every test, then runs the tests that read hostile input
# (weights files, IR text, the runtime boundary, the fuzz corpora) again under
# AddressSanitizer and UBSan, and the concurrency tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/check_format.sh
(cd build && ctest --output-on-failure -j 2)

echo "== AddressSanitizer + UBSan: runtime_tests, ir_tests, abi_tests, decode_tests, process_tests,"
echo "   translate_tests, fuzz corpora (ir, safetensors, abi, onnx)"
# abi_tests links a model compiled by the kiln just built (KILN_TOOL); the runtime and the
# test are instrumented.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_ASAN=ON \
  -DKILN_TOOL="$PWD/build/tools/kiln" >/dev/null
cmake --build build-asan -j "${KILN_JOBS:-2}" --target runtime_tests ir_tests abi_tests \
  decode_tests process_tests translate_tests kiln-run fuzz_replay_ir fuzz_replay_safetensors \
  fuzz_replay_abi fuzz_replay_onnx
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
build-asan/tests/runtime_tests --gtest_brief=1
build-asan/tests/ir_tests --gtest_brief=1
build-asan/tests/abi_tests --gtest_brief=1
build-asan/tests/decode_tests --gtest_brief=1  # generation: caches, beams, the search
build-asan/tests/process_tests --gtest_brief=1  # kiln compile's children, signals, staging
# kiln translate's input (vocabularies, text, limits) through the instrumented kiln-run, with
# the model library that the first build compiled (its runtime is not instrumented).
KILN_RUN="$PWD/build-asan/tools/kiln-run" \
  KILN_TRANSLATE_MODEL="$PWD/build/tests/translate_numbers.kiln" \
  build-asan/tests/translate_tests --gtest_brief=1
# The fuzz targets' committed corpora (fuzz/README.md), every input once.
for target in ir safetensors abi onnx; do
  build-asan/fuzz/fuzz_replay_$target fuzz/corpus/$target
done

echo "== ThreadSanitizer: concurrency_tests"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_TSAN=ON \
  -DKILN_TOOL="$PWD/build/tools/kiln" >/dev/null
cmake --build build-tsan -j "${KILN_JOBS:-2}" --target concurrency_tests
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" \
  build-tsan/tests/concurrency_tests --gtest_brief=1
echo "all tests passed"
