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
import os, sys, zipfile
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


def run_header_fetch_as_sass_audit(tmp_path, cache):
    import os
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON.replace("{executable}", sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PIP")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", DETGRID_CACHE=str(cache),
               FAKE_PIP_LOG=str(log))
    python, fetch = sass_audit_header_fetch()
    script = f'set -euo pipefail\nroot={ROOT}\n{python}\n{fetch}\necho "$headers"\n'
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


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
