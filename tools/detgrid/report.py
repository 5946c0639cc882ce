"""``detgrid report``: the upstream issue and PR bodies, filled from real runs on this machine.

``gather()`` collects the evidence (``torch.utils.collect_env``, the repro scripts' ``--json`` output
and exit codes, an optional pytest junit summary, the newest benchmark results, the patch's stats) into
a ``Report``; ``render_issue()`` / ``render_pr()`` turn it into ``ISSUE.md`` (PyTorch's feature-request
template) and ``PR.md`` (PyTorch's PR template, with the AI-assistance disclosure and an empty
"Submitter's notes" section for the human). Nothing is invented: evidence that could not be gathered
here (no GPU, tests not run, no benchmark results) is stated as such. The output holds no timestamps,
so on one machine it is a pure function of the kit and the environment.
"""

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

KIT_ROOT = Path(__file__).resolve().parents[2]
REPRO_SCRIPTS = ("show_error.py", "show_nondeterminism.py", "show_fix.py")
EXIT_MEANING = {0: "claims held", 1: "FAILED", 77: "not checkable here"}
ENV_BEGIN, ENV_END = "<!-- collect_env: begin -->", "<!-- collect_env: end -->"
NOT_RUN_TESTS = "not run by this report (pass `--junit FILE` from `pytest --junitxml FILE`)"

# (exit code, stdout, stderr) of a command run in a directory
Runner = Callable[[Sequence[str], Path], Tuple[int, str, str]]


# --------------------------------------------------------------------------- data


@dataclass
class ScriptRun:
    name: str
    command: str  # as a user types it, from the kit's root
    exit_code: int
    stdout: str
    stderr: str
    data: Optional[Dict[str, Any]]  # the parsed --json output, None if it was not JSON

    @property
    def status(self) -> str:
        if self.data is None:
            return f"ERROR (exit {self.exit_code}, no JSON output)"
        return EXIT_MEANING.get(self.exit_code, f"ERROR (exit {self.exit_code})")

    @property
    def claims(self) -> List[Dict[str, str]]:
        return list((self.data or {}).get("claims") or [])


@dataclass
class FileStat:
    path: str
    added: int
    removed: int
    new: bool


@dataclass
class PatchStats:
    path: str  # relative to the kit's root
    base_label: Optional[str]
    version_txt: Optional[str]
    commit: Optional[str]
    files: List[FileStat]

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)


@dataclass
class TestSummary:
    source: str
    tests: int
    failures: int
    errors: int
    skipped: int
    time_s: float

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


@dataclass
class BenchResults:
    path: str
    png: Optional[str]
    data: Dict[str, Any]

    @property
    def on_gpu(self) -> bool:
        return str(self.data.get("device", "cpu")) != "cpu"


@dataclass
class Checkout:
    path: str
    base_label: str
    base: str  # detgrid.patch.Base's description
    patch: Optional[PatchStats]
    applies: Optional[str]  # `git apply --check` outcome, None when there is no patch
    lint: Optional[List[str]]  # the checkout's grep linters on the new files


@dataclass
class Report:
    environment: Dict[str, Any]
    collect_env: str
    repro: List[ScriptRun]
    tests: Optional[TestSummary]
    bench: Optional[BenchResults]
    patches: List[PatchStats]
    checkout: Optional[Checkout] = None
    notes: List[str] = field(default_factory=list)

    @property
    def failed(self) -> List[ScriptRun]:
        return [r for r in self.repro if r.exit_code not in (0, 77) or r.data is None]


# --------------------------------------------------------------------------- gathering


def run_command(cmd: Sequence[str], cwd: Path) -> Tuple[int, str, str]:
    try:
        p = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        return 124, e.stdout or "", f"timed out after {e.timeout} s"
    return p.returncode, p.stdout, p.stderr


