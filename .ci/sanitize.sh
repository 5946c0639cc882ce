#!/usr/bin/env bash
# CI: the extension's host side (the kernels' host builds, made from the CUDA
# sources' own bytes) built with AddressSanitizer and UndefinedBehavior-
# Sanitizer, and the kernel test files run under it. Any sanitizer report
# fails the job.
#
#   bash .ci/sanitize.sh        (after tools/setup.sh; ~4 min on 2 cores)
#
# The build happens in a temporary copy of the tree (tracked and untracked,
# not ignored, files), so the instrumented _C.so never replaces the one in
# .venv. -fno-wrapv undoes the -fwrapv in Python's CFLAGS, which would make
# signed overflow defined and hide it from UBSan. GCC's -fsanitize=undefined
# leaves out float-cast-overflow: a float-to-int conversion of NaN, +-Inf or
# an out-of-range value gives 0x80000000... on x86 but a clamped value (0 for
# NaN) on CUDA, so the shared math must never make one, and this checks it
# over the hostile coordinates of test_fidelity.py, test_bad_input.py and
# test_grid_gradient_bits.py, and the random hostile grids of
# test_differential.py. No division by zero is relied on either
# (float-divide-by-zero).
#
# Environment:
#   DETGRID_PYTHON           interpreter with torch (default .venv/bin/python)
#   DETGRID_SANITIZE_TESTS   test files to run (default: the kernel test files)
#   DETGRID_SANITIZE_K       pytest -k expression (default: none)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${DETGRID_PYTHON:-$ROOT/.venv/bin/python}

# Not the golden digests (test_golden.py, test_core_golden.py): they are the
# bits of the host build setup.py makes, which contracts a * b + c into FMAs
# where g++'s optimizer finds them, as nvcc does; this instrumented -O1 build
# contracts elsewhere. Their hostile grids run here in test_differential.py,
# test_bad_input.py and test_fidelity.py.
default_tests="tests/test_bitwise.py tests/test_agreement.py tests/test_bad_input.py \
tests/test_3d.py tests/test_fidelity.py tests/test_nan_rule.py tests/test_differential.py \
tests/test_core.py tests/test_grid_gradient_bits.py"
read -r -a test_files <<<"${DETGRID_SANITIZE_TESTS:-$default_tests}"

work=$(mktemp -d "${TMPDIR:-/tmp}/detgrid_sanitize.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree=$work/tree
mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tree"

sanitizers="-fsanitize=address,undefined,float-cast-overflow,float-divide-by-zero"
sanitizers+=" -fno-sanitize-recover=undefined,float-cast-overflow,float-divide-by-zero"
# -g1: the line tables the reports' stack traces need, without the variable
# and type information, which makes an instrumented build take gigabytes and
# many minutes. -O1, as
# the sanitizers' own documentation advises: the build takes about 90 s less
# than at setup.py's -O2, and the instrumented tests take about as long.
echo "sanitize: building the host builds with $sanitizers -fno-wrapv in $tree"
(
  cd "$tree"
  DETGRID_CPU_ONLY=1 \
    DETGRID_EXTRA_CFLAGS="$sanitizers -fno-wrapv -fno-omit-frame-pointer -g1 -O1" \
    DETGRID_EXTRA_LDFLAGS="$sanitizers" \
    MAX_JOBS=${MAX_JOBS:-2} \
    "$PY" setup.py -q build_ext --inplace >"$work/build.log" 2>&1
) || {
  tail -n 40 "$work/build.log"
  echo "sanitize: the instrumented build failed" >&2
  exit 1
}

# Python itself is not instrumented, so the ASan runtime has to be loaded
# first, and libstdc++ with it: ASan intercepts __cxa_throw only if that is
# there when it starts (else the first C++ exception, a TORCH_CHECK, trips
# ASan's own CHECK). Leak checking would report CPython's and torch's
# intended leaks at exit. The first report ends the process.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONPATH=$tree/tools
export PYTHONMALLOC=malloc # every Python allocation seen by ASan too
export DETGRID_SANITIZERS=1 # tests leave out what is undefined on the host only

cd "$tree"
"$PY" -c 'import detgrid, sys; sys.exit(not detgrid.__file__.startswith(sys.argv[1]))' \
  "$tree/" || {
  echo "sanitize: the instrumented detgrid from $tree did not load" >&2
  exit 1
}
k=()
[[ -n "${DETGRID_SANITIZE_K:-}" ]] && k=(-k "$DETGRID_SANITIZE_K")
echo "sanitize: pytest ${test_files[*]} ${k[*]}"
# Reports go to file descriptor 2, which pytest's default capture would
# swallow along with the process a report ends: --capture=sys leaves it alone
# and the job reads it afterwards (GCC 12's UBSan does not honour log_path).
status=0
"$PY" -m pytest -q -p no:cacheprovider --capture=sys "${test_files[@]}" "${k[@]}" \
  2>"$work/stderr.log" || status=$?

report='^(SUMMARY: (Address|UndefinedBehavior)Sanitizer|==[0-9]+==ERROR: |AddressSanitizer: |.*: runtime error: )'
if grep -Eq "$report" "$work/stderr.log"; then
  # Through a file, not a pipe: `grep | head` under pipefail races to SIGPIPE.
  grep -E -A 30 "$report" "$work/stderr.log" >"$work/reports.log" || true
  head -n 120 "$work/reports.log" >&2
  echo "sanitize: sanitizer report (pytest exit $status)" >&2
  exit 1
fi
if ((status != 0)); then
  tail -n 40 "$work/stderr.log" >&2
  echo "sanitize: pytest failed (exit $status)" >&2
  exit "$status"
fi
echo "sanitize: clean"
