"""Builds detgrid: the Python package in tools/detgrid and its extension.

The extension compiles the ATen-style sources in aten_kernels/ against the
installed torch: always the host executor, and the CUDA kernels too when
torch has CUDA and nvcc is found (DETGRID_CPU_ONLY=1 skips them).
Build it against the torch you run: pip install --no-build-isolation .
"""

import os
import shlex

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ATEN_SRC = os.path.join("aten_kernels", "aten", "src")
EXTENSION = os.path.join("aten_kernels", "extension")
CUDA_SOURCE = os.path.join(ATEN_SRC, "ATen", "native", "cuda", "GridSamplerDeterministic.cu")

# The host side must not contract a * b + c into an FMA: the executor has to
# round exactly like the CUDA kernels, which use explicit _rn intrinsics.
CXX_FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]
# Extra host compiler and linker flags, for instrumented builds such as
# .ci/sanitize.sh's (-fsanitize=...). They come after Python's own CFLAGS,
# so they can undo one of them (-fno-wrapv).
EXTRA_CXX_FLAGS = shlex.split(os.environ.get("DETGRID_EXTRA_CFLAGS", ""))
EXTRA_LINK_FLAGS = shlex.split(os.environ.get("DETGRID_EXTRA_LDFLAGS", ""))
NVCC_FLAGS = [
    "-O3",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-DCUB_WRAPPED_NAMESPACE=at_cuda_detail",
]


def build_cuda() -> bool:
    if os.environ.get("DETGRID_CPU_ONLY") == "1":
        return False
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def cuda_library_includes():
    """Header folders of the CUDA libraries pip installed beside torch, for a
    toolkit that lacks them: ATen's CUDA headers include cusparse.h and
    cublas_v2.h, which a runtime-only toolkit does not ship. They are searched
    after everything else (-idirafter), so the toolkit's own runtime headers
    win over the copies in those folders."""
    toolkit_include = os.path.join(cpp_extension.CUDA_HOME, "include")
    if os.path.exists(os.path.join(toolkit_include, "cusparse.h")):
        return []
    try:
        import nvidia
    except ImportError:
        return []
    return [
        os.path.join(root, entry, "include")
        for root in nvidia.__path__
        for entry in sorted(os.listdir(root))
        if os.path.exists(os.path.join(root, entry, "include", "cusparse.h"))
    ]


def extension():
    sources = [
        os.path.join(EXTENSION, name)
        for name in ("register.cpp", "autograd.cpp", "checks.cpp",
                     "GridSamplerDeterministicCPU.cpp")
    ]
    include_dirs = [os.path.abspath(ATEN_SRC)]
    if not build_cuda():
        return cpp_extension.CppExtension(
            "detgrid._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": CXX_FLAGS + EXTRA_CXX_FLAGS},
            extra_link_args=EXTRA_LINK_FLAGS,
        )
    late_includes = [f"-idirafter{folder}" for folder in cuda_library_includes()]
    return cpp_extension.CUDAExtension(
        "detgrid._C",
        sources + [os.path.join(EXTENSION, "cuda_ops.cpp"), CUDA_SOURCE],
        include_dirs=include_dirs,
        define_macros=[("DETGRID_WITH_CUDA", None)],
        extra_link_args=EXTRA_LINK_FLAGS,
        extra_compile_args={
            "cxx": CXX_FLAGS + late_includes + EXTRA_CXX_FLAGS,
            "nvcc": NVCC_FLAGS + [f"-Xcompiler={flag}" for flag in late_includes],
        },
    )


setup(
    name="detgrid",
    version="0.1.0",
    description="Deterministic CUDA backward for torch.nn.functional.grid_sample",
    package_dir={"": "tools"},
    packages=find_packages("tools"),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    entry_points={"console_scripts": ["detgrid = detgrid.cli:main"]},
    python_requires=">=3.9",
)