def environment() -> Dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "python": platform.python_version(),
            "cuda_available": cuda, "device_name": torch.cuda.get_device_name(0) if cuda else None,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def signature(env: Dict[str, Any]) -> str:
    """The set-up a report was made on, one line (rendered into ISSUE.md and PR.md)."""
    device = f"CUDA device {env['device_name']}" if env["cuda_available"] else "no CUDA device"
    return (f"torch {env['torch']}, Python {env['python']}, {device}, "
            f"{env['machine']} CPU ({env['cpu_capability']})")


def collect_env(runner: Runner = run_command, cwd: Path = KIT_ROOT) -> str:
    """`python -m torch.utils.collect_env`'s stdout, verbatim."""
    rc, out, err = runner([sys.executable, "-m", "torch.utils.collect_env"], cwd)
    if rc != 0:
        return f"python -m torch.utils.collect_env exited {rc}:\n{out}{err}"
    return out


def run_repro(kit_root: Path = KIT_ROOT, runner: Runner = run_command) -> List[ScriptRun]:
    runs = []
    for name in REPRO_SCRIPTS:
        rc, out, err = runner([sys.executable, os.path.join("repro", name), "--json"], kit_root)
        try:
            data = json.loads(out)
        except ValueError:
            data = None
        runs.append(ScriptRun(name, f"python repro/{name} --json", rc, out, err, data))
    return runs


