#!/usr/bin/env bash
# Compiles every CUDA translation unit of aten_kernels/ with nvcc, and the
# extension's CUDA-side C++ with g++, against the ATen headers of each torch
# release below (no GPU needed). Any compile error fails.
#   2.14.1+cu130: the local wheel (pip's cap on this machine)
#   2.15.0+cu132: the newest release, from PyPI past the cap
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nvcc=${NVCC:-$cuda_home/bin/nvcc}
cuda_include=$cuda_home/include
python=${PYTHON:-python3}

status=0
for version in 2.14.1 2.15.0; do
  cache=$(PYTHON=$python bash "$root/.ci/fetch_cuda_headers.sh" "$version")
  # The compat folder first, as setup.py builds the units: the helpers torch
  # 2.15 added to GridSampler.cuh, for older headers (nothing from 2.15 on).
  includes=(
    -I"$root/aten_kernels/compat/include"
    -I"$cache/torch/include"
    -I"$cache/torch/include/torch/csrc/api/include"
    -I"$cache/nvidia/cu13/include"
  )
  while IFS= read -r -d '' unit; do
    echo "nvcc (torch $version): ${unit#"$root"/}"
    "$nvcc" -c -std=c++20 -O2 -o /dev/null \
      -DCUB_WRAPPED_NAMESPACE=at_cuda_detail -D__CUDA_NO_HALF_OPERATORS__ \
      -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
      -D__CUDA_NO_HALF2_OPERATORS__ \
      --expt-relaxed-constexpr --expt-extended-lambda \
      -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC \
      "${includes[@]}" "$unit" || { echo "FAILED: $unit"; status=1; }
  done < <(find "$root/aten_kernels" -name '*.cu' -print0 | sort -z)
  while IFS= read -r -d '' unit; do
    echo "g++ CUDA build (torch $version): ${unit#"$root"/}"
    g++ -std=c++20 -fsyntax-only -DDETGRID_WITH_CUDA "${includes[@]}" \
      -I"$cuda_include" $("$python" -c \
        'import sysconfig; print("-I" + sysconfig.get_paths()["include"])') \
      "$unit" || { echo "FAILED: $unit"; status=1; }
  done < <(find "$root/aten_kernels/extension" -name '*.cpp' -print0 | sort -z)
done
exit $status
