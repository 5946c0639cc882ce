"""Which CUDA compiler and architectures a detgrid build uses.

One answer for setup.py and for `detgrid build --dry-run`, so that the dry
run says what the build will really do. Standard library only at import:
setup.py loads this file by path, before the package (whose __init__ needs
the compiled extension) can be imported; torch is passed in or imported
lazily.

The toolkit is the first of:
  1. $CUDA_HOME (or $CUDA_PATH), as torch.utils.cpp_extension reads it;
  2. the nvcc on PATH;
  3. the pip toolkit for torch's CUDA major: site-packages/nvidia/cu<major>
     with bin/nvcc, from the nvidia-cuda-nvcc wheel (13.x wheels carry the
     whole compiler driver; the 12.x ones do not);
  4. /usr/local/cuda.
The pip toolkit comes before /usr/local/cuda because installing it is an
explicit choice, while /usr/local/cuda is only a guess (and may hold a
toolkit of another major than torch's).

The architectures are the first of:
  1. $TORCH_CUDA_ARCH_LIST;
  2. those of the GPUs visible here, with PTX for the newest, as
     torch.utils.cpp_extension does when the variable is unset: one or two
     architectures build in minutes where torch's whole list takes many;
  3. with no GPU visible (a login node, a Docker build), the ones the
     installed torch was built for (torch.cuda.get_arch_list(), no GPU
     needed), with PTX for the newest so that later GPUs can JIT it; else
     DEFAULT_ARCHS. (torch's own fallback fails there with an IndexError.)
"""

import dataclasses
import glob
import os
import re
import shutil
import subprocess
from typing import Callable, Iterable, List, Mapping, Optional, Tuple

SYSTEM_HOME = "/usr/local/cuda"

# For a torch that reports no architectures: what each CUDA major supports
# of the data-centre and desktop GPUs torch's wheels target.
DEFAULT_ARCHS = {
    "12": "7.5;8.0;8.6;8.9;9.0+PTX",
    "13": "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
}

# The wheels that make up the pip toolkit. nvidia-cuda-nvcc pulls crt, nvvm
# and the runtime unpinned; pinning all of them to torch's CUDA minor keeps
# headers, front end and back end of one release.
PIP_TOOLKIT_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl",
                      "nvidia-cuda-runtime")
PIP_TOOLKIT_MIN_MAJOR = 13


@dataclasses.dataclass(frozen=True)
class Toolkit:
    home: str
    source: str          # how it was found, for messages: "CUDA_HOME", "PATH", "pip", ...
    version: Optional[str] = None  # "13.0", from nvcc --version; None if nvcc did not run

    @property
    def nvcc(self) -> str:
        return os.path.join(self.home, "bin", "nvcc")

    def describe(self) -> str:
        version = f"CUDA {self.version}" if self.version else "version unknown"
        return f"{self.nvcc} ({version}; found via {self.source})"


def cuda_major(version: str) -> str:
    return version.split(".")[0]


def nvcc_version(nvcc: str, run: Callable = subprocess.run) -> Optional[str]:
    """'13.0' from `nvcc --version` ("Cuda compilation tools, release 13.0, ..."), or None."""
    try:
        out = run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out or "")
    return match.group(1) if match else None