def parse_junit(path: str) -> TestSummary:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")

    def total(key: str) -> int:
        return sum(int(s.get(key, 0)) for s in suites)

    return TestSummary(source=path, tests=total("tests"), failures=total("failures"),
                       errors=total("errors"), skipped=total("skipped"),
                       time_s=sum(float(s.get("time", 0)) for s in suites))


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def patch_stats(path: Path, kit_root: Path = KIT_ROOT) -> PatchStats:
    """Files and lines of a `git format-patch`-style file (as `git apply --numstat` counts them),
    and the base `detgrid patch` recorded in it; reads the file only."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    label = version = commit = None
    files: List[FileStat] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"Generated by `detgrid patch` against (\S+) \(version\.txt ([^)]+)\)", line)
        if m and not files:
            label, version = m.group(1), m.group(2)
            g = re.search(r"\+g([0-9a-f]{7,40})$", label)
            commit = g.group(1) if g else None
        if line.startswith("diff --git "):
            files.append(FileStat(line.split(" b/", 1)[-1], 0, 0, False))
        elif line.startswith("new file mode") and files:
            files[-1].new = True
        hunk = _HUNK.match(line)
        if hunk and files:
            old_left = int(hunk.group(1) or 1)
            new_left = int(hunk.group(2) or 1)
            i += 1
            while i < len(lines) and (old_left > 0 or new_left > 0):
                body = lines[i]
                if body.startswith("+"):
                    files[-1].added += 1
                    new_left -= 1
                elif body.startswith("-"):
                    files[-1].removed += 1
                    old_left -= 1
                elif body.startswith("\\"):
                    pass
                else:
                    old_left -= 1
                    new_left -= 1
                i += 1
            continue
        i += 1
    try:
        rel = str(Path(path).resolve().relative_to(Path(kit_root).resolve()))
    except ValueError:
        rel = str(path)
    return PatchStats(rel, label, version, commit, files)


def all_patch_stats(kit_root: Path = KIT_ROOT) -> List[PatchStats]:
    return [patch_stats(Path(p), kit_root) for p in sorted(glob.glob(str(kit_root / "patches" / "*.patch")))]


def newest_bench(kit_root: Path = KIT_ROOT) -> Optional[BenchResults]:
    """The newest benchmarks/results/*.json (by its recorded time, then the file's), if any."""
    found = []
    for p in glob.glob(str(kit_root / "benchmarks" / "results" / "*.json")):
        try:
            with open(p) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "workloads" in data:
            found.append((str(data.get("time_utc", "")), os.path.getmtime(p), p, data))
    if not found:
        return None
    _, _, p, data = max(found)
    png = p[:-5] + ".png"
    rel = os.path.relpath(p, kit_root)
    return BenchResults(rel, os.path.relpath(png, kit_root) if os.path.exists(png) else None, data)


def inspect_checkout(tree: Path, kit_root: Path = KIT_ROOT) -> Checkout:
    """Base detection, patch stats and `git apply --check` for a PyTorch checkout; writes nothing."""
    from detgrid import patch

    tree = Path(tree).resolve()
    base = patch.detect_base(tree)
    patch_file = kit_root / "patches" / f"{base.label}.patch"
    if not patch_file.is_file():
        return Checkout(str(tree), base.label, str(base), None, None, None)
    ok, msg = patch.check_patch(tree, patch_file)
    kernels = {f"{patch.KERNEL_DIR}/{n}": (kit_root / "aten_kernels" / patch.KERNEL_DIR / n).read_bytes()
               for n in patch.KERNEL_FILES}
    return Checkout(str(tree), base.label, str(base), patch_stats(patch_file, kit_root),
                    ("applies: " if ok else "does NOT apply: ") + msg, patch.lint_new_files(tree, kernels))


def gather(pytorch: Optional[str] = None, junit: Optional[str] = None, kit_root: Path = KIT_ROOT,
           runner: Runner = run_command, env: Optional[Dict[str, Any]] = None) -> Report:
    kit_root = Path(kit_root)
    checkout = inspect_checkout(Path(pytorch), kit_root) if pytorch else None  # fails fast
    return Report(
        environment=env if env is not None else environment(),
        collect_env=collect_env(runner, kit_root),
        repro=run_repro(kit_root, runner),
        tests=parse_junit(junit) if junit else None,
        bench=newest_bench(kit_root),
        patches=all_patch_stats(kit_root),
        checkout=checkout,
    )


# --------------------------------------------------------------------------- rendering helpers


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_claims(run: ScriptRun) -> str:
    head = f"`{run.command}`: exit {run.exit_code}, **{run.status}**"
    if not run.claims:
        tail = run.stderr.strip().splitlines()[-5:]
        return head + ("\n\n" + _fence("\n".join(tail)) if tail else "")
    rows = ["| claim | status | detail |", "|---|---|---|"]
    rows += [f"| {_cell(c['claim'])} | {_cell(c['status'])} | {_cell(c.get('detail', ''))} |"
             for c in run.claims]
    return head + "\n\n" + "\n".join(rows)


def render_repro(report: Report) -> str:
    parts = []
    for run in report.repro:
        parts.append(render_claims(run))
        parts.append(f"<details><summary>{run.name} --json output, verbatim</summary>\n\n"
                     f"{_fence(run.stdout or '(no output)', 'json')}\n\n</details>")
    return "\n\n".join(parts)


def render_stock_error(report: Report) -> str:
    """What show_error.py captured on CUDA, verbatim, or why it could not."""
    run = next((r for r in report.repro if r.name == "show_error.py"), None)
    data = run.data if run else None
    if data and data.get("device") == "cuda" and data.get("error_message"):
        return ("Captured by `python repro/show_error.py` on "
                f"{data.get('device_name')} (torch {data.get('torch')}), verbatim:\n\n"
                + _fence("RuntimeError: " + data["error_message"]))
    why = "show_error.py did not run" if run is None else f"show_error.py: {run.status}"
    if data and data.get("device") != "cuda":
        why = (f"the machine this report was generated on has no CUDA device, so neither the "
               f"snippet nor `repro/show_error.py` could show it (exit {run.exit_code}, "
               f"{run.status}): the error text was not captured here")
    return ("The error (its first words are fixed by "
            "`alertNotDeterministic(\"grid_sampler_2d_backward_cuda\")` in "
            "`aten/src/ATen/native/cuda/GridSampler.cu`) is `grid_sampler_2d_backward_cuda does not "
            f"have a deterministic implementation, ...`; {why}.")


def render_patch_stats(stats: PatchStats) -> str:
    commit = stats.commit or "not recorded in the patch (base identified by its version tag)"
    lines = [f"`{stats.path}`: base {stats.base_label or 'unknown'} (version.txt "
             f"{stats.version_txt or 'unknown'}), commit {commit}; {len(stats.files)} files, "
             f"+{stats.added} −{stats.removed} lines.", "", "| file | + | − |", "|---|---|---|"]
    lines += [f"| `{f.path}`{' (new)' if f.new else ''} | {f.added} | {f.removed} |" for f in stats.files]
    return "\n".join(lines)


def render_patches(report: Report) -> str:
    parts = []
    if report.checkout:
        c = report.checkout
        parts.append(f"Checkout `{c.path}`: base {c.base_label} ({c.base}).")
        if c.patch is None:
            parts.append(f"No patch is generated for {c.base_label} yet: `detgrid patch --pytorch "
                         f"{c.path}` writes `patches/{c.base_label}.patch`.")
        else:
            parts.append(f"`git apply --check`: {c.applies}.")
            parts.append("The checkout's grep linters on the new files: " +
                         ("clean." if not c.lint else "; ".join(c.lint)))
    if not report.patches:
        parts.append("No patch in `patches/`.")
    parts += [render_patch_stats(s) for s in report.patches]
    return "\n\n".join(parts)


def render_tests(report: Report) -> str:
    t = report.tests
    if t is None:
        return f"`python -m pytest tests`: {NOT_RUN_TESTS}."
    return (f"`python -m pytest tests` (junit `{os.path.basename(t.source)}`): {t.tests} tests, "
            f"{t.passed} passed, {t.failures} failed, {t.errors} errors, {t.skipped} skipped "
            f"in {t.time_s:.1f} s.")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def render_bench(report: Report) -> str:
    b = report.bench
    if b is None:
        return ("No benchmark results: `benchmarks/results/` holds no results JSON, so there are "
                "no GPU results yet (`detgrid bench --device cuda` on a GPU writes them).")
    d = b.data
    head = (f"From `{b.path}`: {d.get('device_name')}, torch {d.get('torch')}, "
            f"sizes {d.get('size')}, {d.get('reps')} timed calls per variant (median).")
    if not b.on_gpu:
        head += (" **CPU smoke run** (host executor vs stock CPU on small shapes): it tests the "
                 "harness and is not a performance claim; no GPU results yet.")
    rows = ["| # | workload | stock route | stock ms | det ms | det/stock | extra MiB | "
            "max rel diff | correct |", "|---|---|---|---|---|---|---|---|---|"]
    for r in d.get("workloads", []):
        if r.get("status") != "measured":
            why = r.get("skip_reason") or r.get("error") or ""
            rows.append(f"| {r.get('row')} | {r.get('name')} | {_cell(r.get('status'))}: {_cell(why)} "
                        "| | | | | | |")
            continue
        v = r.get("variants", {})
        route = r.get("stock_route", "native")
        stock_ms = (v.get(route) or v.get("native") or {}).get("median_ms")
        rows.append(f"| {r.get('row')} | {r.get('name')} | {route} | {_fmt(stock_ms)} | "
                    f"{_fmt((v.get('detgrid') or {}).get('median_ms'))} | {_fmt(r.get('ratio'))} | "
                    f"{_fmt(r.get('extra_peak_mib'))} | {_fmt(r.get('max_rel_diff'))} | "
                    f"{'yes' if r.get('correct') else 'NO'} |")
    s = d.get("summary", {})
    tail = f"det/stock geomean {_fmt(s.get('geomean'))}, worst {_fmt(s.get('worst'))}."
    plot = f"![det/stock per workload]({b.png})" if b.png else "No plot (PNG) next to the JSON."
    return "\n\n".join([head, "\n".join(rows), tail, plot])


def render_env(report: Report) -> str:
    return (f"{ENV_BEGIN}\n<details><summary>python -m torch.utils.collect_env</summary>\n\n"
            f"{_fence(report.collect_env)}\n\n</details>\n{ENV_END}")


def mask_volatile(text: str) -> str:
    """The collect_env block (machine-specific) replaced by its markers."""
    return re.sub(re.escape(ENV_BEGIN) + ".*?" + re.escape(ENV_END), ENV_BEGIN + ENV_END, text,
                  flags=re.S)


def provenance(report: Report, what: str) -> str:
    return (f"<!-- {what}: generated by `detgrid report` (tools/detgrid/report.py) on "
            f"{signature(report.environment)}. Regenerate it rather than editing it. -->")


# --------------------------------------------------------------------------- ISSUE.md

SNIPPET = """\
import torch
import torch.nn.functional as F

torch.use_deterministic_algorithms(True)
x = torch.randn(2, 8, 32, 32, device="cuda", requires_grad=True)
theta = torch.tensor([[0.25, 0.0, 0.0], [0.0, 0.25, 0.0]], device="cuda").expand(2, 2, 3)
grid = F.affine_grid(theta, (2, 8, 128, 128), align_corners=False)  # zoom-in: many samples per pixel
F.grid_sample(x, grid, align_corners=False).sum().backward()  # RuntimeError on CUDA"""


def render_issue(report: Report) -> str:
    env = report.environment
    out = [
        provenance(report, "ISSUE.md"),
        "<!-- Title: Deterministic CUDA backward for grid_sample (grid_sampler_2d_backward_cuda, "
        "grid_sampler_3d_backward_cuda) in a release -->",
        "",
        "### 🚀 The feature, motivation and pitch",
        "",
        "Under `torch.use_deterministic_algorithms(True)`, `F.grid_sample(...).backward()` on CUDA "
        "raises in released PyTorch: torch 2.15.0, the latest release, still raises. grad_input is "
        "scattered with `atomicAdd` (`launch_grid_sampler_2d_backward_kernel`, \"Nondeterministic "
        "because of atomicAdd usage\"), so its bits change from run to run wherever several grid "
        "points sample the same input pixel: zoom-in grids, spatial transformers, flow warping, "
        "feature-grid models. Since #180417 the cuDNN route (bilinear, zeros, align_corners=True) "
        "alerts too, so no CUDA configuration of grid_sample (2D or 3D) has a deterministic "
        "backward in a release. Users who need reproducible training must turn determinism off for the whole "
        "step or accept `warn_only=True` and nondeterministic gradients.",
        "",
        "#68959 has tracked this since 2021. #196856 (a stable sort of contribution ids by "
        "destination, fixed 256-record partials) adds a deterministic 2D and 3D backward and has "
        "likely landed on main, as main's randomness notes document one; released users still have "
        "nothing.",
        "",
        "The pitch: a deterministic CUDA backward for `grid_sampler_2d` and `grid_sampler_3d` in a "
        "release, whose bits "
        "are a pure function of shapes and grid values (independent of GPU model, launch "
        "configuration and chunking), with a workspace bounded independently of the input size, "
        "and a CPU executor that reproduces the CUDA result bit for bit so the order can be tested "
        "without a GPU. A PR with such a kernel (sort by destination, one writer per grad_input "
        "element, canonical order over 4096-point tiles) follows; the same kernel is usable today "
        "on released torch as a drop-in extension (`detgrid.enable()`).",
        "",
        "**Repro** (stock torch, any CUDA GPU):",
        "",
        _fence(SNIPPET, "python"),
        "",
        render_stock_error(report),
        "",
        f"**The repro scripts' real output** (`repro/` of the kit; on {signature(env)}). Exit codes: "
        "0 every checkable claim held, 1 a claim failed, 77 nothing checkable here (e.g. no CUDA "
        "device: a claim about the CUDA kernel is reported as not checkable, never as passed).",
        "",
        render_repro(report),
        "",
        "### Alternatives",
        "",
        "- `torch.use_deterministic_algorithms(True, warn_only=True)`: runs, but the gradients "
        "stay nondeterministic.",
        "- Turning determinism off around `grid_sample`: the same.",
        "- Running the backward on the CPU: stock's CPU kernel is deterministic (no alert), but "
        "takes the step off the GPU, and it crashes on NaN grids with border/reflection padding "
        "(#24823).",
        "- A user-level autograd Function accumulating with `index_put_(..., accumulate=True)` "
        "(deterministic in deterministic mode): materialises indices and values for every "
        "(point, tap, channel).",
        "- A nightly build with #196856: not a release.",
        "",
        "### Additional context",
        "",
        "- #68959: the open issue for this since 2021 (the PR will say `Fixes #68959`). "
        "#196856: the sort-based deterministic backward on main (2D + 3D; the cuDNN backward "
        "delegates to it in deterministic mode). #180417: the cuDNN "
        "backward route now alerts. Related: #24823 (NaN/Inf grids crash the CPU kernel).",
        "- The change, as generated against a real PyTorch tree by the kit's `detgrid patch`:",
        "",
        render_patches(report),
        "",
        "Versions of the machine that generated this report:",
        "",
        render_env(report),
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- PR.md

DESIGN = """\
Per chunk of points (whole tiles of 4096 points, about 2^21 records):

1. **point pass**, one thread per point: source coordinates once, the grid gradient (single \
writer), and one record per tap: key = destination pixel `(n, y, x)` (voxel `(n, z, y, x)` in \
3D), value = record id \
`point * taps + tap`, and the tap weight;
2. **stable radix sort** of the records by key (`at::cuda::cub::radix_sort_pairs`, only the key \
bits needed), so each destination's records are in ascending record id;
3. **reduce**, no atomics, one writer per grad_input element, *dense* (grad_input has no more \
pixels than a chunk has records: a thread per `(destination, channel)` over all of grad_input, \
each destination's start found by binary search) or *sparse* (a zero fill, then a thread per \
`(touched destination, channel)`), chosen from the shapes alone; both fold the same canonical \
order, so the choice never shows in the bits.

When grad_input is not requested only the point pass runs, and no determinism alert is needed.

**Canonical order.** `grad_input[n][c][y][x]` is the left-to-right sum of partials, each the \
left-to-right sum of `round(weight * grad_output)` over at most 256 consecutive records of that \
pixel (in ascending record id) that do not cross a tile boundary; sums in `opmath_type` (float for \
half/bfloat16), rounded once. It is a pure function of shapes and grid values, independent of GPU \
model, SM count, block size, chunk size, stream and thread count. All floating-point operations of \
the shared math are explicitly rounded (`__fmul_rn`/`__fadd_rn` on the device, `-ffp-contract=off` \
on the host), so the host executor, which runs the same `C10_HOST_DEVICE` functions with \
`std::stable_sort` where CUDA uses CUB, produces the CUDA result bit for bit for float and double.

**Workspace.** From the caching allocator, independent of grid values: with `R = min(points, \
chunk_points) * taps` records per chunk (at most 2^21 by default), `R * (2 * sizeof(key) + 2 * 4 + \
sizeof(opmath))` bytes plus CUB's sort scratch (about `R * (sizeof(key) + 4)`), plus, in the dense \
reduction only, `4 * (destinations + 1) <= 4 * (R + 1)` bytes of segment starts (`destinations = \
N * H_in * W_in`, times `D_in` in 3D); plus a float \
carry of grad_input's size for half/bfloat16 inputs that need more than one chunk. With int32 keys \
and float32 that is about 32 bytes per record of one chunk: at most 64 MiB, whatever the input size.

**Non-finite grids.** No index is ever formed from a coordinate that is NaN, infinite or beyond \
±2^40 pixels: such a point contributes nothing to grad_input and gets a zero grid gradient (border \
padding clamps ±Inf to the border first, as stock does).

**Dispatch.** The deterministic path is taken when deterministic algorithms are on and grad_input \
is requested; otherwise the existing kernels run unchanged. In deterministic mode the composite \
`grid_sampler` no longer picks cuDNN, and `cudnn_grid_sampler_backward` delegates to \
`grid_sampler_2d_backward`. The 3D backward (`launch_grid_sampler_3d_backward_kernel`) takes the \
same deterministic path: one pipeline serves both, with the spatial dimensionality a template \
parameter of the shared math (5-D bicubic is tricubic, as in torch 2.15; earlier releases reject \
it in the forward)."""

DIFFERS = """\
How this differs from #196856 (stable sort of contribution ids by destination, fixed 256-record \
partials, ≤ 2^20 records per chunk, 64 MiB partial-payload cap, 2D + 3D):

- **Chunk-size-independent canonical order.** Partials never cross a 4096-point tile boundary and \
chunks are whole tiles, so the bits do not depend on the chunk size (nor on GPU model, SM count, \
block size or stream).
- **Bitwise equality with a host executor.** The CPU executor runs the same `C10_HOST_DEVICE` \
math in the same order and equals the CUDA result bit for bit (float, double), so the canonical \
order is testable on CPU-only CI and a CUDA result can be checked against it.
- **No per-pixel workspace in general.** The workspace is bounded by one chunk's records (≤ 64 \
MiB with int32 keys and float32); segment starts proportional to grad_input exist only in the \
dense reduction, where grad_input has no more pixels than a chunk has records (the half/bfloat16 \
multi-chunk float carry is the one grad_input-sized buffer).
- **Grid-only backward without alert or grouping.** When only the grid gradient is requested, only \
the point pass runs (single writer per element): no sort, no alert.
- **NaN-safe coordinates.** NaN, ±Inf and out-of-range coordinates never form an index.
- **Scope.** 2D and 3D, like #196856, from one dimension-generic pipeline."""

AI_DISCLOSURE = """\
> **AI-assisted content — disclosure.** This PR's code (the kernel, the host executor, the patch \
tool, the tests) and this description were written with the help of an AI coding assistant; this \
description was generated by the kit's `detgrid report` from the runs it lists. Per PyTorch's \
`AI_POLICY.md`, the human who submits it must have read, understood and reviewed all of it and \
answers for it: this is not an autonomous submission. The submitter's own words are in \
"Submitter's notes" below; everything else is the generated report."""

SUBMITTER_NOTES = """\
## Submitter's notes

<!-- For the submitting human, in your own words: what you reviewed, what you ran yourself, and \
why you believe the change is correct. `detgrid report` leaves this section empty on purpose. -->"""


def render_test_plan(report: Report) -> str:
    ck = report.checkout
    upstream = ("not run: they need this patch applied to a PyTorch checkout built with CUDA, and "
                "a GPU; no such build was made for this report")
    lines = [
        "Upstream tests, in the patched checkout (added or extended by the patch):",
        "",
        _fence("python test/test_nn.py -k 'test_grid_sample_2d_backward_deterministic or "
               "test_grid_sample_3d_backward_deterministic'\n"
               "python test/test_torch.py -k test_nondeterministic_alert_grid_sample", "sh"),
        "",
        f"Result: {upstream}.",
        "",
        "The patch applies to the checkout: `detgrid patch --pytorch PATH --check`: " +
        (f"{ck.applies} ({ck.base_label})." if ck and ck.applies else
         f"no patch generated for {ck.base_label} yet." if ck else
         "not run by this report (no `--pytorch PATH` given)."),
        "",
        "The kit's test suite (host executor, agreement with stock, bitwise, patch tool, repro):",
        "",
        _fence("python -m pytest tests", "sh"),
        "",
        "Result: " + render_tests(report).split(": ", 1)[1],
        "",
        "The repro scripts (real output in the issue; here the claims):",
        "",
        _fence("\n".join(r.command for r in report.repro), "sh"),
        "",
    ]
    lines += [render_claims(r) + "\n" for r in report.repro]
    if not report.environment.get("cuda_available"):
        lines.append(f"These ran on {signature(report.environment)}: no GPU evidence was gathered "
                     "for this report; the CUDA claims above are stated as not checkable.")
    return "\n".join(lines).rstrip("\n")


def render_pr(report: Report) -> str:
    env = report.environment
    ck = report.checkout
    gpu = bool(env.get("cuda_available") or (report.bench and report.bench.on_gpu))
    t = report.tests
    tests_ok = bool(t and t.tests and t.failures == t.errors == 0)
    lint = ("not run by this report (needs `lintrunner init` in a PyTorch checkout)")
    grep = ("clean" if ck and ck.lint == [] else "; ".join(ck.lint) if ck and ck.lint else
            "not run by this report (no `--pytorch PATH` given)")
    out = [
        provenance(report, "PR.md"),
        "Fixes #68959",
        "",
        AI_DISCLOSURE,
        "",
        SUBMITTER_NOTES,
        "",
        "## Summary",
        "",
        "Adds a deterministic CUDA backward for `grid_sampler_2d` and `grid_sampler_3d`, taken "
        "under `torch.use_deterministic_algorithms(True)` when grad_input is requested, instead "
        "of raising `grid_sampler_{2d,3d}_backward_cuda does not have a deterministic "
        "implementation`. "
        "Stock's backward scatters grad_input with `atomicAdd`; this one sorts the contributions "
        "by destination and reduces them with one writer per grad_input element in a canonical "
        "order. Behaviour outside deterministic mode is unchanged. Related: #196856 (sort-based, "
        "on main), #180417 (the cuDNN route alerts).",
        "",
        "## Design",
        "",
        DESIGN,
        "",
        DIFFERS,
        "",
        "## Changes",
        "",
        render_patches(report),
        "",
        "## Test plan",
        "",
        render_test_plan(report),
        "",
        "## Benchmarks",
        "",
        render_bench(report),
        "",
        "## BC-breaking",
        "",
        "BC-breaking: no. Outside deterministic mode nothing changes; in deterministic mode the "
        "CUDA 2D and 3D backward used to raise (or warn, with `warn_only=True`) and now returns "
        "deterministic gradients.",
        "",
        "## Checklist",
        "",
        f"- [ ] `lintrunner -a` (or `spin fixlint`) on the patched checkout: {lint}.",
        f"- [{'x' if ck and ck.lint == [] else ' '}] the checkout's grep linters "
        f"(`.lintrunner.toml`) on the new `.cu`/`.cuh`/`.h` files: {grep}.",
        "- [x] tests added: `test_grid_sample_{2d,3d}_backward_deterministic*` in "
        "`test/test_nn.py`, the 2D and 3D alert tests in `test/test_torch.py` updated; the "
        "`use_deterministic_algorithms` docstring and the randomness notes list the op.",
        f"- [{'x' if tests_ok else ' '}] "
        f"the kit's test suite: {render_tests(report).split(': ', 1)[1]}",
        f"- [{'x' if gpu else ' '}] GPU evidence (CUDA repro, benchmarks): "
        f"{'see above' if gpu else 'none gathered for this report (no GPU)'}.",
        "",
        "Versions of the machine that generated this report:",
        "",
        render_env(report),
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI


def write(report: Report, out_dir: Path) -> Dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"issue": out_dir / "ISSUE.md", "pr": out_dir / "PR.md"}
    for key, text in (("issue", render_issue(report)), ("pr", render_pr(report))):
        tmp = paths[key].with_name(f".{paths[key].name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, paths[key])
    return paths


def run(args: argparse.Namespace) -> int:
    from detgrid import patch

    try:
        report = gather(pytorch=args.pytorch, junit=args.junit)
    except patch.AnchorError as e:
        print(f"detgrid report: {e}", file=sys.stderr)
        return 2
    paths = write(report, Path(args.out) if args.out else KIT_ROOT)
    for r in report.repro:
        print(f"{r.command}: exit {r.exit_code} ({r.status})")
    print(f"tests: {render_tests(report).split(': ', 1)[1]}")
    print("benchmarks: " + (report.bench.path if report.bench else "none"))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    # The files are written either way; a failed claim or a broken script is the exit code.
    return 1 if report.failed else 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="run the repro scripts, collect the environment, test and benchmark results and the "
        "patch's stats, and write ISSUE.md and PR.md for upstream",
    )
    p.add_argument("--pytorch", metavar="PATH",
                   help="a PyTorch checkout: its base, and whether the patch for it applies")
    p.add_argument("--out", metavar="DIR", help="where ISSUE.md and PR.md go (default: the kit's root)")
    p.add_argument("--junit", metavar="FILE",
                   help="a junit XML from `pytest --junitxml FILE`: its summary goes in the test plan")
    p.set_defaults(handler=run)
    return p
