"""`detgrid build`: build patched PyTorch (full) or the drop-in extension.

    detgrid build --pytorch PATH [--mode full|extension] [--dry-run] [--jobs N] [--cuda-arch LIST]

full:      in the PyTorch checkout at PATH, upstream's own build
           (`pip install -e . -v --no-build-isolation`, with the current python),
           after `git submodule update --init --recursive` and
           `pip install -r requirements.txt`, with USE_CUDA=1, TORCH_CUDA_ARCH_LIST
           from the local GPU (or --cuda-arch), MAX_JOBS from cores and memory,
           BUILD_TEST=0, USE_DISTRIBUTED=0, no flash / memory-efficient attention,
           ninja. Nothing is ever cleaned: running it again resumes the build
           incrementally (ninja rebuilds only what changed).
extension: `pip install --no-build-isolation .` in the kit's root, against the
           installed torch (minutes); `-e .` when detgrid is already installed
           editable from the tree (as tools/setup.sh does), so that it stays so.
           The plan's notes say which nvcc and architectures setup.py will use
           and why (detgrid.kit.toolchain decides for both: --cuda-arch, else
           the visible GPUs', else torch's list), or why its build will fail.

plan_build() returns the plan (environment and commands) as data; run_build()
runs it through a runner that streams lines, writes the full log, parses
ninja's `[n/m]` progress and remembers the first compiler error. Only the CLI
handler prints.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from detgrid.kit import sourcetree, toolchain

GIB = 2**30
GIB_PER_JOB = 2.5  # a CUDA/ATen translation unit can take ~2-3 GiB to compile
LOG_NAME = "detgrid-build.log"
KIT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

NINJA_PROGRESS = re.compile(r"^\s*\[(\d+)/(\d+)\]")
# gcc/clang "file.cpp:12:5: error: ..." and nvcc "file.cu(12): error: ..."
COMPILER_ERROR = re.compile(r"^\s*(?P<where>\S[^:(]*?(?::\d+(?::\d+)?|\(\d+\))):\s*(?:fatal )?error\b")
OTHER_ERROR = re.compile(r"CMake Error|\berror:", re.IGNORECASE)


class BuildError(ValueError):
    """A plan that cannot be made (bad path, unknown CUDA architecture)."""


@dataclasses.dataclass
class BuildPlan:
    mode: str
    cwd: str
    env: Dict[str, str]       # set on top of the inherited environment
    commands: List[List[str]]
    log_path: str
    notes: List[str] = dataclasses.field(default_factory=list)

    def script(self, dry_run: bool = True) -> str:
        """The plan as a shell script: exactly what run_build runs."""
        lines = [f"# detgrid build --mode {self.mode}" + (" (dry run: nothing was run)" if dry_run else ""),
                 f"# full log: {self.log_path}",
                 "# environment: inherited, plus:"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        lines.append(f"cd {shlex.quote(self.cwd)}")
        lines += [shlex.join(c) for c in self.commands]
        lines += [f"# note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclasses.dataclass
class BuildResult:
    ok: bool
    returncode: int
    log_path: str
    failed_command: Optional[List[str]] = None
    first_error: Optional[str] = None   # the first compiler error line (file:line: error: ...)
    progress: Optional[Tuple[int, int]] = None  # the last ninja [n/m] seen

    def summary(self) -> str:
        if self.ok:
            return f"build succeeded; full log: {self.log_path}"
        lines = [f"build failed (exit {self.returncode}): {shlex.join(self.failed_command or [])}"]
        lines.append(f"first error: {self.first_error}" if self.first_error else
                     "no compiler error line found")
        lines.append(f"full log: {self.log_path}")
        return "\n".join(lines)


def default_max_jobs(cores: Optional[int] = None, mem_bytes: Optional[int] = None) -> int:
    """min(cores, memory in GiB / 2.5), at least 1."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if mem_bytes is None:
        mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(int(cores or 1), int(mem_bytes / GIB / GIB_PER_JOB)))


