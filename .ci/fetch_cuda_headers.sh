#!/usr/bin/env bash
# Unpacks the ATen headers of one torch release (and the CUDA library headers
# ATen includes) into the cache, once; prints the folder.
#   bash .ci/fetch_cuda_headers.sh 2.14.1   the local cu130 wheel (pip's cap here)
#   bash .ci/fetch_cuda_headers.sh 2.15.0   the newest release, from PyPI past the cap
# pip runs as "$PYTHON -m pip" (PYTHON: any Python 3 with pip, by path or by
# name on PATH; default python3): no pip executable is assumed beside it.
set -euo pipefail
version=${1:?usage: fetch_cuda_headers.sh TORCH_VERSION}
cache=${DETGRID_CACHE:-$HOME/.cache/detgrid}/cuda-headers-$version
python=${PYTHON:-python3}
pip=("$python" -m pip)
# CI's two lanes may ask for the same release at once: one fetch at a time,
# or one would delete the wheels the other is unpacking.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9
if [ ! -f "$cache/.complete" ]; then
  rm -rf "$cache" && mkdir -p "$cache/wheels"
  {
    if [ "$version" = 2.15.0 ]; then
      XDG_CONFIG_DIRS=/nonexistent PIP_CONFIG_FILE=/dev/null \
        "${pip[@]}" download -q --no-deps -d "$cache/wheels" "torch==$version"
    else
      "${pip[@]}" download -q --no-deps -d "$cache/wheels" "torch==$version"
    fi
    "${pip[@]}" download -q --no-deps -d "$cache/wheels" \
      nvidia-cublas nvidia-cusparse nvidia-cusolver
  } 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  unzip -q -o "$cache"/wheels/torch-*.whl 'torch/include/*' -d "$cache"
  for wheel in "$cache"/wheels/nvidia_*.whl; do
    unzip -q -o "$wheel" 'nvidia/cu13/include/*' -d "$cache"
  done
  rm -rf "$cache/wheels"
  touch "$cache/.complete"
fi
echo "$cache"
