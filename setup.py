"""Builds detgrid: the Python packages in tools/detgrid (the runtime, kit, bench) and the extension.

The extension compiles the ATen-style sources in aten_kernels/ against the
installed torch: always their host builds (hostify), and the CUDA kernels
too when torch has CUDA. Build it against the torch you run:

    pip install --no-build-isolation .

No GPU is needed. tools/detgrid/kit/toolchain.py picks the CUDA compiler
($CUDA_HOME, nvcc on PATH, pip's nvidia-cuda-nvcc for torch's CUDA major,
/usr/local/cuda) and the architectures ($TORCH_CUDA_ARCH_LIST, else the
visible GPUs', else those torch was built for), and the progress line says
which and why. A CUDA torch without a usable compiler fails the
install with the reason and the fix; DETGRID_CPU_ONLY=1 is the explicit
opt-out. The build records the torch it was made for in
detgrid/_build_info.py, and detgrid refuses to load under another.
"""

import concurrent.futures
import importlib.util
import os
import shlex
import subprocess
import sys

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
EXTENSION = os.path.join("aten_kernels", "extension")
# The upstream core: the file the patch adds to ATen, built for CUDA by nvcc
# and for the host from the same bytes (hostify).
CORE_SOURCE = os.path.join(
    "aten_kernels", "aten", "src", "ATen", "native", "cuda",
    "GridSamplerDeterministic.cu")
# The extension's grad_grid (Note [grad_grid alone]): plain CUDA, built like the
# core (nvcc, and hostify for the host) but with every operation rounded on its own,
# on both (-fmad=false, -ffp-contract=off), so that the host gives the GPU's bits.
GRID_GRADIENT_SOURCE = os.path.join(EXTENSION, "GridGradient.cu")
GRID_GRADIENT_NVCC_FLAGS = ["-fmad=false"]
HOSTIFY = os.path.join("aten_kernels", "hostify")
# The coordinate helpers torch 2.15 added to ATen/native/cuda/GridSampler.cuh,
# for older torch: ahead of torch's headers wherever the core is compiled.
COMPAT_INCLUDE = os.path.join("aten_kernels", "compat", "include")
# Where the core's file as each prefix of the stack has it is written.
CORE_BUILDS_DIR = os.path.join("build", "detgrid-core-builds")
BUILD_INFO = os.path.join(ROOT, "tools", "detgrid", "_build_info.py")
VERSION = "0.1.0"

# The extension is built as C++20 on every torch, on both compilers: one
# language for the kernels whatever the release. torch.utils.cpp_extension
# appends its own -std only to a command line that holds none, and its own is
# -std=c++17 up to torch 2.11 (C++20 from 2.12, pytorch#176659), so it is
# asked for here, spelled -std=... exactly as cpp_extension looks for it.
# .ci/old_torch_compile.sh checks the command lines of torch 2.11.0 and 2.6.0.
# The glue does no floating-point work of its own; the kernels' host builds
# take flags of their own (BuildWithHostify).
CXX_FLAGS = ["-std=c++20", "-O2", "-fno-fast-math"]
# Extra host compiler and linker flags, for instrumented builds such as
# .ci/sanitize.sh's (-fsanitize=...). They come after Python's own CFLAGS,
# so they can undo one of them (-fno-wrapv).
EXTRA_CXX_FLAGS = shlex.split(os.environ.get("DETGRID_EXTRA_CFLAGS", ""))
EXTRA_LINK_FLAGS = shlex.split(os.environ.get("DETGRID_EXTRA_LDFLAGS", ""))
NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-DCUB_WRAPPED_NAMESPACE=at_cuda_detail",
]


