"""The shell scripts CI runs cannot fail by a timing race.

Under ``set -o pipefail`` a pipeline into a reader that stops early
(``grep -q``, ``grep -m``, ``head``) fails whenever the reader exits before the
producer has written everything: the producer dies of SIGPIPE (exit 141) and
the pipeline reports it. Whether that happens depends on scheduling, so such a
line passes on one machine and fails a landing on another.

The header fetch (.ci/fetch_cuda_headers.sh) works on a fresh machine, with
an empty cache, called the way .ci/sass_audit.sh calls it: pip is reached as
``python3 -m pip``, never as a ``pip`` file assumed beside the interpreter.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob(".ci/*.sh"), ROOT / ".ci" / "run", *ROOT.glob("tools/*.sh")])

# A pipe into head, or into a grep with -q/--quiet/-m (alone or among
# bundled short options such as -Eq).
EARLY_EXIT_READER = re.compile(
    r"\|\s*(head\b|grep\b[^|;&]*?\s(-[A-Za-z]*[qm][A-Za-z]*\b|--quiet\b|--max-count\b))"
)


def logical_lines(text):
    """The script's lines with backslash continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    for number, line in enumerate(joined.splitlines(), 1):
        code = line.split(" #", 1)[0]
        if not code.lstrip().startswith("#"):
            yield number, code


def early_exit_pipes(text):
    if "pipefail" not in text:
        return []
    return [f"{n}: {line.strip()}" for n, line in logical_lines(text) if EARLY_EXIT_READER.search(line)]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_early_exit_reader_under_pipefail(script):
    assert early_exit_pipes(script.read_text()) == []


@pytest.mark.parametrize(
    "line",
    [
        'unzip -l "$wheel" | grep -q "detgrid/_C.*\\.so"',
        'grep -E -A 30 "$r" "$log" | head -n 120 >&2',
        "cmd | grep -Eq pattern",
        "cmd | grep -m 1 pattern",
        "cmd | grep --quiet x",
    ],
)
def test_detector_finds_the_racing_shapes(line):
    assert early_exit_pipes(f"set -euo pipefail\n{line}\n") != []


@pytest.mark.parametrize(
    "line",
    [
        'grep -q "x" "$work/file"',
        "cmd | grep -v x",
        'cmd | sed -n -E "s/a/b/p"',
        "cmd 2>&1 | tee log",
    ],
)
def test_detector_passes_readers_that_read_everything(line):
    assert early_exit_pipes(f"set -euo pipefail\n{line}\n") == []


# A stand-in for `python3 -m pip download [-q] [--no-deps] -d DIR SPEC...`:
# each SPEC becomes a small wheel zip in DIR (torch's with one header under
# torch/include, a CUDA library's with one under nvidia/cu13/include), and the
# call is logged; anything else fails, as a missing interpreter would.
FAKE_PYTHON = r'''#!{executable}
import os, sys, time, zipfile
time.sleep(float(os.environ.get("FAKE_PIP_DELAY", "0")))
args = sys.argv[1:]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if args[:3] != ["-m", "pip", "download"]:
    sys.exit("fake python3: only -m pip download is faked: " + " ".join(args))
rest = args[3:]
folder = rest[rest.index("-d") + 1]
specs = [a for i, a in enumerate(rest) if not a.startswith("-") and rest[i - 1] != "-d"]
for spec in specs:
    name, _, version = spec.partition("==")
    if name == "torch":
        wheel, member = f"torch-{version}-cp311-cp311-linux_x86_64.whl", "torch/include/x.h"
    else:
        stem = name.replace("-", "_")
        wheel, member = f"{stem}-13.0-py3-none-manylinux_2_27_x86_64.whl", f"nvidia/cu13/include/{stem}.h"
    with zipfile.ZipFile(os.path.join(folder, wheel), "w") as z:
        z.writestr(member, "// " + spec + "\n")
'''


def sass_audit_header_fetch():
    """The lines of sass_audit.sh that pick the Python and fetch the headers."""
    text = (ROOT / ".ci" / "sass_audit.sh").read_text()
    python = re.search(r"^python=.*$", text, re.M).group(0)
    fetch = re.search(r"^headers=\$\(.*fetch_cuda_headers\.sh.*\)$", text, re.M).group(0)
    return python, fetch


def header_fetch_as_sass_audit(tmp_path, cache, delay=0.0):
    """(argv, env) of a shell that fetches the headers as sass_audit.sh does, through the fake
    pip (which waits `delay` seconds per call)."""
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON.replace("{executable}", sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PIP")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", DETGRID_CACHE=str(cache),
               FAKE_PIP_LOG=str(log), FAKE_PIP_DELAY=str(delay))
    python, fetch = sass_audit_header_fetch()
    script = f'set -euo pipefail\nroot={ROOT}\n{python}\n{fetch}\necho "$headers"\n'
    return ["bash", "-c", script], env


