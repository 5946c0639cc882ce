#!/usr/bin/env bash
# detgrid's GPU check: the one script a session hands to the device tool.
#
#   bash tools/gpu_check.sh          (in the repository root, on a CUDA machine)
#
# Steps, each under its own `timeout` and all under one time budget; a step
# that fails or times out is recorded and the next one still runs. The
# required steps (R) come first and alone decide the verdict; the optional
# ones only report:
#   env          nvidia-smi, torch, device, runtime facts          -> env.json
#   deps         expecttest from tools/gpu_wheels (nothing can be downloaded there)
#   build     R  setup.py build_ext --inplace for TORCH_CUDA_ARCH_LIST (9.0);
#                nothing to do where the extension here was built from the
#                same inputs (build_inputs_hash)
#   kernels   R  detgrid imports and has_cuda_kernels() is True   -> build.json
#   bitwise   R  the key verdict: every build of the core
#                (detgrid.levels.CORE_BUILDS) gives its host build's bits on
#                CUDA, per dtype, 2-D and 3-D, and the golden corpus's bits
#                (tests/golden/core_digests.json); the default backward's
#                grad_input and grad_grid as the host's (the grid gradient's);
#                100 repeats of one 2-D and one 3-D high-collision case, one
#                set of bits over the runs and the builds; agreement with
#                stock's atomic backward within tolerance   -> bitwise.json
#   routes    R  under detgrid.enable(): grid-only calls in deterministic mode
#                (stn_mnist, monodepth2_grid_only, F.grid_sample per dtype) raise
#                nothing and give stock's grad_grid bits; with two GPUs, a call
#                on cuda:1 while cuda:0 is current               -> routes.json
#   tests     R  pytest tests -k cuda                              -> junit.xml
#   racecheck R  one tiny case per rank
#   memcheck  R  compute-sanitizer memcheck over every mode x padding, 2-D and
#                3-D, NaN/Inf grids, calls of two of the core's chunks, every
#                build ("unavailable" where the runtime refuses)
#   initcheck    one tiny case per rank
#   timing       stock (its own mode) vs the default backward and each other
#                build of the core (deterministic mode) on the benchmark rows
#                (`detgrid bench`'s, the GPU check's eight first); last, since
#                it stops starting workloads 25 s before its limit: it takes
#                what is left
#   report       $OUT/gpu_check.json and $OUT/gpu_check.md (printed last)
#
# Verdict: FAIL when a required step fails (or one of its checks does);
# else INCOMPLETE when a required step did not run to its end (skipped, out
# of time: a sanitizer out of its time limit checked nothing, so it counts as
# not run) or a required check has no answer; else PASS. An optional step
# never decides: a wrong result it finds is listed on top of the report as an
# optional finding, and its skips and timeouts only in the steps table.
#
# Time (never yet measured on a lent GPU; the first run's steps table
# replaces these guesses): on a cold H100 or H200, env + deps ~10 s, the
# build 90-150 s (the core's builds, the grid gradient and the extension's
# units), then kernels ~5, bitwise ~40, routes ~5, tests ~40, racecheck ~20,
# memcheck 40-90: the required steps end near the 300 s budget, which cuts
# whatever would run past it (the last, longest, memcheck first), so a cold
# run gives its verdict by ~300 s and leaves the optional steps out. A rerun
# at once on the still-warm machine keeps build/ and the extension: the
# build step finds its inputs unchanged (by content, since a re-sent tree may
# carry new mtimes that would make ninja rebuild everything) and takes
# seconds, the required steps end by ~200 s, and initcheck (~20 s) and
# timing (the rest) fill the budget. Device tool: timeout_s 390 (the budget,
# a killed step's 15 s grace, the report's 60 s at most), so both runs and
# the machine's start fit in a 15-minute lease.
#
# Files under $OUT (default ./out): gpu_check.json, gpu_check.md,
# gpu_check.log (every step's output), junit.xml. Exit status 0 when the
# verdict is PASS (or a dry run), 1 otherwise.
#
# Environment:
#   DETGRID_GPU_CHECK_DRY_RUN=1   print the steps, run none (but the report)
#   DETGRID_GPU_CHECK_BUDGET_S    seconds for all steps but the report (300)
#   DETGRID_GPU_CHECK_STEPS       comma list of steps to run (default: all; a
#                                 required step left out makes INCOMPLETE)
#   DETGRID_GPU_CHECK_MIN_S       least time left to start any step (per step)
#   DETGRID_GPU_CHECK_PYTEST_WORKERS   pytest-xdist workers (4; 0 = none)
#   DETGRID_GPU_CHECK_PYTEST_K    pytest -k expression (cuda: the *_cuda* variants)
#   DETGRID_GPU_CHECK_DEVICE      cuda; cpu runs the same logic on the host
#                                 build (for testing this script)
#   DETGRID_GPU_CHECK_SCALE, _REPS, _TIMING_REPS   sizes (1, 100, 25)
#   DETGRID_PYTHON                interpreter (python3)
#   TORCH_CUDA_ARCH_LIST, MAX_JOBS     passed to the build (9.0, 16)