def load_toolchain():
    """tools/detgrid/kit/toolchain.py, loaded by path: importing the detgrid
    package would load the extension this script is about to build."""
    path = os.path.join(ROOT, "tools", "detgrid", "kit", "toolchain.py")
    spec = importlib.util.spec_from_file_location("detgrid_toolchain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


toolchain = load_toolchain()


def load_by_path(name, *parts):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *parts))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def core_builds():
    """[(build, text)]: the core's file as each build level= runs has it
    (detgrid.levels.CORE_BUILDS): the core, then each prefix of the stack that
    ends with a speed level, its levels' diffs applied in order."""
    levels = load_by_path("detgrid_levels", "tools", "detgrid", "levels.py")
    textdiff = load_by_path("detgrid_textdiff", "tools", "detgrid", "kit", "textdiff.py")
    name = os.path.basename(CORE_SOURCE)
    with open(os.path.join(ROOT, CORE_SOURCE), encoding="utf-8") as f:
        files = {name: f.read()}
    builds = [(levels.CORE, files[name])]
    for part in levels.UPSTREAM_STACK:
        if part.speed_level:
            files = textdiff.apply_folders(
                files, [os.path.join(ROOT, levels.LEVELS_ROOT, part.name)])
            if set(files) != {name}:
                sys.exit(f"detgrid: level {part.name} adds {sorted(set(files) - {name})}, "
                         "which setup.py does not build yet")
            builds.append((part.name, files[name]))
    return builds


def build_symbol(build):
    """The suffix of a build's names: launch_grid_sampler_backward_deterministic_kernel
    becomes ..._kernel for the core's CUDA build and ..._<suffix> otherwise."""
    return build.replace("-", "_")


def cuda_level_units():
    """The CUDA units of the speed levels' builds: each includes its prefix's
    file, written under build/, with the launcher renamed after the build (the
    core's own file is compiled as it is)."""
    folder = os.path.join(ROOT, CORE_BUILDS_DIR)
    os.makedirs(folder, exist_ok=True)
    units = []
    for build, text in core_builds()[1:]:
        source = os.path.join(folder, f"GridSamplerDeterministic.{build}.cu")
        unit = os.path.join(folder, f"cuda_{build_symbol(build)}.cu")
        write_if_changed(source, text)
        write_if_changed(unit, (
            "// Generated by setup.py: the CUDA build of the core's file at level "
            f"{build}.\n#define launch_grid_sampler_backward_deterministic_kernel "
            f"launch_grid_sampler_backward_deterministic_kernel_{build_symbol(build)}\n"
            f'#include "{os.path.basename(source)}"\n'))
        units.append(os.path.relpath(unit, ROOT))
    return units