def run_header_fetch_as_sass_audit(tmp_path, cache):
    import subprocess

    argv, env = header_fetch_as_sass_audit(tmp_path, cache)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    log = tmp_path / "pip.log"
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_two_header_fetches_at_once_both_get_the_headers(tmp_path):
    # CI's lanes (the sass audit and old_torch_compile) may fetch the same release at once:
    # without a lock the second deleted the wheels the first was unpacking.
    import subprocess

    cache = tmp_path / "cache"
    argv, env = header_fetch_as_sass_audit(tmp_path, cache, delay=0.5)
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert out.strip() == str(cache / "cuda-headers-2.14.1")
    assert len((tmp_path / "pip.log").read_text().splitlines()) == 2  # one fetch, two downloads
    assert (cache / "cuda-headers-2.14.1" / ".complete").is_file()


def test_header_fetch_as_sass_audit_runs_it_fills_an_empty_cache(tmp_path):
    # sass_audit.sh runs with PYTHON unset, python3 by bare name (CI's side
    # lane, before .venv exists): the fetch must reach pip through that
    # python3 and unpack the wheels' headers into the empty cache.
    cache = tmp_path / "cache"
    proc, calls = run_header_fetch_as_sass_audit(tmp_path, cache)
    assert proc.returncode == 0, proc.stderr
    folder = cache / "cuda-headers-2.14.1"
    assert proc.stdout.strip() == str(folder)
    assert [c.split()[:3] for c in calls] == [["-m", "pip", "download"]] * 2
    assert (folder / "torch" / "include" / "x.h").read_text() == "// torch==2.14.1\n"
    for name in ("nvidia_cublas", "nvidia_cusparse", "nvidia_cusolver"):
        assert (folder / "nvidia" / "cu13" / "include" / f"{name}.h").is_file(), name
    assert (folder / ".complete").is_file()
    assert not (folder / "wheels").exists()


def test_header_fetch_downloads_nothing_once_the_cache_is_complete(tmp_path):
    cache = tmp_path / "cache"
    first, _ = run_header_fetch_as_sass_audit(tmp_path, cache)
    assert first.returncode == 0, first.stderr
    (tmp_path / "pip.log").unlink()
    second, calls = run_header_fetch_as_sass_audit(tmp_path, cache)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert calls == []


# .ci/old_torch_flags.py runs a torch release's own flag code, taken from its
# cpp_extension.py. A stand-in for that file, written here in the shape the
# releases share (2.6 to 2.14): a default -std appended only to a command line
# that holds none, nvcc's common flags around the user's, the ninja rules.
FAKE_CPP_EXTENSION = '''
import os
COMMON_NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr"]

def include_paths(device_type="cpu"):
    lib_include = os.path.join(_TORCH_PATH, "include")
    paths = [lib_include]
    if device_type == "cuda":
        paths.append(_join_cuda_home("include"))
    return paths

def _get_cuda_arch_flags(cflags=None):
    arch = os.environ["TORCH_CUDA_ARCH_LIST"].replace(".", "")
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]

class BuildExtension:
    def build_extensions(self):
        for extension in self.extensions:
            self._add_compile_flag(extension, "-DTORCH_API_INCLUDE_EXTENSION_H")
            if extension.py_limited_api:
                self._add_compile_flag(extension, "-DPy_LIMITED_API=0x03090000")
            self._define_torch_extension_name(extension)

        def append_std17_if_no_std_present(cflags):
            cpp_flag_prefix = "-std="
            if not any(flag.startswith(cpp_flag_prefix) for flag in cflags):
                cflags.append(cpp_flag_prefix + "@DEFAULT@")

        def unix_cuda_flags(cflags):
            return COMMON_NVCC_FLAGS + ["--compiler-options", "'-fPIC'"] + cflags + _get_cuda_arch_flags(cflags)

        def unix_wrap_ninja_compile(sources, extra_postargs=None):
            post_cflags = extra_postargs["cxx"]
            append_std17_if_no_std_present(post_cflags)
            cuda_post_cflags = extra_postargs["nvcc"]
            cuda_post_cflags = unix_cuda_flags(cuda_post_cflags)
            @NVCC_STD@

RULES = ["$cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
         "$nvcc --generate-dependencies-with-compile $cuda_cflags -c $in -o $out $cuda_post_cflags"]
'''
OLD_TORCH_FLAGS = ROOT / ".ci" / "old_torch_flags.py"


def fake_release(tmp_path, default="c++17",
                 nvcc_std="append_std17_if_no_std_present(cuda_post_cflags)"):
    torch_root = tmp_path / "torch"
    (torch_root / "utils").mkdir(parents=True)
    (torch_root / "utils" / "cpp_extension.py").write_text(
        FAKE_CPP_EXTENSION.replace("@DEFAULT@", default).replace("@NVCC_STD@", nvcc_std))
    return torch_root


