"""In-tree compile check: the patched PyTorch sources, compiled the way the checkout builds them.

``python -m detgrid.kit.intree_compile --pytorch TREE`` (TREE: a PyTorch source tree, e.g. the one
``python -m detgrid.kit.upstream_tree`` prints) never touches TREE. It

1. copies the files the patch and the compile need into a temporary git repo (committed, tagged
   v<version>) and runs ``detgrid patch`` of this checkout of the kit on it: the whole stack
   (detgrid.levels.UPSTREAM_STACK), so GridSamplerDeterministic.cu is the core's with every speed
   level's diff applied; the copy's file must be ``stack.core_sources(kit, <last patch>)``;
2. runs the copy's own torchgen (``python -m torchgen.gen --per-operator-headers --generate
   headers``), cached under ``<cache>/intree-gen/<version>-<hash of torchgen's inputs>``;
3. writes the headers CMake would configure (``cmake_macros.h``, ``cuda_cmake_macros.h``,
   ``ATen/Config.h``, ``ATen/cuda/CUDAConfig.h``) from the copy's ``*.h.in`` templates, with the
   values of a CUDA build with cuDNN;
4. compiles every C++/CUDA translation unit the patch created or changed to an object file:
   ``.cu`` with nvcc and ``.cpp`` with g++, each with the include paths and definitions of its
   library (torch_cuda or torch_cpu), and checks that every header the patch created or changed
   was included by one of them. Nothing is linked or run. A unit whose flags, compiler and every
   file it read are byte-identical to an earlier successful compile is not compiled again
   (records under ``<cache>/intree-compiled``; ``--no-reuse`` compiles everything);
5. then the stack's core alone (issue 41): resets the copy to v<version>, runs ``detgrid patch
   --upto core`` on it and compiles again only the units whose first compile read a file that
   differs between the two patched trees (``git diff`` of the two commits; in practice the
   deterministic unit GridSamplerDeterministic.cu, which the speed levels change), the others'
   compiles standing for both; the core's changed headers must be covered the same way, and the
   copy's file must be ``stack.core_sources(kit, "core")``. ``--no-core`` leaves this step out.

The CUDA toolchain is the release the checkout's wheels were built with (CUDA 12.4 for v2.6.0),
assembled once under ``<cache>/intree-cuda-<release>``. PyPI's ``nvidia-cuda-nvcc-cu12`` wheels
hold only ptxas, libnvvm and the crt headers (no nvcc driver, cicc or cudafe++), so the compiler
driver and front ends come from Debian's ``nvidia-cuda-toolkit`` (trixie non-free, same build),
fetched with apt-get into a private apt state directory and unpacked (never installed); the CUDA
runtime, cuBLAS, cuSPARSE, cuSOLVER, cuRAND, NVTX and cuDNN headers come from the pip wheels the
release's torch wheel pins (torch 2.6.0: cudart 12.4.127, cuDNN 9.1.0.70, ...), CCCL and nvcc's
crt/ headers from the 12.4 wheels that match them.

Exit status: 0 all compiled; 1 a compile failed or a changed header went uncompiled; 2 the
toolchain, the patch or the code generation could not be set up (the reason is printed).
"""

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from detgrid.kit import apt, stack, upstream_tree

EXIT_OK, EXIT_COMPILE, EXIT_SETUP = 0, 1, 2

KIT_TOOLS = Path(__file__).resolve().parents[2]
KIT_ROOT = KIT_TOOLS.parent  # where aten_kernels/ is: the core's sources and the levels' diffs


class SetupError(RuntimeError):
    """The toolchain, the tree copy, the patch or the code generation could not be set up."""


class ConfigureError(SetupError):
    """A header template is missing or needs a value this tool does not define."""


# --------------------------------------------------------------------------- CMake configure_file

_FALSE = {"", "0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND"}

Value = Union[bool, int, str]


