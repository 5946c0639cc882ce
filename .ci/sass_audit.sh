#!/usr/bin/env bash
# Reads the machine code of the CUDA kernels (no GPU needed).
#
# First the upstream core, aten_kernels/aten/src/ATen/native/cuda/
# GridSamplerDeterministic.cu, built against torch's headers alone (and the
# compat folder ahead of them, PyTorch's half and bfloat16 defines): fails on
# a stack frame or spill in its own kernels, flush-to-zero arithmetic, or its
# budget (issue 41: <= 40 kernels, <= 1.0 MiB of sm_90 .text, CUB's kernels
# included; <= 700 lines of new ATen code, issue 41's 600 raised for
# tricubic, which they predate). Prints every kernel's registers, CUB's
# kernels' stack frames ("REPORTED, not failed") and the fused multiply-adds
# per kernel family: the core computes the existing kernel's terms with
# nvcc's contraction of a*b+c by design, so they are counted, not failed.
#
# Then each speed level's core build (detgrid.levels.CORE_BUILDS after the
# core; today grouped-channels: one more nvcc run of one file): the core's
# file as the prefix of the upstream stack ending at that level has it
# (`sass_audit cut-core`: the core with the levels' diffs applied), built the
# same way and audited by the same rules; the top one, the whole upstream
# stack, fails past its budget (issue 60: <= 100 kernels, <= 1.6 MiB of sm_90
# .text, CUB's kernels included; no line budget: the 700 lines are the
# core's alone). Then `sass_audit builds` prints the two budgets again and
# the builds side by side (lines, kernels, .text, frames, and the registers
# of each run-sum kernel: what a speed level costs); with
# --write-machine-code it writes them to benchmarks/machine_code.json (the
# top-level arch, kernels and text_bytes are the core's, which `detgrid
# report` cites; each build's record under its level's name).
#
# Then GridGradient.cu, the extension's grad_grid, built as setup.py builds
# it (-fmad=false): no stack frame or spill, no fused multiply-add in its
# arithmetic, no flush to zero. Then proves the audit has teeth: the core
# and GridGradient.cu built with --use_fast_math must fail it, for
# flush-to-zero (and GridGradient.cu, contracted, for its fused
# multiply-adds).
#   sm_90, nvcc from CUDA_HOME (13.0 here), torch 2.14.1+cu130 headers
#   (.ci/fetch_cuda_headers.sh), nvdisasm from the nvidia-cuda-nvdisasm
#   wheel (SASS with inlined line info; cuobjdump -sass has no line info).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
machine_code=()
for arg in "$@"; do
  case "$arg" in
    --write-machine-code)
      machine_code=(--machine-code-json "$root/benchmarks/machine_code.json") ;;
    *) echo "usage: sass_audit.sh [--write-machine-code]" >&2
       exit 2 ;;
  esac
done
cache_root=${DETGRID_CACHE:-$HOME/.cache/detgrid}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
# Any Python 3 with pip: the audit is plain Python, pip fetches the headers
# and nvdisasm (CI's side lane runs this before .venv exists).
python=${PYTHON:-python3}
headers=$(PYTHON=$python bash "$root/.ci/fetch_cuda_headers.sh" 2.14.1)
tools=$cache_root/nvdisasm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
  rm -rf "$tools" && mkdir -p "$tools"
  "$python" -m pip download -q --disable-pip-version-check --no-deps -d "$tools" \
    'nvidia-cuda-nvdisasm>=13,<14' 2>&1 | { grep -v "^WARNING: Location" || true; }
  unzip -q -o "$tools"/nvidia_cuda_nvdisasm-*.whl 'nvidia/cu13/bin/nvdisasm' -d "$tools"
  chmod +x "$tools/nvidia/cu13/bin/nvdisasm"
fi

# The helpers torch 2.15 added to GridSampler.cuh, for the older headers the
# audit builds against (they add nothing from 2.15 on): the one folder ahead
# of torch's, as setup.py builds the units.
compat_include=$root/aten_kernels/compat/include
# The defines PyTorch's own build compiles its CUDA files with (c10's Half
# and BFloat16 operators instead of CUDA's).
torch_defines=(-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
  -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__)