set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF="$ROOT/tools/gpu_check.sh"
GC="$ROOT/tools/detgrid/kit/gpucheck.py"

# One hash of what the extension is made from and for: its sources, what
# setup.py reads, the build's settings and the torch it is built against.
# Not the bytecode that loading setup.py's helpers leaves beside them.
build_inputs_hash() {
  {
    find aten_kernels setup.py tools/detgrid/kit/toolchain.py -type f \
      ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
    echo "arch=$TORCH_CUDA_ARCH_LIST cuda_home=${CUDA_HOME:-}" \
      "cflags=${DETGRID_EXTRA_CFLAGS:-} ldflags=${DETGRID_EXTRA_LDFLAGS:-}"
    "$PY" -c "import importlib.metadata as m; print('torch', m.version('torch'))"
  } | sha256sum | cut -d' ' -f1
}

# ---------------------------------------------------------------- step bodies
# `bash tools/gpu_check.sh __step NAME` runs one step's body; the driver below
# runs each that way under `timeout`, so a hung step is killed as a whole.
if [[ "${1:-}" == "__step" ]]; then
  cd "$ROOT" || exit 2
  PY=${DETGRID_PYTHON:-python3}
  LIMIT=${DETGRID_STEP_LIMIT:-60}
  DEVICE=${DETGRID_GPU_CHECK_DEVICE:-cuda}
  SCALE=${DETGRID_GPU_CHECK_SCALE:-1}
  case "$2" in
    env)
      nvidia-smi || true
      "$PY" "$GC" env --root "$ROOT" --json "$WORK/env.json"
      ;;
    deps)
      if "$PY" -c "import expecttest" 2>/dev/null; then
        echo "expecttest already importable"
      else
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
          --target "$SITE" "$ROOT"/tools/gpu_wheels/*.whl &&
          "$PY" -c "import expecttest; print('expecttest', expecttest.__file__)"
      fi
      ;;
    build)
      # torch guesses CUDA_HOME from the nvcc on PATH, which may be a wrapper
      # script outside the toolkit; name the toolkit when it is the usual one.
      if [[ -z "${CUDA_HOME:-}" && -x /usr/local/cuda/bin/nvcc ]]; then
        export CUDA_HOME=/usr/local/cuda
      fi
      export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
      stamp="$ROOT/build/gpu_check_build.sha256"
      made_from=$(build_inputs_hash)
      if [[ -f "$stamp" && "$(<"$stamp")" == "$made_from" ]] &&
        compgen -G "$ROOT/tools/detgrid/_C*.so" >/dev/null; then
        echo "up to date: the extension here was built from these very inputs"
        exit 0
      fi
      # Only the extension goes: a stale one must not pass the kernels step
      # if this build fails. build/ stays, so ninja reuses its objects (also
      # those of a build cut short by the budget).
      rm -f "$stamp" "$ROOT"/tools/detgrid/_C*.so
      MAX_JOBS=${MAX_JOBS:-16} "$PY" setup.py build_ext --inplace || exit
      mkdir -p "$ROOT/build" && echo "$made_from" >"$stamp"
      ;;
    kernels)
      require=(--require-cuda)
      [[ "$DEVICE" == cpu ]] && require=()
      "$PY" "$GC" build-info "${require[@]}" --json "$WORK/build.json"
      ;;
    bitwise)
      "$PY" "$GC" bitwise --device "$DEVICE" --scale "$SCALE" \
        --reps "${DETGRID_GPU_CHECK_REPS:-100}" --json "$WORK/bitwise.json"
      ;;
    routes)
      "$PY" "$GC" routes --device "$DEVICE" --json "$WORK/routes.json"
      ;;
    memcheck | racecheck | initcheck)
      set_name=tiny
      [[ "$2" == memcheck ]] && set_name=all
      "$PY" "$GC" sanitize --tool "$2" --set "$set_name" --timeout $((LIMIT - 5)) \
        --json "$WORK/sanitizer_$2.json"
      ;;
    tests)
      args=(-m pytest tests -q -k "${DETGRID_GPU_CHECK_PYTEST_K:-cuda}" -p no:cacheprovider -rfE
            --junitxml="$OUT/junit.xml" -o junit_family=xunit1)
      workers=${DETGRID_GPU_CHECK_PYTEST_WORKERS:-4}
      if [[ "$workers" != 0 ]] && "$PY" -c "import xdist" 2>/dev/null; then
        args+=(-n "$workers")
      fi
      if "$PY" -c "import pytest_timeout" 2>/dev/null; then
        args+=(--timeout 90)
      fi
      "$PY" "${args[@]}"
      ;;
    timing)
      "$PY" "$GC" timing --device "$DEVICE" --scale "$SCALE" --warmup 5 \
        --reps "${DETGRID_GPU_CHECK_TIMING_REPS:-25}" --budget-s $((LIMIT - 25)) \
        --json "$WORK/timing.json"
      ;;
    *)
      echo "unknown step $2" >&2
      exit 2
      ;;
  esac
  exit $?
fi

# --------------------------------------------------------------------- driver
cd "$ROOT" || exit 2
PY=${DETGRID_PYTHON:-python3}
DRY=${DETGRID_GPU_CHECK_DRY_RUN:-0}
BUDGET=${DETGRID_GPU_CHECK_BUDGET_S:-300}
ONLY=${DETGRID_GPU_CHECK_STEPS:-}
export OUT=${OUT:-$ROOT/out}
export WORK=${DETGRID_GPU_CHECK_WORK:-$(mktemp -d /tmp/detgrid_gpu_check.XXXXXX)}
export SITE=${DETGRID_GPU_CHECK_SITE:-/tmp/detgrid_gpu_site}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT/tools:$SITE${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT" "$WORK" "$SITE"
LOG="$OUT/gpu_check.log"
: >"$LOG"
: >"$WORK/steps.tsv"
START=$SECONDS
KERNELS_OK=1

say() { echo "[gpu_check +$((SECONDS - START))s] $*" | tee -a "$LOG"; }

record() { # name status rc seconds limit note
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" >>"$WORK/steps.tsv"
}

# step NAME TIMEOUT_S MIN_S NEEDS_KERNELS: runs the body under timeout, cut
# to what is left of the budget; skipped when less than MIN_S is left.
step() {
  local name=$1 limit=$2 need=${DETGRID_GPU_CHECK_MIN_S:-$3} needs_kernels=$4 note=""
  if [[ -n "$ONLY" && ",$ONLY," != *",$name,"* ]]; then
    record "$name" skipped "" 0 "$limit" "not selected"
    return
  fi
  local left=$((BUDGET - (SECONDS - START))) cut=0
  if ((limit > left)); then limit=$left cut=1; fi
  if [[ "$DRY" == 1 ]]; then
    say "dry-run: $name (timeout ${limit}s): bash tools/gpu_check.sh __step $name"
    record "$name" dry-run "" 0 "$limit" ""
    return
  fi
  if [[ "$needs_kernels" == 1 && "$KERNELS_OK" != 1 ]]; then
    say "$name: skipped (no CUDA kernels)"
    record "$name" skipped "" 0 "$limit" "no CUDA kernels"
    return
  fi
  if ((left < need)); then
    say "$name: skipped (${left}s left of the budget, needs ${need}s)"
    record "$name" skipped "" 0 "$limit" "out of budget"
    return
  fi
  say "$name: start (timeout ${limit}s)"
  local t0=$SECONDS rc status signal=TERM
  [[ "$name" == tests ]] && signal=INT # pytest still writes its junit xml
  {
    echo "=================== $name ==================="
  } >>"$LOG"
  DETGRID_STEP_LIMIT=$limit timeout -s "$signal" -k 15 "$limit" \
    bash "$SELF" __step "$name" >"$WORK/$name.log" 2>&1
  rc=$?
  cat "$WORK/$name.log" >>"$LOG"
  case $rc in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
  esac
  # Out of time because the budget ran out, not because the step is slow.
  [[ "$status" == timeout && "$cut" == 1 ]] && note="limit cut to the budget's rest"
  record "$name" "$status" "$rc" $((SECONDS - t0)) "$limit" "$note"
  say "$name: $status (rc=$rc, $((SECONDS - t0))s)"
  if [[ "$status" != ok ]]; then
    tail -n 25 "$WORK/$name.log" | sed "s/^/    [$name] /"
    [[ "$name" == build || "$name" == kernels ]] && KERNELS_OK=0
  fi
}

say "detgrid GPU check in $ROOT; out=$OUT work=$WORK budget=${BUDGET}s dry_run=$DRY"
#    name      timeout  min  needs kernels   (guessed for a cold H100/H200; see the header)
# Required first, so a run cut short by the budget still answers; the
# shortest sanitizer before the longest, which the budget cuts first.
step env         30       5   0              # ~5 s
step deps        30       5   0              # ~3 s
step build   $BUDGET     60   0              # 90-150 s cold, seconds warm; nothing
                                             # runs without it, so it may take the rest
step kernels     30      10   0              # ~5 s
step bitwise     90      20   1              # ~40 s (repeats ~10, device vs host ~20,
                                             # golden ~5, stock ~5)
step routes      30      10   1              # ~5 s: grid-only calls under enable(), cross-device
step tests      120      30   1              # ~40 s? depends on tests/
step racecheck   45      20   1              # ~20 s
step memcheck   120      40   1              # ~40-90 s (29 2-D + 30 3-D cases)
# Optional: they report, never decide (a warm rerun has the time for them).
step initcheck   45      20   1              # ~20 s
step timing     120      30   1              # the rest: it stops starting workloads at its limit - 25 s

say "report"
JUNIT="$OUT/junit.xml"
timeout 60 "$PY" "$GC" report --work "$WORK" --out "$OUT" --junit "$JUNIT" \
  >"$WORK/report.log" 2>&1
rc=$?
cat "$WORK/report.log" >>"$LOG"
if [[ $rc != 0 ]]; then
  say "report failed (rc=$rc)"
  tail -n 30 "$WORK/report.log"
  exit 1
fi
say "done in $((SECONDS - START))s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
cat "$OUT/gpu_check.md"
verdict=$(sed -n '1s/^# detgrid GPU check: //p' "$OUT/gpu_check.md")
[[ "$verdict" == PASS || "$verdict" == DRY-RUN ]]
