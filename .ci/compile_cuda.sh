#!/usr/bin/env bash
# Compiles every CUDA translation unit of aten_kernels/ with nvcc against the
# ATen headers of torch 2.14.1+cu130 (no GPU needed). A compile error fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DETGRID_CACHE:-$HOME/.cache/detgrid}/cuda-headers-2.14.1
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
pip=${PIP:-pip}

if [ ! -f "$cache/.complete" ]; then
  rm -rf "$cache" && mkdir -p "$cache/wheels"
  "$pip" download -q --no-deps -d "$cache/wheels" \
    torch==2.14.1 nvidia-cublas nvidia-cusparse nvidia-cusolver
  unzip -q -o "$cache"/wheels/torch-2.14.1-*.whl 'torch/include/*' -d "$cache"
  for wheel in "$cache"/wheels/nvidia_*.whl; do
    unzip -q -o "$wheel" 'nvidia/cu13/include/*' -d "$cache"
  done
  rm -rf "$cache/wheels"
  touch "$cache/.complete"
fi

status=0
while IFS= read -r -d '' unit; do
  echo "nvcc: ${unit#"$root"/}"
  if ! "$nvcc" -c -std=c++20 -O2 -o /dev/null \
      -DCUB_WRAPPED_NAMESPACE=at_cuda_detail -DTORCH_EXTENSION_NAME=compile_check \
      --expt-relaxed-constexpr --expt-extended-lambda \
      -gencode arch=compute_90,code=sm_90 \
      -Xcompiler -fPIC \
      -I"$root/aten_kernels/aten/src" \
      -I"$cache/torch/include" \
      -I"$cache/torch/include/torch/csrc/api/include" \
      -I"$cache/nvidia/cu13/include" \
      "$unit"; then
    echo "FAILED: ${unit#"$root"/}"
    status=1
  fi
done < <(find "$root/aten_kernels" -name '*.cu' -print0 | sort -z)
exit $status