def cmake_truthy(value: Value) -> bool:
    """CMake's if(<constant>) for a variable's value (a bool/int/str here)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    s = str(value).strip()
    return not (s.upper() in _FALSE or s.upper().endswith("-NOTFOUND"))


def _render(value: Value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


_CMAKEDEFINE01 = re.compile(r"^(?P<ind>[ \t]*)#(?P<sp>[ \t]*)cmakedefine01[ \t]+(?P<var>\w+)[ \t]*$")
_CMAKEDEFINE = re.compile(r"^(?P<ind>[ \t]*)#(?P<sp>[ \t]*)cmakedefine[ \t]+(?P<var>\w+)(?P<rest>.*)$")


def configure_file(text: str, values: Mapping[str, Value], at_only: bool = False,
                   where: str = "<template>") -> str:
    """CMake's ``configure_file`` on ``text``, strict: every variable must be in ``values``.

    ``#cmakedefine VAR rest`` becomes ``#define VAR rest`` when VAR is true, else
    ``/* #undef VAR */``; ``#cmakedefine01 VAR`` becomes ``#define VAR 0|1``; ``@VAR@`` (and
    ``${VAR}`` unless ``at_only``) become the value. CMake would read an unknown variable as empty
    and carry on; here it raises ConfigureError naming every unknown variable, so that a checkout
    whose template gained a setting fails loudly instead of compiling against a guessed header.
    """
    unknown: List[str] = []

    def get(var: str) -> Value:
        if var not in values:
            if var not in unknown:
                unknown.append(var)
            return ""
        return values[var]

    def subst(s: str) -> str:
        s = re.sub(r"@(\w+)@", lambda m: _render(get(m.group(1))), s)
        if not at_only:
            s = re.sub(r"\$\{(\w+)\}", lambda m: _render(get(m.group(1))), s)
        return s

    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        eol = line[len(body):]
        m = _CMAKEDEFINE01.match(body)
        if m:
            v = get(m.group("var"))
            out.append(f"{m.group('ind')}#{m.group('sp')}define {m.group('var')} "
                       f"{1 if cmake_truthy(v) else 0}{eol}")
            continue
        m = _CMAKEDEFINE.match(body)
        if m:
            var = m.group("var")
            if cmake_truthy(get(var)):
                out.append(f"{m.group('ind')}#{m.group('sp')}define {var}{subst(m.group('rest'))}{eol}")
            else:
                out.append(f"{m.group('ind')}/* #undef {var} */{eol}")
            continue
        out.append(subst(line))
    if unknown:
        raise ConfigureError(f"{where}: no value for {', '.join(unknown)} (a setting this check "
                             "does not know; add it to intree_compile.CONFIGURED)")
    return "".join(out)


@dataclass(frozen=True)
class Configured:
    template: str  # relative to the tree
    output: str  # relative to the build directory
    values: Mapping[str, Value]
    at_only: bool = False


# A Linux x86_64 source build with USE_CUDA=1 and cuDNN found, as `pip install -e .` makes it with
# the defaults (shared libraries; no MKL, MAGMA or cuSPARSELt installed, so OpenBLAS/pocketfft).
# Only AT_CUDNN_ENABLED changes which code of the patched files is compiled: with it the cuDNN
# backward that the patch edits is compiled instead of its "not compiled with cuDNN" stub.
CONFIGURED: Tuple[Configured, ...] = (
    Configured("c10/macros/cmake_macros.h.in", "c10/macros/cmake_macros.h", {
        "C10_BUILD_SHARED_LIBS": True, "C10_USE_GLOG": False, "C10_USE_GFLAGS": False,
        "C10_USE_NUMA": True, "C10_USE_MSVC_STATIC_RUNTIME": False,
        "C10_USE_ROCM_KERNEL_ASSERT": False,
    }),
    Configured("c10/cuda/impl/cuda_cmake_macros.h.in", "c10/cuda/impl/cuda_cmake_macros.h", {
        "C10_CUDA_BUILD_SHARED_LIBS": True,
    }),
    Configured("aten/src/ATen/Config.h.in", "aten/src/ATen/Config.h", {
        "AT_MKLDNN_ENABLED": 1, "AT_MKLDNN_ACL_ENABLED": 0, "AT_MKL_ENABLED": 0,
        "AT_MKL_SEQUENTIAL": 0, "AT_POCKETFFT_ENABLED": 1, "AT_NNPACK_ENABLED": 1,
        "CAFFE2_STATIC_LINK_CUDA_INT": 0, "AT_BUILD_WITH_BLAS": 1, "AT_BUILD_WITH_LAPACK": 1,
        "AT_PARALLEL_OPENMP": 1, "AT_PARALLEL_NATIVE": 0, "AT_BLAS_F2C": 0,
        "AT_BLAS_USE_CBLAS_DOT": 0,
    }),
    Configured("aten/src/ATen/cuda/CUDAConfig.h.in", "aten/src/ATen/cuda/CUDAConfig.h", {
        "AT_CUDNN_ENABLED": 1, "AT_CUSPARSELT_ENABLED": 0, "AT_ROCM_ENABLED": 0,
        "AT_MAGMA_ENABLED": 0, "NVCC_FLAGS_EXTRA": "-gencode;arch=compute_90,code=sm_90",
    }),
)


def configure_headers(tree: Path, build: Path,
                      configured: Sequence[Configured] = CONFIGURED) -> List[Path]:
    """Write each configured header from the tree's template into ``build``."""
    written = []
    for c in configured:
        src = Path(tree) / c.template
        if not src.is_file():
            raise ConfigureError(f"{src}: template missing (the checkout's layout differs from "
                                 "what this check knows)")
        dst = Path(build) / c.output
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(configure_file(src.read_text(), c.values, c.at_only, where=c.template))
        written.append(dst)
    return written


# --------------------------------------------------------------------------- toolchains


@dataclass(frozen=True)
class Toolchain:
    """The CUDA release a PyTorch release's wheels were built with, and where its parts come from."""
    cuda: str  # e.g. "12.4"
    cxx_std: str  # the checkout's CMAKE_CXX_STANDARD
    debian_package: str  # holds nvcc, cicc, cudafe++, ptxas, fatbinary
    debian_version_prefix: str  # upstream part of the Debian version: the same nvcc build
    debian_suite: str
    debian_component: str
    pip: Tuple[str, ...]  # wheels whose include/ directories make up the headers
    required_headers: Tuple[str, ...] = (
        "crt/host_config.h", "cuda_runtime.h", "cub/cub.cuh", "thrust/version.h",
        "cuda/std/type_traits", "cublas_v2.h", "cusparse.h", "cusolverDn.h", "curand.h",
        "nvtx3/nvToolsExt.h", "cudnn.h",
    )

    @property
    def name(self) -> str:
        return f"intree-cuda-{self.cuda}"


# torch 2.6.0's wheels: CUDA 12.4. Its METADATA pins these runtime, cuBLAS, cuSPARSE, cuSOLVER,
# cuRAND, NVTX and cuDNN versions; nvcc 12.4.131 is Debian's build, CCCL the 12.4 release's.
CUDA_12_4 = Toolchain(
    cuda="12.4",
    cxx_std="c++17",
    debian_package="nvidia-cuda-toolkit",
    debian_version_prefix="12.4.131~",
    debian_suite="trixie",
    debian_component="non-free",
    pip=(
        "nvidia-cuda-nvcc-cu12==12.4.131",  # crt/ headers (nvcc's own), same build as Debian's
        "nvidia-cuda-runtime-cu12==12.4.127",
        "nvidia-cuda-cccl-cu12==12.4.127.post1",
        "nvidia-cublas-cu12==12.4.5.8",
        "nvidia-cusparse-cu12==12.3.1.170",
        "nvidia-cusolver-cu12==11.6.1.9",
        "nvidia-curand-cu12==10.3.5.147",
        "nvidia-nvtx-cu12==12.4.127",
        "nvidia-cudnn-cu12==9.1.0.70",
    ),
)

