#!/usr/bin/env bash
# Compiles every CUDA translation unit of aten_kernels/ with nvcc, and the
# extension's CUDA-side C++ with g++, against the ATen headers of each torch
# release below (no GPU needed). Any compile error fails.
#   2.14.1+cu130: the local wheel (pip's cap on this machine)
#   2.15.0+cu132: the newest release, from PyPI past the cap
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${DETGRID_CACHE:-$HOME/.cache/detgrid}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nvcc=${NVCC:-$cuda_home/bin/nvcc}
cuda_include=$cuda_home/include
pip=${PIP:-pip}
python=${PYTHON:-python3}

# Headers of one torch release (+ the CUDA library headers ATen includes),
# unpacked once into the cache.
fetch_headers() {
  local version=$1 cache=$2
  [ -f "$cache/.complete" ] && return
  rm -rf "$cache" && mkdir -p "$cache/wheels"
  if [ "$version" = 2.15.0 ]; then
    XDG_CONFIG_DIRS=/nonexistent PIP_CONFIG_FILE=/dev/null \
      "$pip" download -q --no-deps -d "$cache/wheels" "torch==$version"
  else
    "$pip" download -q --no-deps -d "$cache/wheels" "torch==$version"
  fi
  "$pip" download -q --no-deps -d "$cache/wheels" \
    nvidia-cublas nvidia-cusparse nvidia-cusolver
  unzip -q -o "$cache"/wheels/torch-*.whl 'torch/include/*' -d "$cache"
  for wheel in "$cache"/wheels/nvidia_*.whl; do
    unzip -q -o "$wheel" 'nvidia/cu13/include/*' -d "$cache"
  done
  rm -rf "$cache/wheels"
  touch "$cache/.complete"
}

status=0
for version in 2.14.1 2.15.0; do
  cache="$cache_root/cuda-headers-$version"
  fetch_headers "$version" "$cache" 2>&1 | { grep -v "^WARNING: Location" || true; }
  includes=(
    -I"$root/aten_kernels/aten/src"
    -I"$cache/torch/include"
    -I"$cache/torch/include/torch/csrc/api/include"
    -I"$cache/nvidia/cu13/include"
  )
  while IFS= read -r -d '' unit; do
    echo "nvcc (torch $version): ${unit#"$root"/}"
    "$nvcc" -c -std=c++20 -O2 -o /dev/null \
      -DCUB_WRAPPED_NAMESPACE=at_cuda_detail \
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
