#!/usr/bin/env bash
# Reads the machine code of the CUDA kernels (no GPU needed).
#
# First the upstream core, aten_kernels/aten/src/ATen/native/cuda/
# GridSamplerDeterministic.cu, built against torch's headers alone (no folder
# of the kit's in front of them, PyTorch's half and bfloat16 defines):
# fails on a stack frame or spill in its own kernels, flush-to-zero
# arithmetic, or its budget (issue 41: <= 40 kernels, <= 1.0 MiB of sm_90
# .text, CUB's kernels included; <= 700 lines of new ATen code, issue 41's
# 600 raised for tricubic, which they predate). Prints every
# kernel's registers, CUB's kernels' stack frames ("REPORTED, not failed")
# and the fused multiply-adds per kernel family: the core computes the
# existing kernel's terms with nvcc's contraction of a*b+c by design, so they
# are counted, not failed.
#
# Then each speed level's core build (detgrid.levels.CORE_BUILDS after the
# core; today grouped-channels: one more nvcc run of one file): the core's
# file as the prefix of the upstream stack ending at that level has it
# (`sass_audit cut-core`: the core with the levels' diffs applied), built
# the same way and audited by the same rules (no stack frame or spill in a
# kernel of its own, no flush to zero); the top one fails past the whole
# upstream stack's budget (<= 100 kernels, <= 1.6 MiB of sm_90 .text, CUB's
# kernels included; no line budget: the 700 lines are the core's alone).
#
# Then the pipeline (aten_kernels/pipeline/aten/src, the extension's speed
# path) built whole, and fails on: a stack frame or spill in any detgrid
# kernel, a fused multiply-add in detgrid's own arithmetic (its CUDA == host
# bit equality rests on every operation being rounded on its own),
# flush-to-zero arithmetic, or a 2-D fp32 dense reduce whose setup per
# element exceeds 80 instructions; a kernel of the unit that is not one of its
# named stage kernels (a generic runner like for_each_kernel<Stage>), or the
# unit past its budget of 128 kernels and 3.0 MiB of .text (issue 32). Prints
# the unit's kernels and .text by kernel name, and each reduce kernel's setup
# and inner-loop instruction counts and registers. With --all-levels it also
# builds every level below the whole pipeline (its ATen files as the stack
# cuts them, in a folder of their own that is the only place the build finds
# them) and audits each the same way, except its stack frames and spills,
# which are reported ("REPORTED, not failed") and counted in the record.
# Then prints the core's lines, kernels and .text against its budget (failed
# past it), each core build's against the whole stack's (failed past it),
# the core builds side by side (lines, kernels, .text, and the registers of
# each run-sum kernel: what a speed level costs), and every pipeline level's
# lines, and the built levels' kernels and .text, with the whole pipeline's
# budget (<= 128 kernels, 2.0 MiB): over it is printed ("over budget"), not
# failed. --strict-levels fails on
# the whole pipeline's budget and on a level's spills.
# With --write-machine-code (which builds every level), writes the core's
# count (the top-level arch, kernels and text_bytes, which `detgrid report`
# cites, and "core"), each speed level's core build's (its lines, kernels,
# text_bytes and run sums' registers, under its level's name) and every
# pipeline level's to
# benchmarks/machine_code.json. Then audits the
# kernels of accumulate="exact" (aten_kernels/extension/exact/) from a build of
# ExactCuda.cu, the extension's CUDA unit: no stack frame or spill in any of
# them, no fused multiply-add and no flush to zero (and the same of the
# grad_grid kernels, from a build of GridGradient.cu); prints the registers and
# the instructions per record of each exact reduce, and per term, with the
# integer atomics in that loop, of each ScatterTerms. Then proves the audit
# has teeth: a --use_fast_math build of a point pass and a reduce of the
# pipeline (.ci/audit/fast_math_probe.cu) must fail it, and so must a
# --use_fast_math build of the core (for flush-to-zero).
#   sm_90, nvcc from CUDA_HOME (13.0 here), torch 2.14.1+cu130 headers
#   (.ci/fetch_cuda_headers.sh), nvdisasm from the nvidia-cuda-nvdisasm
#   wheel (SASS with inlined line info; cuobjdump -sass has no line info).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
machine_code=()
all_levels=0  # 1: build every pipeline level below the whole pipeline too
level_strictness=(--report-spills)  # a level's spills: reported, not failed
levels_strictness=()  # the whole pipeline's budget: reported, not failed
for arg in "$@"; do
  case "$arg" in
    --write-machine-code)
      machine_code=(--machine-code-json "$root/benchmarks/machine_code.json"); all_levels=1 ;;
    --all-levels) all_levels=1 ;;
    --strict-levels) level_strictness=(); levels_strictness=(--strict) ;;
    *) echo "usage: sass_audit.sh [--all-levels] [--strict-levels] [--write-machine-code]" >&2
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

