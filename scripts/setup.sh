#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build and test, skipping those present.
# OpenCL on pocl (ocl-icd-opencl-dev, pocl-opencl-icd, clinfo) runs the GPU kernels' tests on
# the CPU: `clinfo -l` should list a pocl device. The Python module (python/) builds with
# python3-dev and pybind11-dev; its tests run with python3-numpy and python3-pytest. kiln serve
# builds with libcpp-httplib-dev and nlohmann-json3-dev; its tests use curl, python3-requests
# and nginx (started by the tests on their own configuration), its bench wrk. The tokenizers
# (tokenizers/) link libsentencepiece and libpcre2 (byte-level BPE's pre-tokenizer patterns);
# python3-sentencepiece retrains the demo SentencePiece
# model (examples/tokenizers/make_tokenizers.py). The Dask example
# (examples/python/dask_translate.py, run by the Python tests) needs python3-distributed.
# `kiln import` reads ONNX with libonnx-dev (the onnx.proto messages) and libprotobuf-dev.
set -euo pipefail

packages=(cmake ninja-build g++ ccache pkg-config llvm-14 llvm-14-tools
          libfmt-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
          libhalide14-0-dev llvm-14-dev clang-format-14
          ocl-icd-opencl-dev pocl-opencl-icd clinfo
          python3-dev pybind11-dev python3-numpy python3-pytest
          libcpp-httplib-dev nlohmann-json3-dev curl python3-requests wrk nginx
          libsentencepiece-dev libpcre2-dev python3-sentencepiece python3-distributed
          libonnx-dev libprotobuf-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