def local_cuda_arch() -> Optional[str]:
    """'major.minor' of the first visible GPU (e.g. '9.0' on an H200), else None."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}.{minor}"
    except Exception:
        pass
    return None


def installed_editable() -> bool:
    """Whether detgrid is installed editable (`pip install -e .`, as tools/setup.sh does)."""
    from importlib import metadata

    try:
        info = json.loads(metadata.distribution("detgrid").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return bool(info.get("dir_info", {}).get("editable"))


def ninja_note() -> List[str]:
    if shutil.which("ninja"):
        return []
    return ["ninja is not on PATH: requirements.txt installs it; without it the build falls back "
            "to make (slower, and no [n/m] progress)"]


def extension_cuda_notes(arch: Optional[str], arch_origin: str) -> List[str]:
    """What the extension build will do about CUDA, decided as setup.py decides
    it (toolchain.cuda_plan), so that a dry run tells the truth. `arch` is the
    TORCH_CUDA_ARCH_LIST the plan sets, if any, and `arch_origin` its source."""
    from detgrid.kit import installed_torch

    torch = installed_torch.load()

    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=arch) if arch else os.environ
    try:
        plan = toolchain.cuda_plan(torch, env)
    except toolchain.Unusable as e:
        return [f"this build will fail: {e}"]
    if arch and plan.toolkit is not None:
        plan = dataclasses.replace(plan, origin=arch_origin)
    return [plan.describe()]


def plan_build(pytorch: Optional[str] = None, mode: str = "full", jobs: Optional[int] = None,
               cuda_arch: Optional[str] = None, python: str = sys.executable,
               kit_root: str = KIT_ROOT, detect_arch: Optional[Callable[[], Optional[str]]] = None,
               cores: Optional[int] = None, mem_bytes: Optional[int] = None,
               editable: Optional[bool] = None,
               describe_cuda: Optional[Callable[[Optional[str], str], List[str]]] = None
               ) -> BuildPlan:
    if jobs is not None and jobs < 1:
        raise BuildError("--jobs must be at least 1")
    max_jobs = str(jobs if jobs is not None else default_max_jobs(cores, mem_bytes))
    pip = [python, "-m", "pip"]
    if mode == "extension":
        problem = sourcetree.needs_source_tree("build --mode extension", kit_root)
        if problem:
            raise BuildError(problem)
        # Without --cuda-arch, setup.py picks the architectures itself
        # (toolchain.cuda_plan: the visible GPUs', else torch's list), and the
        # notes say which and why.
        env = {"MAX_JOBS": max_jobs}
        if cuda_arch:
            env["TORCH_CUDA_ARCH_LIST"] = cuda_arch
        notes = (describe_cuda or extension_cuda_notes)(cuda_arch, "--cuda-arch")
        install = pip + ["install", "--no-build-isolation", "."]
        if installed_editable() if editable is None else editable:
            # replacing tools/setup.sh's editable install by a copy would leave
            # the tree's tools/detgrid shadowed: rebuild it in place instead
            install = pip + ["install", "--no-build-isolation", "-e", "."]
            notes.append("detgrid is installed editable from this tree: kept editable (-e)")
        log = os.path.join(kit_root, "build", LOG_NAME)
        return BuildPlan("extension", kit_root, env, [install], log, notes)
    if mode != "full":
        raise BuildError(f"unknown mode {mode!r} (full or extension)")
    if not pytorch:
        raise BuildError("--mode full needs --pytorch PATH (a PyTorch checkout)")
    checkout = os.path.abspath(pytorch)
    if not os.path.isfile(os.path.join(checkout, "setup.py")):
        raise BuildError(f"{checkout} is not a PyTorch checkout (no setup.py)")
    arch = cuda_arch or (detect_arch or local_cuda_arch)()
    if not arch:
        raise BuildError("no GPU visible here: pass --cuda-arch (e.g. 9.0 for H100/H200, "
                         "8.0 for A100; several as '8.0;9.0')")
    env = {"USE_CUDA": "1", "TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": max_jobs, "BUILD_TEST": "0",
           "USE_DISTRIBUTED": "0", "USE_FLASH_ATTENTION": "0", "USE_MEM_EFF_ATTENTION": "0",
           "USE_NINJA": "1"}
    commands = []
    if os.path.exists(os.path.join(checkout, ".git")):
        commands.append(["git", "submodule", "update", "--init", "--recursive"])
    if os.path.isfile(os.path.join(checkout, "requirements.txt")):
        commands.append(pip + ["install", "-r", "requirements.txt"])
    commands.append(pip + ["install", "-e", ".", "-v", "--no-build-isolation"])
    notes = ["incremental: re-running resumes in build/ (nothing is cleaned; CMAKE_FRESH unset)"]
    notes += ninja_note()
    return BuildPlan("full", checkout, env, commands, os.path.join(checkout, LOG_NAME), notes)


Runner = Callable[[List[str], str, Dict[str, str]], Iterator[str]]


def subprocess_runner(command: List[str], cwd: str, env: Dict[str, str]) -> Iterator[str]:
    """Yields the command's output lines (stdout and stderr merged); returns its exit code."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None
    with proc.stdout:
        yield from proc.stdout
    return proc.wait()


