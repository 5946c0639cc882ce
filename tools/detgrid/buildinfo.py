"""What this detgrid build was compiled against, and the guard that refuses
to load it under any other torch.

setup.py writes detgrid/_build_info.py (not in git) at build time. A C++
extension is bound to the exact torch it was compiled with: under another
release it fails with an undefined symbol at best, and at worst it loads and
registers kernels whose calling conventions no longer match. So
detgrid.ops checks the running torch against the record before it loads
detgrid._C, and refuses in one line.
"""

import importlib
from types import ModuleType
from typing import Optional


def recorded() -> Optional[ModuleType]:
    """detgrid._build_info, or None in a tree that setup.py has not built."""
    try:
        return importlib.import_module("detgrid._build_info")
    except ImportError:
        return None


def mismatch(built_torch: str, built_cuda: Optional[str], torch_version: str,
             torch_cuda: Optional[str]) -> Optional[str]:
    """The refusal for a build made against another torch, or None when it matches."""
    if (built_torch, built_cuda) == (torch_version, torch_cuda):
        return None
    return (f"detgrid was built for torch {built_torch} ({_cuda(built_cuda)}) but torch "
            f"{torch_version} ({_cuda(torch_cuda)}) is running: reinstall detgrid against this "
            f"torch (pip install --no-build-isolation --force-reinstall --no-deps <detgrid "
            f"source>) or install torch=={built_torch}")


def _cuda(version: Optional[str]) -> str:
    return f"CUDA {version}" if version else "CPU only"


def check(torch_module=None) -> None:
    """Raises ImportError, one line, when the running torch is not the recorded one."""
    info = recorded()
    if info is None:
        return
    import torch

    torch_module = torch_module or torch
    problem = mismatch(info.TORCH_VERSION, info.TORCH_CUDA, torch_module.__version__,
                       torch_module.version.cuda)
    if problem:
        raise ImportError(problem)


def summary() -> str:
    """One line for `detgrid --version`, readable without loading the extension."""
    info = recorded()
    if info is None:
        return "build: not recorded (source tree without a setup.py build)"
    kernels = (f"CUDA kernels for {info.CUDA_ARCH_LIST}, nvcc {info.NVCC_VERSION}"
               if info.CUDA_KERNELS else "no CUDA kernels")
    return f"built for torch {info.TORCH_VERSION} ({_cuda(info.TORCH_CUDA)}); {kernels}"
