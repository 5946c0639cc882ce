#!/usr/bin/env bash
# Builds the extension WITH its CUDA kernels against a CUDA build of torch
# (no GPU needed), then proves that the result links and loads: every symbol
# it takes from libtorch_cuda resolves, the CUDA overrides register (their C++
# signatures must match aten's schemas), and the tests of the compiled
# extension pass with this build (their CPU side; the CUDA tests skip without
# a GPU).
#   bash .ci/cuda_build_check.sh 2.14.1   the cu130 wheel on this machine's disk
#   bash .ci/cuda_build_check.sh 2.15.0   the newest release (cu132), from PyPI
#                                          past this machine's pip cap
set -euo pipefail
version=${1:?usage: cuda_build_check.sh TORCH_VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${DETGRID_CACHE:-$HOME/.cache/detgrid}/venv-torch-$version
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pip_env=()
if [ "$version" = 2.15.0 ]; then
  pip_env=(XDG_CONFIG_DIRS=/nonexistent PIP_CONFIG_FILE=/dev/null)
fi
# The venv is cached across runs, and CI runs on one machine may overlap
# (one per worktree): one at a time creates or updates it.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
env "${pip_env[@]}" "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "torch==$version" numpy pytest expecttest hypothesis matplotlib "setuptools>=77" wheel 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
flock -u 9

# Build in a copy so that the .so of this build and the one in .venv (both
# for the same Python) never overwrite each other.
git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -cf - --) | tar -xf - -C "$work"
(cd "$work" && CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0 \
  MAX_JOBS=2 "$venv/bin/python" setup.py -q build_ext --inplace)

cd "$work"
PYTHONPATH="$work/tools" "$venv/bin/python" - <<'PY'
import warnings

import torch

import detgrid

warnings.simplefilter("error")
assert torch.version.cuda, torch.__version__
assert detgrid.ops.has_cuda_kernels(), "the CUDA kernels were not built"
with detgrid.enabled("cuda"):
    assert detgrid.is_enabled("cuda")
assert not detgrid.is_enabled("cuda")
print(f"CUDA build of detgrid loads on torch {torch.__version__}; overrides register")
PY
# The tests of the compiled extension with this build (.ci/extension_tests.sh).
PYTHONPATH="$work/tools" bash "$root/.ci/extension_tests.sh" "$venv/bin/python"