TOOLCHAINS: Dict[str, Toolchain] = {"2.6": CUDA_12_4}


def toolchain_for(version_txt: str) -> Toolchain:
    m = re.match(r"(\d+)\.(\d+)", version_txt.strip())
    key = f"{m.group(1)}.{m.group(2)}" if m else version_txt.strip()
    if key not in TOOLCHAINS:
        raise SetupError(f"no CUDA toolchain known for PyTorch {version_txt.strip()} (known: "
                         f"{', '.join(sorted(TOOLCHAINS))}); add one to intree_compile.TOOLCHAINS")
    return TOOLCHAINS[key]


def cache_dir() -> Path:
    return upstream_tree.cache_dir()


def _run(cmd: Sequence[str], what: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, **kw)
    if r.returncode != 0:
        out = "\n".join(
            line for line in (r.stderr + r.stdout).splitlines() if "WARNING: Location" not in line
        )
        raise SetupError(f"{what} failed (exit {r.returncode}): {out.strip()[-1500:]}")
    return r


def _pip_cmd() -> List[str]:
    return [sys.executable, "-m", "pip"]


def _extract_includes(wheel: Path, dest: Path) -> int:
    """Unpack ``nvidia/<pkg>/include/**`` of a wheel into ``dest`` (the package prefix dropped)."""
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            m = re.match(r"nvidia/[^/]+/include/(.+)$", info.filename)
            if not m or info.is_dir() or m.group(1).endswith("__init__.py"):
                continue
            out = dest / m.group(1)
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            n += 1
    return n


def missing_headers(include: Path, required: Iterable[str]) -> List[str]:
    return [h for h in required if not (Path(include) / h).is_file()]


NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""

# files of the Debian package -> place in the toolchain (the layout of NVIDIA's own installs)
DEBIAN_FILES = {
    "usr/lib/nvidia-cuda-toolkit/bin/nvcc": "bin/nvcc",
    "usr/lib/nvidia-cuda-toolkit/bin/cicc": "nvvm/bin/cicc",
    "usr/bin/cudafe++": "bin/cudafe++",
    "usr/bin/ptxas": "bin/ptxas",
    "usr/bin/fatbinary": "bin/fatbinary",
    "usr/bin/nvlink": "bin/nvlink",
    "usr/bin/bin2c": "bin/bin2c",
    "usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc": "nvvm/libdevice/libdevice.10.bc",
}


def fetch_debian_compiler(tc: Toolchain, work: Path, log) -> Path:
    """apt-get download tc.debian_package into ``work`` (private apt state, nothing installed)
    and unpack it; return the unpacked root."""
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise SetupError(f"{tool} not found: nvcc {tc.cuda} comes from Debian's "
                             f"{tc.debian_package} (PyPI's nvidia-cuda-nvcc-cu12 wheels have no "
                             "nvcc driver, cicc or cudafe++)")
    if not apt.DEBIAN_KEYRING.is_file():
        raise SetupError(f"{apt.DEBIAN_KEYRING} missing: cannot verify Debian's {tc.debian_suite} index")
    state = work / "apt"
    for d in ("lists/partial", "cache/archives/partial", "preferences.d"):
        (state / d).mkdir(parents=True, exist_ok=True)
    (state / "sources.list").write_text(
        f"deb [signed-by={apt.DEBIAN_KEYRING}] http://deb.debian.org/debian {tc.debian_suite} "
        f"{tc.debian_component}\n")
    opts = apt.private_options(state)
    log(f"apt-get update (private state, {tc.debian_suite} {tc.debian_component})")
    _run(["apt-get", *opts, "-q", "update"], f"apt-get update for Debian {tc.debian_suite}")
    shown = _run(["apt-cache", *opts, "show", tc.debian_package], f"apt-cache show {tc.debian_package}")
    versions = re.findall(r"^Version: (\S+)$", shown.stdout, re.M)
    fit = [v for v in versions if v.startswith(tc.debian_version_prefix)]
    if not fit:
        raise SetupError(f"Debian {tc.debian_suite} has {tc.debian_package} {', '.join(versions) or 'none'}, "
                         f"none {tc.debian_version_prefix}* (nvcc {tc.cuda})")
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    log(f"apt-get download {tc.debian_package}={fit[0]}")
    _run(["apt-get", *opts, "-q", "download", f"{tc.debian_package}={fit[0]}"],
         f"apt-get download {tc.debian_package}={fit[0]}", cwd=debs)
    deb = next(debs.glob(f"{tc.debian_package}_*.deb"), None)
    if deb is None:
        raise SetupError(f"apt-get download left no {tc.debian_package}_*.deb")
    unpacked = work / "deb-root"
    _run(["dpkg-deb", "-x", deb, unpacked], f"dpkg-deb -x {deb.name}")
    return unpacked