# build NAME SOURCE [extra nvcc flags]: cubin, ptxas -v log and SASS under
# $work/NAME, against the compat folder and torch's headers; prints nvcc's
# wall time.
build() {
  local name=$1 source=$2 start=$SECONDS; shift 2
  mkdir -p "$work/$name"
  "$cuda_home/bin/nvcc" -cubin -std=c++20 -O3 -lineinfo \
    -DCUB_WRAPPED_NAMESPACE=at_cuda_detail --expt-relaxed-constexpr --expt-extended-lambda \
    -gencode arch=compute_90,code=sm_90 -Xptxas -v "${torch_defines[@]}" "$@" \
    -I"$compat_include" -I"$headers/torch/include" \
    -I"$headers/torch/include/torch/csrc/api/include" -I"$headers/nvidia/cu13/include" \
    -o "$work/$name/kernels.cubin" "$source" 2> "$work/$name/ptxas.txt" \
    || { cat "$work/$name/ptxas.txt"; exit 1; }
  echo "sass audit: nvcc took $((SECONDS - start)) s ($name)"
  "$tools/nvidia/cu13/bin/nvdisasm" -c -g -gi "$work/$name/kernels.cubin" > "$work/$name/sass.txt"
}

sass_audit() { PYTHONPATH="$root/tools" "$python" -m detgrid.kit.sass_audit "$@"; }

# audit_core NAME [flags]: the core's audit of build NAME.
audit_core() {
  sass_audit core --ptxas-log "$work/$1/ptxas.txt" --sass "$work/$1/sass.txt" \
    --cubin "$work/$1/kernels.cubin" --kit "$root" "${@:2}"
}
# audit_grid_gradient NAME: the grad_grid audit of build NAME.
audit_grid_gradient() {
  sass_audit grid-gradient --ptxas-log "$work/$1/ptxas.txt" --sass "$work/$1/sass.txt"
}
core_lines="^FAIL|^REPORTED|^sass audit|^machine code|^family |^kernel |^fused family "
core_src=$root/aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu
grid_gradient_src=$root/aten_kernels/extension/GridGradient.cu

# Each audit runs whatever the one before found, so that one run shows every
# finding; the script fails at the end if any did.
status=0

echo "sass audit: building the upstream core (${core_src#"$root"/}) for sm_90"
build core "$core_src"
audit_core core --json "$work/core.json" | grep -E "$core_lines" || status=1

# Each speed level's core build: the core's file as the stack's prefix up to
# that level has it, in a folder of its own (the file keeps its name, which
# names the kernels' namespace).
sass_audit cut-core --kit "$root" --into "$work/core-builds-src" > "$work/core-builds.txt" \
  || exit 1
mkdir -p "$work/core-builds"
core_builds=()
while read -r -u 3 level source lines; do
  echo "sass audit: building the upstream stack up to $level ($lines lines of the core's file) for sm_90"
  build "core-$level" "$source"
  audit_core "core-$level" --level "$level" --json "$work/core-builds/$level.json" \
    | grep -E "$core_lines" || status=1
  core_builds+=(--core-build "$work/core-builds/$level.json")
done 3< "$work/core-builds.txt"

# The core's budget and the whole stack's (failed past them, as above), and
# the builds side by side.
sass_audit builds --core "$work/core.json" "${core_builds[@]}" "${machine_code[@]}" || status=1

echo "sass audit: building GridGradient.cu (grad_grid) for sm_90"
build grid_gradient "$grid_gradient_src" -fmad=false
audit_grid_gradient grid_gradient | grep -E "^FAIL|^sass audit" || status=1

# must_fail NAME AUDIT PATTERN...: AUDIT (audit_core or audit_grid_gradient)
# of the --use_fast_math build NAME fails, with findings matching each PATTERN.
must_fail() {
  local name=$1 audit=$2 pattern; shift 2
  if "$audit" "$name" > "$work/$name/audit.txt"; then
    echo "FAILED: the audit passed the --use_fast_math build $name"
    exit 1
  fi
  for pattern in "$@"; do
    grep -Eq "$pattern" "$work/$name/audit.txt" \
      || { echo "FAILED: the --use_fast_math build $name failed the audit, but with no $pattern"; exit 1; }
  done
  echo "sass audit: the --use_fast_math build $name fails it, as it must ($(grep -c '^FAIL' "$work/$name/audit.txt") findings)"
}

echo "sass audit: negative controls, the core and GridGradient.cu built with --use_fast_math"
build core_fast_math "$core_src" --use_fast_math
must_fail core_fast_math audit_core "^FAIL \(flush-to-zero"
build grid_gradient_fast_math "$grid_gradient_src" --use_fast_math
must_fail grid_gradient_fast_math audit_grid_gradient "^FAIL \(flush-to-zero" \
  "^FAIL \(fused multiply-add"
exit $status
