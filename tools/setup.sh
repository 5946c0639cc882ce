#!/usr/bin/env bash
# Sets up the kit: .venv/ at the repo root with torch, test tools and detgrid
# built against that torch (the host executor always; the CUDA kernels too
# when torch has CUDA and nvcc is found). Idempotent: re-running rebuilds.
#   DETGRID_TORCH   torch requirement to install (default torch==2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."

torch_spec=${DETGRID_TORCH:-torch==2.13.0}
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check \
  "$torch_spec" numpy pytest expecttest hypothesis matplotlib setuptools wheel flake8 ruff 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
.venv/bin/python -m pip install -q --disable-pip-version-check \
  --no-build-isolation -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
.venv/bin/python -c "import detgrid, torch; print('detgrid ready: torch', torch.__version__, \
'| CUDA kernels built:', detgrid.ops.has_cuda_kernels())"