def first_error_line(line: str, current: Optional[str], strong: bool) -> Tuple[Optional[str], bool]:
    """Keeps the first compiler-style error; a weaker 'error' line only until one appears."""
    if strong:
        return current, strong
    if COMPILER_ERROR.search(line):
        return line.strip(), True
    if current is None and OTHER_ERROR.search(line):
        return line.strip(), False
    return current, False


def run_build(plan: BuildPlan, runner: Runner = subprocess_runner,
              on_event: Optional[Callable[[str, object], None]] = None) -> BuildResult:
    """Runs the plan's commands in order, stopping at the first failure.
    on_event(kind, data): ('command', argv), ('progress', (n, m)), ('line', text)."""
    emit = on_event or (lambda kind, data: None)
    env = dict(os.environ, **plan.env)
    os.makedirs(os.path.dirname(plan.log_path), exist_ok=True)
    progress, error, strong = None, None, False
    with open(plan.log_path, "w") as log:
        log.write(plan.script(dry_run=False) + "\n")
        for command in plan.commands:
            emit("command", command)
            log.write(f"\n$ {shlex.join(command)}\n")
            lines = runner(command, plan.cwd, env)
            while True:
                try:
                    line = next(lines)
                except StopIteration as stop:
                    returncode = stop.value if stop.value is not None else 0
                    break
                log.write(line if line.endswith("\n") else line + "\n")
                emit("line", line.rstrip("\n"))
                match = NINJA_PROGRESS.match(line)
                if match:
                    progress = (int(match.group(1)), int(match.group(2)))
                    emit("progress", progress)
                error, strong = first_error_line(line, error, strong)
            log.flush()
            if returncode != 0:
                log.write(f"\n# failed with exit code {returncode}\n")
                return BuildResult(False, returncode, plan.log_path, command, error, progress)
    return BuildResult(True, 0, plan.log_path, None, None, progress)


def progress_bar(done: int, total: int, width: int = 40) -> str:
    filled = int(width * done / total) if total else 0
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def _handler(args: argparse.Namespace) -> int:
    try:
        plan = plan_build(args.pytorch, args.mode, args.jobs, args.cuda_arch)
    except BuildError as e:
        print(f"detgrid build: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(plan.script())
        return 0
    tty = sys.stderr.isatty()
    shown = {"step": -1}

    def on_event(kind, data):
        if kind == "command":
            print(f"$ {shlex.join(data)}", file=sys.stderr)
        elif kind == "progress":
            done, total = data
            step = 10 * done // total if total else 0
            if tty:
                print("\r" + progress_bar(done, total), end="", file=sys.stderr, flush=True)
            elif step != shown["step"]:
                print(progress_bar(done, total), file=sys.stderr, flush=True)
            shown["step"] = step

    print(f"detgrid build --mode {plan.mode} in {plan.cwd}; full log: {plan.log_path}",
          file=sys.stderr)
    result = run_build(plan, on_event=on_event)
    if tty and result.progress:
        print(file=sys.stderr)
    print(result.summary(), file=sys.stderr if not result.ok else sys.stdout)
    return 0 if result.ok else 1


def register(subparsers) -> None:
    """Adds the `build` subcommand to the detgrid CLI."""
    p = subparsers.add_parser(
        "build", help="build patched PyTorch from a checkout (full) or the drop-in extension")
    p.add_argument("--pytorch", metavar="PATH", help="PyTorch checkout (needed for --mode full)")
    p.add_argument("--mode", choices=("full", "extension"), default="full",
                   help="full: patched PyTorch in --pytorch; extension: detgrid itself, "
                   "from the kit's tree, against the installed torch")
    p.add_argument("--dry-run", action="store_true",
                   help="print the exact environment and commands; run nothing")
    p.add_argument("--jobs", type=int, default=None,
                   help="MAX_JOBS (default: min(cores, memory GiB / 2.5))")
    p.add_argument("--cuda-arch", metavar="LIST", default=None,
                   help="TORCH_CUDA_ARCH_LIST, e.g. 9.0 (default: the local GPUs'; without a GPU, "
                   "--mode extension builds for the architectures torch was built for)")
    p.set_defaults(handler=_handler)
