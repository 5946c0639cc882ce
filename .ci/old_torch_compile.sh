#!/usr/bin/env bash
# The extension compiles against older torch releases with the flags their
# own torch.utils.cpp_extension would give setup.py's extension (issue 40).
# Up to torch 2.11, cpp_extension adds -std=c++17 to every g++ and nvcc
# command line that holds no -std= of its own (C++20 from 2.12,
# pytorch#176659); the extension needs C++20 (requires-expressions,
# std::atomic_ref), so setup.py must ask for it.
#
# For each release below: the wheel's torch/include and
# torch/utils/cpp_extension.py, unpacked once into
# ${DETGRID_CACHE:-~/.cache/detgrid}/torch-headers-VERSION (the wheel itself
# is deleted); .ci/old_torch_flags.py runs that release's own flag code
# (default -std and what it does with an explicit one, nvcc's common flags,
# include paths, arch flags) on setup.py's CXX_FLAGS/NVCC_FLAGS and orders
# the result as its ninja rules do; then
#   g++ -fsyntax-only  every .cpp of aten_kernels/extension, as the CUDA
#                      build compiles it (-DDETGRID_WITH_CUDA) and as the
#                      host-only build does (without; cuda_ops.cpp is only
#                      in the CUDA build)
#   nvcc -c (sm_90)    the core (aten_kernels/aten/src/ATen/native/cuda/
#                      GridSamplerDeterministic.cu) and
#                      aten_kernels/extension/GridGradient.cu
#   g++ -fsyntax-only  the same two hostified, as setup.py builds their host
#                      units
# with system nvcc 13.0 and g++, headers only (nothing is linked). The CUDA
# library headers ATen includes (cusparse.h, cublas_v2.h) come from
# .ci/fetch_cuda_headers.sh's cache, added late as setup.py adds pip's.
#
#   2.11.0 (cu130, what the lent GPU machines run): all of the above.
#   2.6.0: the host units only (both builds, and the two hostified). Its CUDA
#     units are not checked with the CUDA 13 here: torch 2.6.0 is built for
#     CUDA 12 (12.4), and its own ATen/cuda/cub.cuh (which the core includes)
#     uses cub::Equality and cub::TransformInputIterator, which CUDA 13's CCCL
#     no longer has: nvcc 13.0 stops there, in torch's header, with or without
#     our code. (.ci/intree_compile.sh compiles the v2.6.0 tree's units with
#     nvcc 12.4.)
#
# Before setup.py asked for -std=c++20, both releases gave -std=c++17 to g++
# and nvcc, and the extension's C++20 units failed here ('requires' was not
# declared; std has no atomic_ref).
#
#   PYTHON   any Python 3 with pip (default python3)
set -euo pipefail
if [ $# -ne 0 ]; then
  echo "usage: old_torch_compile.sh (no arguments; DETGRID_CACHE, CUDA_HOME, PYTHON from the environment)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cache_root=${DETGRID_CACHE:-$HOME/.cache/detgrid}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda_home/bin/nvcc
python=${PYTHON:-python3}
started=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# torch_headers VERSION: the release's headers and cpp_extension.py, once.
torch_headers() {
  local version=$1 folder=$cache_root/torch-headers-$1
  mkdir -p "$cache_root"
  exec 9>"$folder.lock"
  flock 9
  if [ ! -f "$folder/.complete" ]; then
    local start=$SECONDS
    rm -rf "$folder" && mkdir -p "$folder/wheel"
    "$python" -m pip download -q --disable-pip-version-check --no-deps -d "$folder/wheel" \
      "torch==$version" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
    echo "old torch compile: torch $version wheel, $(du -m "$folder"/wheel/torch-*.whl | cut -f1) MiB," \
      "downloaded in $((SECONDS - start)) s" >&2
    unzip -q -o "$folder"/wheel/torch-*.whl 'torch/include/*' torch/utils/cpp_extension.py \
      -d "$folder"
    rm -rf "$folder/wheel"
    touch "$folder/.complete"
  fi
  flock -u 9
  echo "$folder"
}

# Late CUDA library headers, as setup.py's cuda_library_includes: only when
# the toolkit lacks them.
late_includes=()
if [ ! -f "$cuda_home/include/cusparse.h" ]; then
  cuda_headers=$(PYTHON=$python bash "$root/.ci/fetch_cuda_headers.sh" 2.14.1)
  late_includes=(--late-include "$cuda_headers/nvidia/cu13/include")
fi

# run_with ARGS_FILE COMPILER SOURCE: the compiler with the arguments of
# ARGS_FILE, SOURCE in place of @SOURCE@.
run_with() {
  local args_file=$1 compiler=$2 source=$3 args=() arg
  while IFS= read -r -d '' arg; do
    [ "$arg" = @SOURCE@ ] && arg=$source
    args+=("$arg")
  done < "$args_file"
  "$compiler" "${args[@]}"
}

# stds KIND: the -std= flags of $version's KIND command line.
stds() {
  local found
  found=$(tr '\0' '\n' < "$work/$version/$1.args" | { grep -E '^-std=' || true; } | paste -sd ' ')
  echo "${found:-no -std}"
}

status=0
# check VERSION KIND COMPILER SOURCE
check() {
  local version=$1 kind=$2 compiler=$3 source=$4 start=$SECONDS
  if run_with "$work/$version/$kind.args" "$compiler" "$source" > "$work/log" 2>&1; then
    echo "old torch compile: torch $version, $kind: ${source#"$root"/} ok ($((SECONDS - start)) s)"
  else
    echo "FAILED: torch $version, $kind: ${source#"$root"/}; $(basename "$compiler") said:"
    grep -E "error|Error" "$work/log" | sed -n 1,20p || tail -n 20 "$work/log"
    status=1
  fi
}

# The core (issue 59) and the grid gradient, whose host builds setup.py makes
# with flags of their own: hostified, against the release's GridSampler.cuh
# and UpSample.cuh, with aten_kernels/compat/include ahead of them (the
# helpers torch 2.15 added, for older releases), as setup.py builds them.
core=$root/aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu
grid_gradient=$root/aten_kernels/extension/GridGradient.cu
check_hostified() {
  local version=$1 folder=$2 source=$3 start=$SECONDS
  local name unit
  name=$(basename "$source" .cu)
  unit=$work/$1/$name.host.cpp
  "$python" "$root/aten_kernels/hostify/hostify.py" "$source" "$unit"
  if g++ -fsyntax-only -std=c++20 -Wno-attributes \
    -include "$root/aten_kernels/hostify/prelude.h" -I"$root/aten_kernels/hostify/include" \
    -I"$root/aten_kernels/compat/include" \
    -I"$folder/torch/include" -I"$folder/torch/include/torch/csrc/api/include" \
    -I"$cuda_home/include" $("$python" -c \
      'import sysconfig; print("-I" + sysconfig.get_paths()["include"])') \
    "$unit" > "$work/log" 2>&1; then
    echo "old torch compile: torch $version, hostified $name ok ($((SECONDS - start)) s)"
  else
    echo "FAILED: torch $version, hostified $name; g++ said:"
    grep -E "error" "$work/log" | sed -n 1,20p || tail -n 20 "$work/log"
    status=1
  fi
}

for version in 2.11.0 2.6.0; do
  folder=$(torch_headers "$version")
  mkdir -p "$work/$version"
  "$python" "$root/.ci/old_torch_flags.py" --torch-root "$folder/torch" --setup "$root/setup.py" \
    --root "$root" --cuda-home "$cuda_home" "${late_includes[@]}" --out "$work/$version"
  echo "old torch compile: torch $version's command lines hold: g++ (CUDA build)" \
    "$(stds cuda), g++ (host-only build) $(stds cpu), nvcc $(stds nvcc)"
  while IFS= read -r -d '' unit; do
    check "$version" cuda g++ "$unit"
    [ "$(basename "$unit")" = cuda_ops.cpp ] || check "$version" cpu g++ "$unit"
  done < <(find "$root/aten_kernels/extension" -name '*.cpp' -print0 | sort -z)
  if [ "$version" = 2.11.0 ]; then
    check "$version" nvcc "$nvcc" "$grid_gradient"
    check "$version" nvcc "$nvcc" "$core"
  fi
  check_hostified "$version" "$folder" "$core"
  check_hostified "$version" "$folder" "$grid_gradient"
done
echo "old torch compile: $((SECONDS - started)) s"
exit $status