def old_torch_flags(tmp_path, torch_root, setup=ROOT / "setup.py", out=None):
    import subprocess
    import sys

    out = out or tmp_path / "args"
    out.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(OLD_TORCH_FLAGS), "--torch-root", str(torch_root), "--setup", str(setup),
         "--root", str(ROOT), "--cuda-home", "/cuda", "--late-include", "/late/include",
         "--out", str(out)], capture_output=True, text=True, timeout=60)
    args = {}
    if proc.returncode == 0:
        for kind in ("cpu", "cuda", "nvcc"):
            args[kind] = (out / f"{kind}.args").read_text().split("\0")[:-1]
    return proc, args


def std_flags(args):
    return [a for a in args if a.startswith("-std=")]


def test_setup_py_asks_for_cxx20_once_where_the_release_defaults_to_cxx17(tmp_path):
    # torch up to 2.11 appends -std=c++17 to a command line without -std;
    # setup.py's own -std=c++20 must be the only one, on g++ and nvcc alike.
    proc, args = old_torch_flags(tmp_path, fake_release(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for kind, command in args.items():
        assert std_flags(command) == ["-std=c++20"], kind


def test_release_default_std_lands_where_setup_gives_none(tmp_path):
    setup = tmp_path / "setup.py"
    setup.write_text('CXX_FLAGS = ["-O2"]\nNVCC_FLAGS = ["-O3"]\n')
    proc, args = old_torch_flags(tmp_path, fake_release(tmp_path), setup=setup)
    assert proc.returncode == 0, proc.stderr
    for kind, command in args.items():
        assert command[-1] == "-std=c++17", kind
    # as the ninja rules order them: interpreter flags, -D/-I, source, then
    # setup.py's, the build's own defines, nvcc's arch flags, the default -std
    cuda = args["cuda"]
    assert cuda.index("-DDETGRID_WITH_CUDA") < cuda.index("@SOURCE@") < cuda.index("-O2")
    assert cuda[cuda.index("-O2"):] == [
        "-O2", "-idirafter/late/include", "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-DTORCH_EXTENSION_NAME=_C", "-std=c++17"]
    nvcc = args["nvcc"]
    assert nvcc[nvcc.index("@SOURCE@"):] == [
        "@SOURCE@", "-o", "/dev/null", "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr",
        "--compiler-options", "'-fPIC'", "-O3", "-Xcompiler=-idirafter/late/include",
        "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
        "-gencode=arch=compute_90,code=sm_90", "-std=c++17"]
    assert "-DDETGRID_WITH_CUDA" not in args["cpu"]
    assert "-I/cuda/include" in cuda and "-I/cuda/include" not in args["cpu"]


def test_the_compat_folder_is_the_kits_one_include_folder_ahead_of_the_releases(tmp_path):
    # setup.py's include_dirs: aten_kernels/compat/include (the GridSampler.cuh helpers torch
    # 2.15 added) ahead of the release's headers, on every command line.
    proc, args = old_torch_flags(tmp_path, fake_release(tmp_path))
    assert proc.returncode == 0, proc.stderr
    compat = f"-I{ROOT / 'aten_kernels' / 'compat' / 'include'}"
    torch_include = f"-I{tmp_path / 'torch' / 'include'}"
    for kind, command in args.items():
        includes = [a for a in command if a.startswith("-I")]
        assert includes.index(compat) == includes.index(torch_include) - 1, kind
        assert not [a for a in includes if a.startswith(f"-I{ROOT}") and a != compat], kind


def test_refuses_a_release_that_orders_nvcc_flags_otherwise(tmp_path):
    torch_root = fake_release(tmp_path, nvcc_std="pass")
    proc, _ = old_torch_flags(tmp_path, torch_root)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("old_torch_flags: ")
    assert "unix_wrap_ninja_compile" in proc.stderr


@pytest.mark.parametrize("bad", ["no cpp_extension.py", "no --out folder"])
def test_bad_argument_is_one_line(tmp_path, bad):
    torch_root = fake_release(tmp_path)
    if bad == "no cpp_extension.py":
        (torch_root / "utils" / "cpp_extension.py").unlink()
        proc, _ = old_torch_flags(tmp_path, torch_root)
    else:
        import subprocess
        import sys

        proc = subprocess.run(
            [sys.executable, str(OLD_TORCH_FLAGS), "--torch-root", str(torch_root),
             "--setup", str(ROOT / "setup.py"), "--root", str(ROOT), "--cuda-home", "/cuda",
             "--out", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("old_torch_flags: "), proc.stderr
    assert "Traceback" not in proc.stderr