def ensure_toolchain(tc: Toolchain, cache: Path, log=print) -> Path:
    """The toolchain directory (bin/nvcc, nvvm/, include/), assembled on first use."""
    root = Path(cache) / tc.name
    if (root / ".complete").is_file():
        return root
    Path(cache).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{tc.name}-", dir=cache))
    try:
        stage = work / "root"
        (stage / "include").mkdir(parents=True)
        wheels = work / "wheels"
        log(f"pip download {len(tc.pip)} wheels (headers only are kept)")
        _run([*_pip_cmd(), "download", "-q", "--no-deps", "--disable-pip-version-check",
              "-d", wheels, *tc.pip], "pip download of the CUDA wheels")
        for whl in sorted(wheels.glob("*.whl")):
            if _extract_includes(whl, stage / "include") == 0:
                raise SetupError(f"{whl.name}: no nvidia/*/include/ files")
            whl.unlink()
        lost = missing_headers(stage / "include", tc.required_headers)
        if lost:
            raise SetupError(f"headers missing from the pip wheels {', '.join(tc.pip)}: {', '.join(lost)}")
        unpacked = fetch_debian_compiler(tc, work, log)
        for src, dst in DEBIAN_FILES.items():
            if not (unpacked / src).is_file():
                raise SetupError(f"{tc.debian_package}: {src} missing")
            (stage / dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(unpacked / src, stage / dst)
        (stage / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)
        ver = _run([stage / "bin" / "nvcc", "--version"], "nvcc --version").stdout
        if f"release {tc.cuda}," not in ver:
            raise SetupError(f"assembled nvcc is not CUDA {tc.cuda}: {ver.strip()}")
        (stage / "manifest.json").write_text(json.dumps({
            "cuda": tc.cuda, "nvcc": ver.strip().splitlines()[-1],
            "debian": f"{tc.debian_package} ({tc.debian_suite} {tc.debian_component})",
            "pip": list(tc.pip),
        }, indent=1) + "\n")
        (stage / ".complete").write_text("")
        if root.exists():
            shutil.rmtree(root)
        stage.rename(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return root


def ensure_python_deps(cache: Path) -> Path:
    """PyYAML and typing_extensions for torchgen, pip-installed once into a --target directory."""
    target = Path(cache) / f"intree-py{sys.version_info.major}.{sys.version_info.minor}"
    if (target / ".complete").is_file():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".intree-py-", dir=cache))
    try:
        _run([*_pip_cmd(), "install", "-q", "--disable-pip-version-check", "--no-deps",
              "--target", tmp, "pyyaml", "typing_extensions"], "pip install pyyaml typing_extensions")
        (tmp / ".complete").write_text("")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- tree copy and patch

EXTRA_DIRS = ("c10", "caffe2", "torchgen", "torch/csrc", "torch/headeronly")


def copy_and_patch(tree: Path, dest: Path, log=print) -> List[str]:
    """A committed git copy of ``tree`` (what the patch and the compile read), patched by this
    kit's ``detgrid patch``; return the paths the patch created or changed."""
    tag = base_tag(tree)
    try:
        upstream_tree.fresh_git_copy(dest, source=Path(tree), tag=tag)
    except (OSError, RuntimeError) as e:
        raise SetupError(f"copying {tree}: {e}")
    for rel in EXTRA_DIRS:
        if (Path(tree) / rel).is_dir():
            shutil.copytree(Path(tree) / rel, dest / rel, dirs_exist_ok=True)
    genv = dict(os.environ, **_GIT_IDENTITY)
    for cmd in (["add", "-A"], ["commit", "-q", "--allow-empty", "-m", "headers for the compile"],
                ["tag", "-f", tag]):
        _run(["git", "-C", dest, *cmd], f"git {cmd[0]} in the copy", env=genv)
    return _detgrid_patch(dest, tag, None, dest.parent / "detgrid.patch", log)


_GIT_IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                 "GIT_COMMITTER_EMAIL": "t@t"}


def base_tag(copy: Path) -> str:
    version = (Path(copy) / "version.txt").read_text().strip()
    return "v" + re.sub(r"a0$", "", version)


