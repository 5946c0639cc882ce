#!/usr/bin/env bash
# In-tree compile check: upstream v2.6.0 (Debian's pytorch source, cached by
# detgrid.kit.upstream_tree) patched by this checkout's `detgrid patch` (the
# whole stack: the core, the cuDNN route and the core's speed levels, so
# GridSamplerDeterministic.cu is the last speed level's), then the
# patched/new GridSampler .cu (nvcc 12.4) and .cpp (g++) files compiled to
# objects against the tree's own headers, its own torchgen's generated headers
# and its CMake-configured headers (see tools/detgrid/kit/intree_compile.py);
# then the same tree patched with the stack's core alone (`detgrid patch
# --upto core`), the units that read a file the core changes compiled again.
# No GPU needed; nothing is linked or run. Fails (never skips) when the tree
# or the toolchain cannot be had.
#   PYTHON   python for the kit, which needs no torch (default python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
export PYTHONPATH="$root/tools${PYTHONPATH:+:$PYTHONPATH}"

if ! tree=$("$python" -m detgrid.kit.upstream_tree); then
  echo "intree_compile: upstream v2.6.0 tree unavailable (reason above): FAILED" >&2
  exit 1
fi
exec "$python" -m detgrid.kit.intree_compile --pytorch "$tree"