# build NAME SOURCE ATEN_SRC [extra nvcc flags]: cubin, ptxas -v log and SASS
# under $work/NAME, with ATEN_SRC (the pipeline's aten/src, or a level's cut
# files; "" for none: the core, against torch's headers alone) first on the
# include path; prints nvcc's wall time.
build() {
  local name=$1 source=$2 aten_src=$3 start=$SECONDS; shift 3
  local kit_include=()
  [ -z "$aten_src" ] || kit_include=(-I"$aten_src")
  mkdir -p "$work/$name"
  "$cuda_home/bin/nvcc" -cubin -std=c++20 -O3 -lineinfo \
    -DCUB_WRAPPED_NAMESPACE=at_cuda_detail --expt-relaxed-constexpr --expt-extended-lambda \
    -gencode arch=compute_90,code=sm_90 -Xptxas -v "$@" \
    "${kit_include[@]}" -I"$headers/torch/include" \
    -I"$headers/torch/include/torch/csrc/api/include" -I"$headers/nvidia/cu13/include" \
    -o "$work/$name/kernels.cubin" "$source" 2> "$work/$name/ptxas.txt" \
    || { cat "$work/$name/ptxas.txt"; exit 1; }
  echo "sass audit: nvcc took $((SECONDS - start)) s ($name)"
  "$tools/nvidia/cu13/bin/nvdisasm" -c -g -gi "$work/$name/kernels.cubin" > "$work/$name/sass.txt"
}
# The defines PyTorch's own build compiles its CUDA files with (c10's Half
# and BFloat16 operators instead of CUDA's): what the core is built with.
torch_defines=(-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
  -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__)

sass_audit() { PYTHONPATH="$root/tools" "$python" -m detgrid.kit.sass_audit "$@"; }

audit() {
  sass_audit --ptxas-log "$work/$1/ptxas.txt" --sass "$work/$1/sass.txt" "${@:2}"
}
# audit_core NAME [flags]: the core's audit of build NAME.
audit_core() {
  sass_audit core --ptxas-log "$work/$1/ptxas.txt" --sass "$work/$1/sass.txt" \
    --cubin "$work/$1/kernels.cubin" --kit "$root" "${@:2}"
}
core_src=$root/aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu
# The helpers torch 2.15 added to GridSampler.cuh, for the older headers the
# audit builds against (they add nothing from 2.15 on): the core's one
# folder ahead of torch's, as setup.py builds it.
compat_include=$root/aten_kernels/compat/include
pipeline_src=$root/aten_kernels/pipeline/aten/src
mkdir -p "$work/levels"

# Each audit runs whatever the one before found, so that one run shows every
# finding; the script fails at the end if any did.
status=0

# The upstream core: its budget fails the audit; its fused multiply-adds are
# counted per kernel family, by design; CUB's stack frames are reported.
echo "sass audit: building the upstream core (${core_src#"$root"/}) for sm_90"
build core "$core_src" "$compat_include" "${torch_defines[@]}"
audit_core core --json "$work/core.json" \
  | grep -E "^FAIL|^REPORTED|^sass audit|^machine code|^family |^kernel |^fused family " \
  || status=1

# Each speed level's core build: the core's file as the stack's prefix up to
# that level has it, in a folder of its own (the file keeps its name, which
# names the kernels' namespace), against torch's headers alone, as the core.
# The same rules as the core's; the top one's budget is the whole stack's.
sass_audit cut-core --kit "$root" --into "$work/core-builds-src" > "$work/core-builds.txt" \
  || exit 1
mkdir -p "$work/core-builds"
core_builds=()
while read -r -u 3 level source lines; do
  echo "sass audit: building the upstream stack up to $level ($lines lines of the core's file) for sm_90"
  build "core-$level" "$source" "$compat_include" "${torch_defines[@]}"
  audit_core "core-$level" --level "$level" --json "$work/core-builds/$level.json" \
    | grep -E "^FAIL|^REPORTED|^sass audit|^machine code|^family |^kernel |^fused family " \
    || status=1
  core_builds+=(--core-build "$work/core-builds/$level.json")