def _detgrid_patch(dest: Path, tag: str, upto: Optional[str], out: Path, log=print) -> List[str]:
    """``detgrid patch`` of this checkout of the kit on the copy (at ``tag``), the whole stack or
    (``upto``) its prefix ending at that level; the paths it created or changed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(KIT_TOOLS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    # the patch commits the change: give it an identity of its own in this throw-away copy
    env.update(_GIT_IDENTITY)
    level = ["--upto", upto] if upto else []
    r = subprocess.run([sys.executable, "-m", "detgrid", "patch", "--pytorch", str(dest), *level,
                        "--out", str(out)],
                       capture_output=True, text=True, env=env)
    for line in (r.stdout + r.stderr).splitlines():
        log(f"  {line}")
    if r.returncode != 0:
        raise SetupError(f"detgrid patch{' --upto ' + upto if upto else ''} exited {r.returncode}")
    diff = _run(["git", "-C", dest, "diff", "--name-only", tag, "HEAD"], "git diff")
    return sorted(line for line in diff.stdout.splitlines() if line.strip())


def check_core_files(copy: Path, upto: str, kit: Path = KIT_ROOT) -> List[str]:
    """The core's files in the patched copy must be the kit's as the prefix of the stack ending at
    ``upto`` has them (``stack.core_sources``): SetupError naming the first that is not; the paths
    checked otherwise."""
    want = stack.core_sources(kit, upto)
    for rel, text in want.items():
        f = Path(copy) / rel
        if not f.is_file() or f.read_bytes() != text.encode("utf-8"):
            raise SetupError(f"{rel} in the copy is not the stack's up to {upto} "
                             f"({'missing' if not f.is_file() else 'differs'})")
    return sorted(want)


def head(copy: Path) -> str:
    return _run(["git", "-C", copy, "rev-parse", "HEAD"], "git rev-parse").stdout.strip()


def repatch_upto(copy: Path, upto: str, out: Path, log=print) -> Tuple[List[str], List[str]]:
    """The copy (patched with the whole stack, committed) reset to its base and patched again
    with ``detgrid patch --upto upto``: (the paths that patch created or changed, the paths
    whose content differs between the two patched trees)."""
    tag = base_tag(copy)
    whole = head(copy)
    _run(["git", "-C", copy, "reset", "-q", "--hard", tag], "git reset in the copy")
    _run(["git", "-C", copy, "clean", "-q", "-fd"], "git clean in the copy")
    changed = _detgrid_patch(copy, tag, upto, out, log)
    diff = _run(["git", "-C", copy, "diff", "--name-only", whole, "HEAD"], "git diff")
    return changed, sorted(line for line in diff.stdout.splitlines() if line.strip())


# --------------------------------------------------------------------------- torchgen


def torchgen_key(tree: Path) -> str:
    """Hash of everything torchgen reads: torchgen/*.py, the yaml files and the templates."""
    tree = Path(tree)
    files = sorted(
        [*tree.glob("torchgen/**/*.py"), *tree.glob("torchgen/**/*.yaml"),
         *tree.glob("aten/src/ATen/templates/**/*"),
         tree / "aten/src/ATen/native/native_functions.yaml", tree / "aten/src/ATen/native/tags.yaml"]
    )
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.relative_to(tree).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def generate_aten(tree: Path, cache: Path, pydeps: Path, log=print) -> Path:
    """Run the tree's torchgen (headers, per-operator) once per input hash; return the directory
    that plays CMake's ``<build>/aten/src`` (it holds ``ATen/Functions.h``, ``ATen/ops/``...)."""
    tree = Path(tree)
    version = (tree / "version.txt").read_text().strip()
    out = Path(cache) / "intree-gen" / f"{version}-{torchgen_key(tree)}"
    if (out / ".complete").is_file():
        log(f"torchgen: cached {out}")
        return out / "aten/src"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    try:
        t0 = time.time()
        env = dict(os.environ, PYTHONPATH=str(pydeps), PYTHONDONTWRITEBYTECODE="1")
        _run([sys.executable, "-m", "torchgen.gen", "--source-path", "aten/src/ATen",
              "--install_dir", tmp / "aten/src/ATen", "--per-operator-headers",
              "--generate", "headers"], "torchgen", cwd=tree, env=env)
        for must in ("ATen/Functions.h", "ATen/core/TensorBody.h", "ATen/ops/empty.h"):
            if not (tmp / "aten/src" / must).is_file():
                raise SetupError(f"torchgen produced no {must}")
        (tmp / ".complete").write_text("")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        log(f"torchgen: generated {out} in {time.time() - t0:.0f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "aten/src"


# --------------------------------------------------------------------------- compile

CUDA_DIRS = {"cuda", "cudnn"}  # path components of torch_cuda's .cpp files under aten/src/ATen


def unit_kind(path: str) -> Optional[str]:
    """How a changed file is compiled: 'nvcc' (.cu, torch_cuda), 'cuda-cpp' (.cpp of torch_cuda:
    under a cuda/ or cudnn/ directory), 'cpp' (torch_cpu), 'header', or None (not C++)."""
    p = Path(path)
    if p.suffix == ".cu":
        return "nvcc"
    if p.suffix in (".cpp", ".cc"):
        return "cuda-cpp" if CUDA_DIRS & set(p.parts[:-1]) else "cpp"
    if p.suffix in (".h", ".cuh", ".hpp"):
        return "header"
    return None


# The core's deterministic backward calls the coordinate helpers that torch 2.15 added to
# ATen/native/cuda/GridSampler.cuh (resolve_cubic_taps, compute_coordinates_sized). The upstream
# patch targets main, which has them; the tree this check patches is a stand-in (v2.6.0), whose
# GridSampler.cuh lacks them. So, for a tree older than COMPAT_SINCE, the kit's compat folder (a
# GridSampler.cuh that #include_next's the tree's and adds the helpers, as the kit's own builds
# against older wheels use it) goes ahead of the tree's headers, for the units that call the
# helpers only (COMPAT_UNITS): every other unit still compiles against the tree's headers alone.
COMPAT_INCLUDE = KIT_ROOT / "aten_kernels" / "compat" / "include"
COMPAT_UNITS = ("aten/src/ATen/native/cuda/GridSamplerDeterministic.cu",)
COMPAT_SINCE = (2, 15)
# torch/version.h, which the compat header reads the release from, is generated (CMake configures
# it from version.h.in; wheels ship it): where the tree's include directories (Paths.includes)
# hold none, the release is passed to the compile as its macros, from the tree's version.txt.
VERSION_HEADERS = ("torch/version.h", "torch/csrc/api/include/torch/version.h")


def release_of(version_txt: str) -> Tuple[int, int]:
    """(major, minor) of a version.txt's text ("2.6.0a0" -> (2, 6))."""
    m = re.match(r"(\d+)\.(\d+)", version_txt.strip())
    if not m:
        raise SetupError(f"version.txt {version_txt.strip()!r}: no <major>.<minor>")
    return int(m.group(1)), int(m.group(2))


def compat_flags(tree: Path, version_txt: str, compat: Path = COMPAT_INCLUDE) -> Tuple[str, ...]:
    """The flags that go ahead of the include paths of COMPAT_UNITS: none for a tree at
    COMPAT_SINCE or later (its GridSampler.cuh has the helpers); else -I of the compat folder, and
    -DTORCH_VERSION_MAJOR/MINOR of version.txt where the tree has no generated torch/version.h."""
    release = release_of(version_txt)
    if release >= COMPAT_SINCE:
        return ()
    if not (Path(compat) / "ATen/native/cuda/GridSampler.cuh").is_file():
        raise SetupError(f"{compat}: no ATen/native/cuda/GridSampler.cuh (the helpers PyTorch "
                         f"{version_txt.strip()} lacks)")
    flags = [f"-I{compat}"]
    if not any((Path(tree) / h).is_file() for h in VERSION_HEADERS):
        flags += [f"-DTORCH_VERSION_MAJOR={release[0]}", f"-DTORCH_VERSION_MINOR={release[1]}"]
    return tuple(flags)


@dataclass
class Paths:
    tree: Path
    build: Path  # configured headers (CMake's binary dir)
    gen: Path  # torchgen output (CMake's <binary dir>/aten/src)
    toolchain: Path
    objects: Path
    compat: Tuple[str, ...] = ()  # compat_flags(): ahead of the includes of COMPAT_UNITS only

    def includes(self, cuda: bool, unit: Optional[str] = None) -> List[str]:
        inc = [f"-I{self.gen}", f"-I{self.build / 'aten/src'}", f"-I{self.build}",
               f"-I{self.tree / 'aten/src'}", f"-I{self.tree}",
               f"-I{self.tree / 'torch/csrc/api/include'}"]
        if unit in COMPAT_UNITS:
            inc = [*self.compat, *inc]
        if cuda:
            inc += ["-isystem", str(self.toolchain / "include")]
        return inc


COMMON_DEFINES = ["-DAT_PER_OPERATOR_HEADERS", "-D_FILE_OFFSET_BITS=64",
                  "-D_GLIBCXX_USE_CXX11_ABI=1", "-DNDEBUG"]
CUDA_DEFINES = ["-DUSE_CUDA", "-DTORCH_CUDA_BUILD_MAIN_LIB", "-Dtorch_cuda_EXPORTS",
                "-DTORCH_CUDA_USE_NVTX3"]
CPU_DEFINES = ["-DCAFFE2_BUILD_MAIN_LIB", "-Dtorch_cpu_EXPORTS"]
# CMAKE_CXX_FLAGS of a GCC build (CMakeLists.txt), WERROR=1 as upstream CI builds
CXX_FLAGS = ["-O2", "-fPIC", "-Wall", "-Wextra", "-Werror=return-type", "-Werror=non-virtual-dtor",
             "-Werror=range-loop-construct", "-Werror=bool-operation", "-Wnarrowing",
             "-Wno-missing-field-initializers", "-Wno-type-limits", "-Wno-array-bounds",
             "-Wno-unknown-pragmas", "-Wno-unused-parameter", "-Wno-strict-overflow",
             "-Wno-strict-aliasing", "-Wno-stringop-overflow", "-Wsuggest-override", "-Wno-psabi",
             "-faligned-new", "-Werror", "-Wno-unused-but-set-variable", "-Wno-maybe-uninitialized",
             "-fno-math-errno", "-fno-trapping-math", "-Werror=format"]
# CMAKE_CUDA_FLAGS (cmake/Dependencies.cmake, cmake/public/cuda.cmake), WERROR=1
NVCC_FLAGS = ["-O3", "-Xcompiler", "-Werror", "-Xcompiler", "-Wno-error=sign-compare",
              "-Wno-deprecated-gpu-targets", "--expt-extended-lambda", "--expt-relaxed-constexpr",
              "-DCUB_WRAPPED_NAMESPACE=at_cuda_detail", "-DCUDA_HAS_FP16=1",
              "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_HALF2_OPERATORS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-Xcudafe", ",".join(f"--diag_suppress={d}" for d in (
                  "cc_clobber_ignored", "field_without_dll_interface",
                  "base_class_has_different_dll_interface", "dll_interface_conflict_none_assumed",
                  "dll_interface_conflict_dllexport_assumed", "bad_friend_decl")),
              "-Xcompiler=-fPIC", "-gencode", "arch=compute_90,code=sm_90"]


def compile_command(rel: str, kind: str, paths: Paths, std: str, cxx: str = "g++") -> List[str]:
    src = paths.tree / rel
    obj = paths.objects / (rel.replace("/", "__") + ".o")
    dep = obj.with_suffix(".d")
    if kind == "nvcc":
        return [str(paths.toolchain / "bin/nvcc"), "-c", f"-std={std}", "-ccbin", cxx,
                *COMMON_DEFINES, *CUDA_DEFINES, *NVCC_FLAGS, *paths.includes(cuda=True, unit=rel),
                "-MD", "-MF", str(dep), "-o", str(obj), str(src)]
    cuda = kind == "cuda-cpp"
    return [cxx, "-c", f"-std={std}", *COMMON_DEFINES, *(CUDA_DEFINES if cuda else CPU_DEFINES),
            *CXX_FLAGS, *paths.includes(cuda=cuda, unit=rel), "-MD", "-MF", str(dep), "-o", str(obj), str(src)]


def parse_depfile(text: str) -> List[str]:
    """The prerequisites of a make-style .d file (what a compile read)."""
    body = text.replace("\\\n", " ")
    out = []
    for rule in body.splitlines():
        if ":" not in rule:
            continue
        _, _, deps = rule.partition(": ")
        out += [d.replace("\\ ", " ") for d in re.split(r"(?<!\\)\s+", deps.strip()) if d]
    return out


def uncovered_headers(headers: Iterable[str], tree: Path, depfiles: Iterable[Path]) -> List[str]:
    """Changed headers that no compiled unit included."""
    seen = set()
    for d in depfiles:
        if d.is_file():
            seen.update(os.path.realpath(p) for p in parse_depfile(d.read_text()))
    return [h for h in headers if os.path.realpath(Path(tree) / h) not in seen]


def _warnings_in(output: str, changed: Iterable[str]) -> List[str]:
    names = [Path(c).name for c in changed]
    return [line for line in output.splitlines()
            if "warning" in line.lower() and any(n in line for n in names)]


class Reuse:
    """Records of successful compiles, ccache's "direct mode" without the objects (nothing is
    linked): a unit whose command line (work directory normalised), compiler and every file its
    last successful compile read (from the depfile) are byte-identical is not compiled again.
    Any difference, a missing record or ``enabled=False`` compiles it."""

    def __init__(self, root: Path, work: Path, enabled: bool = True):
        self.root, self.work, self.enabled = Path(root), str(Path(work)), enabled
        self._compilers: Dict[str, str] = {}

    def _norm(self, s: str) -> str:
        return s.replace(self.work, "<work>")

    def _denorm(self, s: str) -> str:
        return s.replace("<work>", self.work)

    def compiler_id(self, exe: str) -> str:
        if exe not in self._compilers:
            r = subprocess.run([exe, "--version"], capture_output=True, text=True)
            binary = Path(os.path.realpath(shutil.which(exe) or exe))
            self._compilers[exe] = hashlib.sha256(
                (r.stdout + _sha_file(binary)).encode()).hexdigest()
        return self._compilers[exe]

    def _record(self, rel: str) -> Path:
        return self.root / (rel.replace("/", "__") + ".json")

    def _key(self, cmd: Sequence[str]) -> Dict[str, str]:
        return {"cmd": self._norm(json.dumps(list(cmd))), "compiler": self.compiler_id(cmd[0])}

    def hit(self, rel: str, cmd: Sequence[str]) -> Optional[str]:
        if not self.enabled:
            return None
        try:
            rec = json.loads(self._record(rel).read_text())
        except (OSError, ValueError):
            return None
        if {k: rec.get(k) for k in ("cmd", "compiler")} != self._key(cmd):
            return None
        for path, digest in rec.get("deps", {}).items():
            f = Path(self._denorm(path))
            if not f.is_file() or _sha_file(f) != digest:
                return None
        return rec.get("when", "?")

    def store(self, rel: str, cmd: Sequence[str], depfile: Path) -> None:
        deps = {}
        for d in parse_depfile(depfile.read_text()):
            f = Path(d) if os.path.isabs(d) else depfile.parent / d
            deps[self._norm(os.path.realpath(f))] = _sha_file(f)
        rec = {**self._key(cmd), "when": time.strftime("%Y-%m-%d %H:%M:%S"), "deps": deps}
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._record(rel).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=0))
        os.replace(tmp, self._record(rel))


