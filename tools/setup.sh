#!/usr/bin/env bash
# Sets up the kit: .venv/ at the repo root with torch, test tools and detgrid
# built against that torch (the kernels' host builds always; the CUDA kernels too
# when torch has CUDA: see setup.py). Idempotent: re-running rebuilds.
#   DETGRID_TORCH   torch requirement to install (default torch==2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."

torch_spec=${DETGRID_TORCH:-torch==2.13.0}
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check \
  "$torch_spec" numpy pytest expecttest hypothesis matplotlib setuptools wheel flake8 ruff 2>&1 \
  | { grep -v "^WARNING: Location" || true; }

# The build takes minutes (more with CUDA kernels): one line per compiled
# unit as ninja reports it, the full log in build/, its tail on failure
# (pip runs setup.py twice, so its own line is printed once).
once() { # prints each line the first time it comes, as it comes
  local -A seen=()
  local line
  while IFS= read -r line; do
    [ -n "${seen[$line]:-}" ] || { seen[$line]=1; printf '%s\n' "$line"; }
  done
}
log=build/detgrid-setup.log
mkdir -p build
echo "setup: building detgrid against $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)') (full log: $log)"
start=$SECONDS
if ! .venv/bin/python -m pip install -v --disable-pip-version-check \
  --no-build-isolation -e . 2>&1 | tee "$log" | sed -u -n -E \
  -e "s#^ *\[([0-9]+/[0-9]+)\] .* -c (-c )?$PWD/([^ ]+) -o .*#setup: [\1] \3#p" \
  -e 's#^ *(detgrid: .*)#setup: \1#p' | once; then
  tail -n 40 "$log"
  echo "setup: building detgrid failed; full log: $log" >&2
  exit 1
fi
echo "setup: built in $((SECONDS - start)) s"
.venv/bin/python -c "import detgrid, torch; print('detgrid ready: torch', torch.__version__, \
'| CUDA kernels built:', detgrid.ops.has_cuda_kernels())"
