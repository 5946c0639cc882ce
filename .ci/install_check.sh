#!/usr/bin/env bash
# CI: detgrid installed as a researcher would, on a machine without a GPU
# and without a system CUDA toolkit.
#
#  1. pip-only toolchain + binary wheel: a fresh venv with torch 2.14.1+cu130.
#     First, given a CUDA_HOME without nvcc, setup.py must stop with the
#     reason and the fix. Then with the pip CUDA compiler installed (the
#     first fix that message offers), PATH without any system nvcc and
#     CUDA_HOME unset, it runs
#     `pip wheel --no-build-isolation .`: setup.py must pick pip's nvcc and
#     torch's own architecture list is cut to one arch (TORCH_CUDA_ARCH_LIST)
#     to keep CI lean. The wheel must contain the CUDA kernels.
#  2. the wheel installed into a fresh venv (torch 2.14.1+cu130, no compiler
#     on PATH) loads, has its CUDA kernels, registers its overrides, and runs
#     --version;
#  3. the tests of the compiled extension (.ci/extension_tests.sh) pass with
#     the wheel's build: CI's one build against 2.14.1;
#  4. the version guard: the same wheel's detgrid refuses, in one line, to
#     load under a torch it was not built for (its build record doctored to
#     another torch).
#
#   bash .ci/install_check.sh      (~9 min on 2 cores, most of it nvcc; pip's
#                                   cache makes each fresh venv about a minute)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch_version=2.14.1
work=$(mktemp -d)
build_venv=$work/build-venv
trap 'rm -rf "$work"' EXIT
started=$SECONDS

step() { echo "install_check [$((SECONDS - started))s]: $*"; }
quiet_pip() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }

# A PATH with no CUDA compiler on it: every folder that holds an nvcc (the
# system toolkit's, a wrapper in /usr/local/bin) is dropped.
no_nvcc_path() {
  local dir kept=()
  IFS=: read -r -a dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [ -e "$dir/nvcc" ] || kept+=("$dir")
  done
  (IFS=:; echo "${kept[*]}")
}
clean_path=$(no_nvcc_path)
hidden=(env -u CUDA_HOME -u CUDA_PATH -u TORCH_CUDA_ARCH_LIST PATH="$clean_path")

new_torch_venv() {
  local venv=$1 && shift
  python3 -m venv "$venv"
  quiet_pip "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==$torch_version" numpy "$@"
}

# Work in a copy of the tracked files: no build/ or _build_info.py of
# another build in it, and none left behind.
git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -cf - --) | tar -xf - -C "$work" \
  --one-top-level=src

step "fresh venv: torch $torch_version, then the pip CUDA toolchain"
new_torch_venv "$build_venv" "setuptools>=77" wheel ninja
# A CUDA torch and no usable compiler: the install must stop, with the fix.
if (cd "$work/src" && "${hidden[@]}" CUDA_HOME="$work/no-toolkit" \
  "$build_venv/bin/python" setup.py --name >/dev/null 2>"$work/refusal.err"); then
  echo "install_check: setup.py went on without a compiler" >&2
  exit 1
fi
tail -n 1 "$work/refusal.err"
grep -q "^detgrid: torch $torch_version+cu130 has CUDA 13.0, but .* Fix: " "$work/refusal.err"
# The command that message offers first, as printed: the pip toolchain.
command=$(sed -n -E 's/.* from PyPI: (pip install [^;]+);.*/\1/p' "$work/refusal.err")
[ -n "$command" ] || { echo "install_check: no pip command in the message" >&2; exit 1; }
step "$command"
eval "quiet_pip \"$build_venv/bin/python\" -m $command -q --disable-pip-version-check"

step "pip wheel --no-build-isolation . (PATH without nvcc, CUDA_HOME unset, arch 9.0)"
(cd "$work/src" && "${hidden[@]}" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=2 \
  "$build_venv/bin/python" -m pip wheel -v --no-build-isolation --no-deps -w "$work/dist" . \
  >"$work/wheel.log" 2>&1) || { tail -n 40 "$work/wheel.log"; exit 1; }
# (pip -v indents the build's output)
grep -m1 "^ *detgrid: CUDA kernels with " "$work/wheel.log"
grep -q "^ *detgrid: CUDA kernels with $build_venv/.*/nvidia/cu13/bin/nvcc .*found via pip" \
  "$work/wheel.log" || { echo "install_check: the build did not use pip's nvcc" >&2; exit 1; }
wheel=$(ls "$work"/dist/detgrid-*.whl)
unzip -p "$wheel" detgrid/_build_info.py | tee "$work/build_info.py"
grep -q "^CUDA_KERNELS = True" "$work/build_info.py"
# The listing goes to a file first: under pipefail, `unzip -l | grep -q` fails
# with SIGPIPE whenever grep exits on its first match before unzip is done.
unzip -l "$wheel" >"$work/wheel_files.txt"
grep -q "detgrid/_C.*\.so" "$work/wheel_files.txt"

step "fresh venv: torch $torch_version, then the wheel; no compiler on PATH"
run_venv=$work/venv
new_torch_venv "$run_venv"
quiet_pip "$run_venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
cd "$work"  # away from any source tree: the installed package only
no_compiler=(env -u CUDA_HOME -u CUDA_PATH PATH="$run_venv/bin:/nonexistent")
"${no_compiler[@]}" "$run_venv/bin/detgrid" --version
"${no_compiler[@]}" "$run_venv/bin/python" - <<'PY'
import shutil
import warnings

import torch

import detgrid

warnings.simplefilter("error")
for compiler in ("nvcc", "c++", "g++", "gcc", "cc"):
    assert shutil.which(compiler) is None, f"{compiler} is on PATH"
assert "site-packages" in detgrid.__file__, detgrid.__file__
assert detgrid.ops.has_cuda_kernels(), "the wheel's CUDA kernels are missing"
with detgrid.enabled("cuda"):
    assert detgrid.is_enabled("cuda")
assert not detgrid.is_enabled("cuda")
print(f"detgrid wheel loads on torch {torch.__version__} with no compiler on PATH; "
      "CUDA kernels present, overrides register")
PY

# CI builds the extension against 2.14.1 only here: the wheel's build takes
# the tests .ci/cuda_build_check.sh runs on its own build of 2.15.0. They read
# the kit's source tree (setup.py, the repro scripts), so they run there, the
# wheel's compiled extension and build record in place of a build of its own.
step "the tests of the compiled extension with the wheel's build"
quiet_pip "$run_venv/bin/python" -m pip install -q --disable-pip-version-check \
  pytest expecttest hypothesis matplotlib
package=$("$run_venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("detgrid").submodule_search_locations[0])')
cp "$package"/_C*.so "$package/_build_info.py" "$work/src/tools/detgrid/"
(cd "$work/src" && PYTHONPATH="$work/src/tools" bash "$root/.ci/extension_tests.sh" "$run_venv/bin/python")

step "version guard: the installed build record doctored to another torch"
info=$package/_build_info.py
sed -i 's/^TORCH_VERSION = .*/TORCH_VERSION = "2.13.0+cpu"/; s/^TORCH_CUDA = .*/TORCH_CUDA = None/' "$info"
if "$run_venv/bin/python" -c "import detgrid" 2>"$work/guard.err"; then
  echo "install_check: detgrid loaded under a torch it was not built for" >&2
  exit 1
fi
tail -n 1 "$work/guard.err"
grep -q "^ImportError: detgrid was built for torch 2.13.0+cpu (CPU only) but torch $torch_version+cu130 (CUDA 13.0) is running" \
  "$work/guard.err"
step "passed"