def _sha_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _tool(kind: str) -> str:
    return "nvcc" if kind == "nvcc" else f"g++ ({'torch_cuda' if kind == 'cuda-cpp' else 'torch_cpu'})"


def compile_units(units: List[Tuple[str, str]], paths: Paths, std: str, jobs: int,
                  changed: List[str], reuse: Reuse, log=print,
                  record_suffix: str = "") -> Tuple[bool, Dict[str, Path]]:
    """Compile ``units``: (all compiled, {unit: its depfile} of those that compiled or were
    reused). ``record_suffix`` keeps the records of another patch of the same units (the
    core's: ``@core``) apart from the whole stack's."""
    paths.objects.mkdir(parents=True, exist_ok=True)

    def one(unit):
        rel, kind = unit
        cmd = compile_command(rel, kind, paths, std)
        t0 = time.time()
        when = reuse.hit(rel + record_suffix, cmd)
        if when:
            return rel, kind, cmd, None, when, time.time() - t0
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=paths.objects)
        dep = paths.objects / (rel.replace("/", "__") + ".d")
        if r.returncode == 0 and dep.is_file():
            reuse.store(rel + record_suffix, cmd, dep)
        return rel, kind, cmd, r, None, time.time() - t0

    ok = True
    reused = []
    compiled = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        # the .cu units first: they take longest
        order = sorted(units, key=lambda u: u[1] != "nvcc")
        for rel, kind, cmd, r, when, dt in ex.map(one, order):
            tool = _tool(kind)
            if r is None:
                reused.append(rel)
                log(f"OK      {tool}: {rel} (inputs, flags and compiler identical to a "
                    f"successful compile at {when}: not recompiled)")
            elif r.returncode == 0:
                compiled.append(rel)
                log(f"OK      {tool}: {rel} ({dt:.0f} s)")
                for w in _warnings_in(r.stdout + r.stderr, changed):
                    log(f"        warning: {w}")
            else:
                ok = False
                log(f"FAILED  {tool}: {rel} ({dt:.0f} s)\n  command: {' '.join(cmd)}")
                log("\n".join("  " + line for line in (r.stdout + r.stderr).strip().splitlines()[-60:]))
    # a reused unit's depfile is its record's: the headers it covers are the ones it read then
    depfiles = {rel: paths.objects / (rel.replace("/", "__") + ".d") for rel in compiled}
    for rel in reused:
        rec = json.loads(reuse._record(rel + record_suffix).read_text())
        dep = paths.objects / (rel.replace("/", "__") + ".reused.d")
        dep.write_text("reused: " + " ".join(reuse._denorm(p) for p in rec["deps"]) + "\n")
        depfiles[rel] = dep
    return ok, depfiles