def write_if_changed(path, text):
    """Leaves an unchanged file's time alone, so that a rebuild skips it."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def refuse_isolated_build(torch) -> None:
    """pip's default build isolation compiles against a throwaway torch (the
    newest on the index, gigabytes of it), not the one that will run the
    extension; the result could never load."""
    if f"{os.sep}pip-build-env-" in torch.__file__:
        sys.exit("detgrid: build with --no-build-isolation (pip install --no-build-isolation .): "
                 "the extension must be compiled against the torch you run, not against "
                 f"pip's isolated {torch.__version__}")


def cuda_toolkit():
    """The toolkit to build the CUDA kernels with, or None for a host-only
    build (toolchain.cuda_plan decides). A CUDA torch without a usable
    compiler ends the install here, with the reason and the fix."""
    import torch

    refuse_isolated_build(torch)
    try:
        plan = toolchain.cuda_plan(torch, os.environ)
    except toolchain.Unusable as e:
        sys.exit(str(e))
    print(f"detgrid: {plan.describe()}", file=sys.stderr)
    if plan.toolkit is not None:
        # torch.utils.cpp_extension reads both at build time (its own
        # CUDA_HOME guess, made at import, never finds the pip toolkit).
        os.environ["TORCH_CUDA_ARCH_LIST"] = plan.archs
        os.environ["CUDA_HOME"] = plan.toolkit.home
        cpp_extension.CUDA_HOME = plan.toolkit.home
    return plan.toolkit


def cuda_library_includes(cuda_home):
    """Header folders of the CUDA libraries pip installed beside torch, for a
    toolkit that lacks them: ATen's CUDA headers include cusparse.h and
    cublas_v2.h, which a runtime-only toolkit does not ship. They are searched
    after everything else (-idirafter), so the toolkit's own runtime headers
    win over the copies in those folders."""
    toolkit_include = os.path.join(cuda_home, "include")
    if os.path.exists(os.path.join(toolkit_include, "cusparse.h")):
        return []
    return [
        os.path.join(root, entry, "include")
        for root in toolchain.nvidia_package_roots()
        for entry in sorted(os.listdir(root))
        if os.path.exists(os.path.join(root, entry, "include", "cusparse.h"))
    ]


def write_build_info(toolkit) -> None:
    """detgrid/_build_info.py: the torch this build is for (buildinfo.py's guard reads it).
    Written before setup() so that build_py packs it into wheels too."""
    import torch

    fields = {
        "TORCH_VERSION": torch.__version__,
        "TORCH_CUDA": torch.version.cuda,
        "CUDA_KERNELS": toolkit is not None,
        "CUDA_ARCH_LIST": os.environ["TORCH_CUDA_ARCH_LIST"] if toolkit else None,
        "NVCC": toolkit.nvcc if toolkit else None,
        "NVCC_VERSION": toolkit.version if toolkit else None,
    }
    text = "# Generated by setup.py for this build; not in git.\n" + "".join(
        f"{key} = {value!r}\n" for key, value in fields.items())
    with open(BUILD_INFO, "w") as f:
        f.write(text)


def extension(toolkit):
    sources = [
        os.path.join(EXTENSION, name)
        for name in ("register.cpp", "autograd.cpp", "checks.cpp", "core_ops.cpp")
    ]
    include_dirs = [os.path.abspath(COMPAT_INCLUDE)]
    if toolkit is None:
        return cpp_extension.CppExtension(
            "detgrid._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": CXX_FLAGS + EXTRA_CXX_FLAGS},
            extra_link_args=EXTRA_LINK_FLAGS,
        )
    late_includes = [f"-idirafter{folder}" for folder in cuda_library_includes(toolkit.home)]
    cudart_dir = toolchain.link_dir_for_cudart(
        toolkit.home, os.path.join(ROOT, "build", "detgrid-link"))
    return cpp_extension.CUDAExtension(
        "detgrid._C",
        sources + [os.path.join(EXTENSION, "cuda_ops.cpp"), CORE_SOURCE, *cuda_level_units()],
        include_dirs=include_dirs,
        library_dirs=[cudart_dir] if cudart_dir else [],
        define_macros=[("DETGRID_WITH_CUDA", None)],
        extra_link_args=EXTRA_LINK_FLAGS,
        extra_compile_args={
            "cxx": CXX_FLAGS + late_includes + EXTRA_CXX_FLAGS,
            "nvcc": NVCC_FLAGS + [f"-Xcompiler={flag}" for flag in late_includes],
        },
    )


def load_hostify():
    """aten_kernels/hostify/hostify.py, loaded by path (as toolchain.py)."""
    path = os.path.join(ROOT, HOSTIFY, "hostify.py")
    spec = importlib.util.spec_from_file_location("detgrid_hostify", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_cuda_include():
    try:
        return toolchain.host_cuda_include(os.environ)
    except toolchain.NoCudaHeaders as e:
        sys.exit(str(e))


class BuildWithHostify(cpp_extension.BuildExtension):
    """BuildExtension, plus the core's host build: its CUDA source made
    into a host unit by hostify.py and compiled, with hostify's prelude first
    and its stand-in headers ahead of torch's, into objects the extension
    links (flags of their own, which one Extension cannot give one source).
    The host build contracts a * b + c into FMAs, as nvcc does, where the
    CPU has them (-mfma); elsewhere it rounds every product. The grid
    gradient's unit is hostified the same way and rounds every operation,
    as its CUDA build does (-fmad=false)."""

    def build_extensions(self):
        for ext in self.extensions:
            ext.extra_objects = list(ext.extra_objects or []) + self.hostify_objects()
        super().build_extensions()

    def build_extension(self, ext):
        """The CUDA build compiles GridGradient.cu on its own, for its flags
        (one Extension gives every source the same); BuildExtension has wrapped
        the compiler for nvcc by now."""
        if ("DETGRID_WITH_CUDA", None) in ext.define_macros:
            flags = dict(ext.extra_compile_args)
            flags["nvcc"] = flags["nvcc"] + GRID_GRADIENT_NVCC_FLAGS
            ext.extra_objects = list(ext.extra_objects) + self.compiler.compile(
                [GRID_GRADIENT_SOURCE], output_dir=self.build_temp,
                macros=ext.define_macros, include_dirs=ext.include_dirs,
                extra_postargs=flags, depends=ext.depends)
        super().build_extension(ext)

    def hostify_objects(self):
        import torch

        out = os.path.join(os.path.abspath(self.build_temp), "hostify")
        os.makedirs(out, exist_ok=True)
        # Each build's unit, with its launcher and source digest named after it.
        units = []
        for build, text in core_builds():
            generated = os.path.join(out, f"GridSamplerDeterministic.{build}.host.cpp")
            symbol = build_symbol(build)
            write_if_changed(generated, (
                "#define launch_grid_sampler_backward_deterministic_kernel "
                f"launch_grid_sampler_backward_deterministic_host_{symbol}\n"
                f"#define kHostifiedSourceSha256 kHostifiedSourceSha256_{symbol}\n"
                + load_hostify().hostify_source(text, CORE_SOURCE)))
            units.append(generated)
        grid_gradient = os.path.join(out, "GridGradient.host.cpp")
        with open(os.path.join(ROOT, GRID_GRADIENT_SOURCE), encoding="utf-8") as f:
            write_if_changed(grid_gradient, (
                "#define launch_grid_sampler_grid_gradient_kernel "
                "launch_grid_sampler_grid_gradient_host\n"
                "#define kHostifiedSourceSha256 kHostifiedSourceSha256_grid_gradient\n"
                + load_hostify().hostify_source(f.read(), GRID_GRADIENT_SOURCE)))
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        flags = [
            "-std=c++20", "-O2", "-fPIC", "-fno-fast-math", "-Wno-attributes",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-include", os.path.join(ROOT, HOSTIFY, "prelude.h"),
            "-I" + os.path.join(ROOT, HOSTIFY, "include"),
            "-I" + os.path.join(ROOT, COMPAT_INCLUDE),
        ] + ["-I" + folder for folder in cpp_extension.include_paths()] + [
            "-I" + host_cuda_include()]
        contract = ["-mfma", "-ffp-contract=fast"] if toolchain.cpu_has_fma() else [
            "-ffp-contract=off"]
        sources = {unit: contract for unit in units}
        sources[grid_gradient] = ["-ffp-contract=off"]
        for name in ("existing_kernel_reference.cpp", "control.cpp"):
            sources[os.path.join(ROOT, HOSTIFY, name)] = contract
        objects = [os.path.join(out, os.path.basename(s) + ".o") for s in sources]
        compiler = os.environ.get("CXX", "c++")
        print("detgrid: hostify the core and the grid gradient (" + ", ".join(
            os.path.basename(s) for s in sources) + ")", file=sys.stderr)
        with concurrent.futures.ThreadPoolExecutor() as pool:
            runs = list(pool.map(
                lambda pair: subprocess.run(
                    [compiler, "-c", pair[0], "-o", pair[1]] + flags + sources[pair[0]]
                    + EXTRA_CXX_FLAGS,
                    capture_output=True, text=True),
                zip(sources, objects)))
        for source, run in zip(sources, runs):
            if run.returncode != 0:
                sys.exit(f"detgrid: the host build of {source} failed:\n{run.stderr}")
        return objects


def install_requires():
    """The extension runs only on the torch release it was compiled against
    (buildinfo.py enforces it at import), so pin that release."""
    import torch

    public = torch.__version__.split("+")[0]
    return [f"torch=={public}", "numpy"]


TOOLKIT = cuda_toolkit()
write_build_info(TOOLKIT)

setup(
    name="detgrid",
    version=VERSION,
    description="Deterministic CUDA backward for torch.nn.functional.grid_sample",
    package_dir={"": "tools"},
    packages=find_packages("tools"),
    ext_modules=[extension(TOOLKIT)],
    cmdclass={"build_ext": BuildWithHostify},
    entry_points={"console_scripts": ["detgrid = detgrid.kit.cli:main"]},
    python_requires=">=3.9",
    install_requires=install_requires(),
    extras_require={
        "bench": ["matplotlib"],
        "test": ["pytest", "expecttest", "hypothesis", "matplotlib"],
    },
)