done 3< "$work/core-builds.txt"

top=$(sass_audit cut --top)
echo "sass audit: building the pipeline's GridSamplerDeterministic.cu (the whole pipeline, $top) for sm_90"
build release "$pipeline_src/ATen/native/cuda/GridSamplerDeterministic.cu" "$pipeline_src"
# The unit's kernels and .text, then one line per kernel name (family), then
# one per reduce kernel: setup=N (instructions per element, or sparse run,
# before its fold) per-record=M (the fold's inner loop) regs=R; the audit
# fails when a 2-D fp32 dense reduce's setup exceeds 80.
audit release --loops --cubin "$work/release/kernels.cubin" \
  --level "$top" --level-json "$work/levels/$top.json" \
  | grep -E "^FAIL|^REPORTED|^sass audit|^machine code|^family |^reduce kernels|^setup=" \
  || status=1

# With --all-levels, each level below the whole pipeline: the files as the
# stack cuts them, in a folder of their own that replaces the pipeline's on
# the include path, so that a file of a later level cannot be found. The same
# checks as the whole pipeline's.
if ((all_levels)); then
  sass_audit cut --kit "$root" --into "$work/levels-src" > "$work/cut.txt" || exit 1
  while read -r -u 3 level include lines; do
    echo "sass audit: building the pipeline up to $level ($lines lines) for sm_90"
    build "level-$level" "$include/ATen/native/cuda/GridSamplerDeterministic.cu" "$include"
    audit "level-$level" --cubin "$work/level-$level/kernels.cubin" \
      --level "$level" --level-json "$work/levels/$level.json" "${level_strictness[@]}" \
      | grep -E "^FAIL|^REPORTED|^sass audit|^machine code|^family " || status=1
  done 3< "$work/cut.txt"
fi
# The core's budget and the whole stack's (failed past them, as above), the
# core builds side by side, and the whole pipeline's budget (printed and
# recorded, not failed; --strict-levels fails on it).
sass_audit levels --kit "$root" --core "$work/core.json" "${core_builds[@]}" \
  --measured "$work/levels" "${machine_code[@]}" "${levels_strictness[@]}" || status=1

# ExactCuda.cu includes GridSamplerDeterministic.cu whole; --exact audits only
# the exact stages' kernels, the others were audited above. One line per
# reduce: per-record=N regs=R; per ScatterTerms: per-term=N atomics=A regs=R.
echo "sass audit: building ExactCuda.cu (accumulate=\"exact\") for sm_90"
build exact "$root/aten_kernels/extension/exact/ExactCuda.cu" "$pipeline_src"
audit exact --exact --loops | grep -E "^FAIL|^sass audit|^exact kernels|^per-(record|term)=" \
  || status=1

# GridGradient.cu, the extension's grad_grid, built as setup.py builds it
# (torch's defines, the compat folder, -fmad=false): no stack frame or
# spill, no fused multiply-add, no flush to zero.
echo "sass audit: building GridGradient.cu (grad_grid) for sm_90"
build grid_gradient "$root/aten_kernels/extension/GridGradient.cu" "$compat_include" \
  "${torch_defines[@]}" -fmad=false
audit grid_gradient --grid-gradient | grep -E "^FAIL|^sass audit" || status=1

# must_fail NAME PATTERN AUDIT...: the audit of the --use_fast_math build NAME
# fails, and for flush-to-zero (PATTERN in its output).
must_fail() {
  local name=$1 pattern=$2; shift 2
  if "$@" > "$work/$name/audit.txt"; then
    echo "FAILED: the audit passed the --use_fast_math build $name"
    exit 1
  fi
  grep -q "$pattern" "$work/$name/audit.txt" \
    || { echo "FAILED: the --use_fast_math build $name failed the audit, but not for flush-to-zero"; exit 1; }
  echo "sass audit: the --use_fast_math build $name fails it, as it must ($(grep -c '^FAIL' "$work/$name/audit.txt") findings)"
}

echo "sass audit: negative controls, a point pass and a reduce of the pipeline, and the core, built with --use_fast_math"
build fast_math "$root/.ci/audit/fast_math_probe.cu" "$pipeline_src" --use_fast_math
must_fail fast_math "flush-to-zero" audit fast_math
build core_fast_math "$core_src" "$compat_include" "${torch_defines[@]}" --use_fast_math
must_fail core_fast_math "^FAIL (flush-to-zero" audit_core core_fast_math
exit $status