def units_to_compile_again(units: Iterable[Tuple[str, str]], differing: Iterable[str],
                           depfiles: Mapping[str, Path], tree: Path) -> List[Tuple[str, str]]:
    """The units of a second patch of the same tree (the core's) that its first compile (the
    whole stack's) does not stand for: a unit that differs itself, one the first did not compile
    successfully, and one whose first compile read a file of ``differing`` (the paths whose
    content differs between the two patched trees, or that only one of them has)."""
    differing = set(differing)
    differ = {os.path.realpath(Path(tree) / rel) for rel in differing}
    again = []
    for rel, kind in units:
        dep = depfiles.get(rel)
        if rel in differing or dep is None or not Path(dep).is_file():
            again.append((rel, kind))
            continue
        read = {os.path.realpath(p if os.path.isabs(p) else Path(dep).parent / p)
                for p in parse_depfile(Path(dep).read_text())}
        if read & differ:
            again.append((rel, kind))
    return again


def compiled_units(changed: Iterable[str]) -> List[Tuple[str, str]]:
    """(path, kind) of the changed files that are translation units."""
    return [(c, k) for c in changed for k in [unit_kind(c)] if k in ("nvcc", "cpp", "cuda-cpp")]


def compile_core(copy: Path, work: Path, paths: Paths, std: str, jobs: int,
                 whole_depfiles: Mapping[str, Path], reuse: Reuse, log=print) -> int:
    """Step 5: the copy patched with the stack's core alone (``detgrid patch --upto core``),
    each unit whose whole-stack compile does not stand for the core's compiled again, the core's
    changed headers covered. EXIT_OK or EXIT_COMPILE."""
    core = stack.CORE
    t0 = time.time()
    changed, differing = repatch_upto(copy, core, work / f"detgrid-{core}.patch", log)
    log(f"{core}: the copy reset and patched with `detgrid patch --upto {core}` "
        f"({time.time() - t0:.0f} s); differing from the whole stack: {', '.join(differing)}")
    check_core_files(copy, core)
    units = compiled_units(changed)
    headers = [c for c in changed if unit_kind(c) == "header"]
    again = units_to_compile_again(units, differing, whole_depfiles, copy)
    standing = {rel: whole_depfiles[rel] for rel, kind in units if (rel, kind) not in again}
    for rel, kind in units:
        if rel in standing:
            log(f"OK      {_tool(kind)}: {rel} ({core}: its whole-stack compile read nothing "
                "that differs, and stands)")
    ok, depfiles = compile_units(again, dataclasses.replace(paths, objects=work / f"obj-{core}"),
                                 std, jobs, changed, reuse, log, record_suffix=f"@{core}")
    status = EXIT_OK if ok else EXIT_COMPILE
    if ok:
        lost = uncovered_headers(headers, copy, [*standing.values(), *depfiles.values()])
        if lost:
            log(f"FAILED  {core}: changed headers that no compiled unit includes: {', '.join(lost)}")
            status = EXIT_COMPILE
        else:
            log(f"{core}: headers covered: {', '.join(headers) or '(none changed)'}")
    log(f"{core}: {'compiled' if status == EXIT_OK else 'compile check FAILED'}: "
        f"{len(again)} of its {len(units)} units needed a compile of their own "
        f"({time.time() - t0:.0f} s)")
    return status