def nvcc_home(nvcc: str, run: Callable = subprocess.run) -> str:
    """The toolkit root of the nvcc that `nvcc` runs, as nvcc itself reports
    it (`-dryrun` prints its _HERE_): an nvcc on PATH may be a wrapper script
    (/usr/local/bin/nvcc exec-ing /usr/local/cuda-13.0/bin/nvcc), so the
    folder above it is not necessarily the toolkit. Falls back to that folder."""
    fallback = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    try:
        out = run([nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                  capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return fallback
    match = re.search(r"^#\$ _HERE_=(.+)$", (out.stderr or "") + (out.stdout or ""), re.M)
    return os.path.dirname(match.group(1).strip()) if match else fallback


def nvidia_package_roots() -> List[str]:
    """The folders of the `nvidia` namespace package that pip's CUDA wheels install into."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations or []) if spec else []


def pip_toolkit_homes(major: str, roots: Optional[Iterable[str]] = None) -> List[str]:
    """nvidia/cu<major> folders that hold the pip compiler (bin/nvcc)."""
    roots = nvidia_package_roots() if roots is None else roots
    homes = [os.path.join(root, f"cu{major}") for root in roots]
    return [home for home in homes if os.path.isfile(os.path.join(home, "bin", "nvcc"))]


def find_toolkit(torch_cuda: str, env: Mapping[str, str] = os.environ,
                 which: Callable[[str], Optional[str]] = shutil.which,
                 pip_homes: Optional[List[str]] = None,
                 system_home: str = SYSTEM_HOME,
                 version_of: Callable[[str], Optional[str]] = nvcc_version,
                 home_of: Callable[[str], str] = nvcc_home) -> Optional[Toolkit]:
    """The toolkit to build with (the module docstring gives the order), or None."""
    home, source = None, None
    if env.get("CUDA_HOME") or env.get("CUDA_PATH"):
        home, source = env.get("CUDA_HOME") or env.get("CUDA_PATH"), "CUDA_HOME"
    elif which("nvcc"):
        home, source = home_of(which("nvcc")), "PATH"
    else:
        homes = pip_toolkit_homes(cuda_major(torch_cuda)) if pip_homes is None else pip_homes
        if homes:
            home, source = homes[0], "pip"
        elif os.path.isdir(system_home):
            home, source = system_home, system_home
    if home is None:
        return None
    nvcc = os.path.join(home, "bin", "nvcc")
    return Toolkit(home, source, version_of(nvcc) if os.path.isfile(nvcc) else None)


# The CUDA headers the core's host build needs (hostify's prelude).
HOST_CUDA_HEADERS = ("cuda_runtime.h", "cuda_bf16.h", "cuda_fp16.h")


class NoCudaHeaders(RuntimeError):
    """The host build of the core found no CUDA headers."""


def host_cuda_include(env: Mapping[str, str] = os.environ,
                      roots: Optional[Iterable[str]] = None,
                      system_home: str = SYSTEM_HOME) -> str:
    """The include folder whose CUDA runtime headers the host build compiles
    against (declarations and types only: nothing of CUDA is linked): of
    $CUDA_HOME, the system toolkit, pip's CUDA runtime wheels, the first that
    has them all."""
    roots = nvidia_package_roots() if roots is None else roots
    candidates = [os.path.join(h, "include") for h in
                  (env.get("CUDA_HOME") or env.get("CUDA_PATH"), system_home) if h]
    for root in roots:
        candidates += sorted(glob.glob(os.path.join(root, "cu*", "include")), reverse=True)
    for folder in candidates:
        if all(os.path.isfile(os.path.join(folder, h)) for h in HOST_CUDA_HEADERS):
            return folder
    raise NoCudaHeaders(
        "detgrid: the host build needs CUDA's runtime headers (cuda_runtime.h, cuda_bf16.h), "
        "and none were found in $CUDA_HOME, " + system_home + " or pip's nvidia packages; "
        'fix: pip install "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"')


def cpu_has_fma(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has fused multiply-add (x86's fma flag), so that the
    host build can contract a * b + c as nvcc does."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            return any(line.startswith("flags") and " fma " in f" {line.split(':', 1)[-1]} "
                       for line in f)
    except OSError:
        return False


def pip_toolkit_command(torch_cuda: str) -> str:
    """The one command that installs the pip toolkit matching torch's CUDA release."""
    pins = " ".join(f'"{wheel}=={torch_cuda}.*"' for wheel in PIP_TOOLKIT_WHEELS)
    return f"pip install {pins}"


def fixes(torch_cuda: str) -> str:
    major = cuda_major(torch_cuda)
    ways = []
    if int(major) >= PIP_TOOLKIT_MIN_MAJOR:
        ways.append(f"install the CUDA {torch_cuda} compiler from PyPI: "
                    f"{pip_toolkit_command(torch_cuda)}")
    else:
        ways.append(f"install a CUDA {major}.x toolkit (PyPI's CUDA {major} nvcc wheels have no "
                    "compiler driver)")
    ways.append(f"or point CUDA_HOME at a CUDA {major}.x toolkit")
    ways.append("or set DETGRID_CPU_ONLY=1 to build without CUDA kernels "
                "(detgrid.enable() then has nothing to route on CUDA)")
    return "Fix: " + "; ".join(ways) + "; then rerun the install."


def unusable(toolkit: Optional[Toolkit], torch_version: str, torch_cuda: str) -> Optional[str]:
    """Why the CUDA kernels cannot be built with `toolkit` for this torch, with the fix; or None."""
    head = f"detgrid: torch {torch_version} has CUDA {torch_cuda}, but "
    if toolkit is None:
        return (head + "no CUDA compiler was found (CUDA_HOME unset, no nvcc on PATH, no pip "
                f"toolkit nvidia/cu{cuda_major(torch_cuda)}, no {SYSTEM_HOME}). "
                + fixes(torch_cuda))
    if not os.path.isfile(toolkit.nvcc):
        return head + f"{toolkit.nvcc} does not exist ({toolkit.source}). " + fixes(torch_cuda)
    if toolkit.version is None:
        return head + f"{toolkit.nvcc} --version did not run. " + fixes(torch_cuda)
    if cuda_major(toolkit.version) != cuda_major(torch_cuda):
        return (head + f"{toolkit.describe()} is CUDA {cuda_major(toolkit.version)}: kernels "
                "built with it would not load. " + fixes(torch_cuda))
    return None


def arch_of(torch_arch: str) -> Optional[str]:
    """'sm_90' -> '9.0', 'sm_100a' -> '10.0a', 'sm_120' -> '12.0'; None for 'compute_*'."""
    match = re.fullmatch(r"sm_(\d+?)(\d)(a?)", torch_arch)
    return f"{match.group(1)}.{match.group(2)}{match.group(3)}" if match else None


def _arch_key(arch: str) -> Tuple[int, int, str]:
    major, minor = arch.split(".")
    return int(major), int(minor.rstrip("a")), minor[-1:] if minor.endswith("a") else ""


def _with_ptx_for_the_newest(archs: Iterable[str]) -> str:
    ordered = sorted(set(archs), key=_arch_key)
    return ";".join(ordered[:-1] + [ordered[-1] + "+PTX"])


def arch_list(env: Mapping[str, str], torch_arch_list: List[str], torch_cuda: str,
              gpu_archs: Iterable[str] = ()) -> Tuple[str, str]:
    """(TORCH_CUDA_ARCH_LIST to build with, where it came from and why).
    `gpu_archs` are the visible GPUs' 'major.minor' (visible_gpu_archs)."""
    if env.get("TORCH_CUDA_ARCH_LIST"):
        return env["TORCH_CUDA_ARCH_LIST"], "TORCH_CUDA_ARCH_LIST"
    torch_archs = [a for a in map(arch_of, torch_arch_list) if a]
    gpu_archs = [_within(arch, torch_archs) for arch in gpu_archs]
    if gpu_archs:
        return (_with_ptx_for_the_newest(gpu_archs),
                f"the GPUs visible here ({', '.join(sorted(set(gpu_archs), key=_arch_key))}), "
                "PTX for the newest; TORCH_CUDA_ARCH_LIST unset")
    if torch_archs:
        return (_with_ptx_for_the_newest(torch_archs),
                "the architectures torch was built for, PTX for the newest: no GPU visible "
                "here and TORCH_CUDA_ARCH_LIST unset")
    major = cuda_major(torch_cuda)
    return DEFAULT_ARCHS.get(major, DEFAULT_ARCHS["13"]), f"detgrid's default for CUDA {major}"


def _within(gpu_arch: str, torch_archs: List[str]) -> str:
    """A GPU newer than torch's newest architecture gets that one (its PTX
    runs there), as torch.utils.cpp_extension caps it: torch's own kernels
    cannot run there natively either."""
    newest = max(torch_archs, key=_arch_key, default=None)
    return newest if newest and _arch_key(gpu_arch) > _arch_key(newest) else gpu_arch


def visible_gpu_archs(torch) -> List[str]:
    """'major.minor' of every CUDA GPU visible here; [] without one (or without a CUDA torch)."""
    if not torch.cuda.is_available():
        return []
    return ["%d.%d" % torch.cuda.get_device_capability(index)
            for index in range(torch.cuda.device_count())]


def torch_arch_list(torch) -> List[str]:
    """The sm_XY list torch was compiled for. torch.cuda.get_arch_list() needs
    no GPU in current releases; where it answers [] for want of one, the
    compiled flags say the same."""
    archs = torch.cuda.get_arch_list()
    if not archs and hasattr(torch._C, "_cuda_getArchFlags"):
        archs = (torch._C._cuda_getArchFlags() or "").split()
    return list(archs)


def link_dir_for_cudart(home: str, scratch: str) -> Optional[str]:
    """A folder to pass as -L so that -lcudart links, or None when the toolkit's own does.

    The pip runtime wheel ships only libcudart.so.<major> (no unversioned
    libcudart.so, which a linker needs for -lcudart), so point a libcudart.so
    in `scratch` at it; the result still records libcudart.so.<major>, the
    soname torch itself loads."""
    for lib in ("lib64", "lib"):
        if os.path.exists(os.path.join(home, lib, "libcudart.so")):
            return None
    versioned = sorted(glob.glob(os.path.join(home, "lib*", "libcudart.so.*")))
    if not versioned:
        return None
    os.makedirs(scratch, exist_ok=True)
    link = os.path.join(scratch, "libcudart.so")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(versioned[0], link)
    return scratch


class Unusable(RuntimeError):
    """torch has CUDA, and no compiler fits: the message says why and how to fix it."""


@dataclasses.dataclass(frozen=True)
class CudaPlan:
    """What a build does about CUDA: kernels with `toolkit` for `archs`, or
    the host builds only (toolkit None) for the reason in `origin`."""
    toolkit: Optional[Toolkit]
    archs: Optional[str]
    origin: str

    def describe(self) -> str:
        if self.toolkit is None:
            return f"host builds only ({self.origin})"
        return f"CUDA kernels with {self.toolkit.describe()} for {self.archs} ({self.origin})"


def cuda_plan(torch, env: Mapping[str, str] = os.environ,
              find: Optional[Callable[[str], Optional[Toolkit]]] = None) -> CudaPlan:
    """The decision setup.py acts on and `detgrid build --dry-run` reports.
    Raises Unusable when torch has CUDA and no compiler fits: a quietly
    CPU-only build would leave detgrid.enable() nothing to route, and
    training would fail with the very error detgrid exists to remove."""
    if env.get("DETGRID_CPU_ONLY") == "1":
        return CudaPlan(None, None, "DETGRID_CPU_ONLY=1")
    if torch.version.cuda is None:
        return CudaPlan(None, None, f"torch {torch.__version__} has no CUDA")
    toolkit = (find or find_toolkit)(torch.version.cuda)
    problem = unusable(toolkit, torch.__version__, torch.version.cuda)
    if problem:
        raise Unusable(problem)
    archs, origin = arch_list(env, torch_arch_list(torch), torch.version.cuda,
                              visible_gpu_archs(torch))
    return CudaPlan(toolkit, archs, origin)