# --------------------------------------------------------------------------- main


def run(tree: Path, work: Path, jobs: int, reuse_ok: bool = True, log=print,
        core: bool = True) -> int:
    t_start = time.time()
    tree = Path(tree).resolve()
    if not (tree / "version.txt").is_file():
        raise SetupError(f"{tree}: no version.txt (not a PyTorch source tree)")
    version = (tree / "version.txt").read_text().strip()
    tc = toolchain_for(version)
    cache = cache_dir()
    log(f"PyTorch {version} at {tree}; toolchain: CUDA {tc.cuda}, -std={tc.cxx_std}")

    t0 = time.time()
    toolchain = ensure_toolchain(tc, cache, log)
    pydeps = ensure_python_deps(cache)
    log(f"toolchain: {toolchain} ({time.time() - t0:.0f} s)")

    t0 = time.time()
    copy = work / "pytorch"
    changed = copy_and_patch(tree, copy, log)
    log(f"patched copy: {copy} ({time.time() - t0:.0f} s); changed: {', '.join(changed)}")
    top = stack.UPSTREAM_NAMES[-1]
    log(f"whole stack ({', '.join(stack.UPSTREAM_NAMES)}): "
        f"{', '.join(check_core_files(copy, top))} as the stack up to {top} has it")

    gen = generate_aten(copy, cache, pydeps, log)
    build = work / "build"
    configure_headers(copy, build)

    units = compiled_units(changed)
    headers = [c for c in changed if unit_kind(c) == "header"]
    if not units:
        raise SetupError("the patch changed no translation unit: nothing to compile")
    paths = Paths(tree=copy, build=build, gen=gen, toolchain=toolchain, objects=work / "obj",
                  compat=compat_flags(copy, version))
    if paths.compat:
        log(f"{', '.join(COMPAT_UNITS)}: with {' '.join(paths.compat)} ahead of the tree's headers "
            f"(PyTorch {version} predates {COMPAT_SINCE[0]}.{COMPAT_SINCE[1]}'s GridSampler.cuh "
            "helpers that the core calls; the upstream patch targets main, which has them)")
    log(f"compiling {len(units)} units, {jobs} at a time: {', '.join(u for u, _ in units)}")
    reuse = Reuse(cache / "intree-compiled", work, enabled=reuse_ok)
    ok, depfiles = compile_units(units, paths, tc.cxx_std, jobs, changed, reuse, log)
    status = EXIT_OK if ok else EXIT_COMPILE
    if ok:
        lost = uncovered_headers(headers, copy, depfiles.values())
        if lost:
            log(f"FAILED  changed headers that no compiled unit includes: {', '.join(lost)}")
            status = EXIT_COMPILE
        else:
            log(f"headers covered: {', '.join(headers) or '(none changed)'}")
    core_status = None
    if core:
        core_status = compile_core(copy, work, paths, tc.cxx_std, jobs, depfiles, reuse, log)
        status = max(status, core_status)
    log(f"{'all compiled' if status == EXIT_OK else 'compile check FAILED'}: {len(units)} units "
        f"against PyTorch {version}, nvcc {tc.cuda}"
        f"{'' if core_status is None else ', the whole stack and its core alone'}"
        f" ({time.time() - t_start:.0f} s)")
    return status


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detgrid.kit.intree_compile", description=__doc__.split("\n")[0])
    ap.add_argument("--pytorch", required=True, metavar="TREE", help="PyTorch source tree (not modified)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    ap.add_argument("--no-reuse", action="store_true",
                    help="compile every unit even if an identical compile succeeded before")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary "
                    "directory); its copy is left patched with the core alone")
    ap.add_argument("--no-core", action="store_true",
                    help="compile the whole stack only, not also its core alone (detgrid patch "
                    "--upto core)")
    args = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    try:
        if args.keep:
            work = Path(args.keep).resolve()
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
            return run(Path(args.pytorch), work, args.jobs, not args.no_reuse, log,
                       core=not args.no_core)
        with tempfile.TemporaryDirectory(prefix="detgrid-intree-") as tmp:
            return run(Path(args.pytorch), Path(tmp), args.jobs, not args.no_reuse, log,
                       core=not args.no_core)
    except SetupError as e:
        print(f"intree compile check: cannot run: {e}", file=sys.stderr, flush=True)
        return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
