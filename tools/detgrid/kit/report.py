"""``detgrid report``: the upstream bodies (a comment on #68959, a PR body, a comment on #196856),
from real runs.

``gather()`` collects the evidence (``torch.utils.collect_env``, the repro scripts' ``--json`` output
and exit codes, an optional pytest junit summary, the newest benchmark results, the core's
machine-code count, the patch's stats, ``detgrid patch --check`` on a checkout) into a ``Report``;
``render_issue()``, ``render_pr()`` and ``render_comment_196856()`` turn it into ``ISSUE.md``,
``PR.md`` and ``COMMENT_196856.md``.

A maintainer reads each in a minute, so each has a word limit (``WORD_LIMITS``, counted by
``visible_words``): ISSUE.md carries an issue's four parts (what fails, a repro, the expected
behaviour, the proposal) and a status line; PR.md describes the upstream core (problem, approach,
test plan, GPU timing, memory, BC notes, checklist); COMMENT_196856.md sets the core beside
#196856, row by row, and offers the kit's tests. Everything else (the full error, the scripts'
claims, the patch's files, the sources of the comparison, the environment) is collapsed in
``<details>``, which the limits do not count.

Claims are measured here or cited with what was checked and when; what could not be gathered (no
GPU, tests not run, no benchmark results) is said as such. Per PyTorch's ``AI_POLICY.md`` every
body holds its generated text in a quote, under a disclosure, after a "Human notes" section for the
submitter's own words (``--notes FILE``); without them the body is marked DRAFT, and ``--final``
refuses. The output holds no timestamps: on one machine it is a pure function of the kit, the
environment and the notes.
"""

import argparse
import glob
import json
import math
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from detgrid.levels import UPSTREAM_STACK

KIT_ROOT = Path(__file__).resolve().parents[3]
REPRO_SCRIPTS = ("show_error.py", "show_nondeterminism.py", "show_fix.py")
EXIT_MEANING = {0: "claims held", 1: "FAILED", 77: "not checkable here"}
ENV_BEGIN, ENV_END = "<!-- collect_env: begin -->", "<!-- collect_env: end -->"
# Written by the kit's machine-code count when it has run; the bodies cite the core's entry
# (``core``, or ``levels.core``) only then.
MACHINE_CODE = Path("benchmarks") / "machine_code.json"

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
    base_label: str
    commit: Optional[str]  # the base commit format-patch recorded, if it did
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
        return ran_on_gpu(self.data)


def ran_on_gpu(bench_data: Dict[str, Any]) -> bool:
    """Whether a benchmark results file was measured on a GPU (the harness also smoke-runs on CPU)."""
    return str(bench_data.get("device", "cpu")) != "cpu"


@dataclass
class MachineCode:
    """The core's machine code (``core`` or ``levels.core`` of benchmarks/machine_code.json), as
    the kit's count recorded it."""
    path: str  # relative to the kit's root
    arch: Optional[str]  # None when the count names none
    kernels: int  # CUB's included
    text_bytes: int
    lines: Optional[int] = None  # of the source it counted, when recorded


@dataclass
class Checkout:
    path: str
    base_label: str
    base: str  # detgrid.kit.patch.Base's description
    check: str  # `detgrid patch --check`'s verdict (the change built in a temporary copy)
    applies: bool
    notes: List[str]  # the patch tool's notes on this checkout
    lint: List[str]  # the checkout's grep linters on the new files


@dataclass
class Report:
    environment: Dict[str, Any]
    collect_env: str
    repro: List[ScriptRun]
    tests: Optional[TestSummary]
    bench: Optional[BenchResults]
    patches: List[PatchStats]
    checkout: Optional[Checkout] = None
    submitter_notes: str = ""  # the human's own words; empty keeps the bodies drafts
    installed_doc: Optional[str] = None  # installed_doc_lists_grid_sample()
    machine_code: Optional[MachineCode] = None
    core_lines: Optional[int] = None  # lines of the core's new file, None when it is not in the kit

    @property
    def draft(self) -> bool:
        return not self.submitter_notes

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
    from detgrid.kit import installed_torch

    torch = installed_torch.load()

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "python": platform.python_version(),
            "cuda_available": cuda, "device_name": torch.cuda.get_device_name(0) if cuda else None,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


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


class ReportError(Exception):
    """A bad argument, found before anything runs; the message is one line for the user."""


def parse_junit(path: str) -> TestSummary:
    """The summary of a `pytest --junitxml` file; ReportError when it is missing or malformed."""
    try:
        root = ET.parse(path).getroot()
    except OSError as e:
        raise ReportError(f"--junit {path}: {e.strerror or e}") from None
    except ET.ParseError as e:
        raise ReportError(f"--junit {path}: not junit XML ({e})") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ReportError(f"--junit {path}: no <testsuite> element")

    def total(key: str) -> int:
        return sum(int(s.get(key, 0)) for s in suites)

    try:
        return TestSummary(source=path, tests=total("tests"), failures=total("failures"),
                           errors=total("errors"), skipped=total("skipped"),
                           time_s=sum(float(s.get("time", 0)) for s in suites))
    except ValueError as e:
        raise ReportError(f"--junit {path}: a count is not a number ({e})") from None


def read_notes(path: Optional[str]) -> str:
    """The submitter's own notes (Markdown), '' without a file; HTML comments do not count."""
    if not path:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"--notes {path}: {getattr(e, 'strerror', None) or e}") from None
    return re.sub(r"<!--.*?-->", "", text, flags=re.S).strip()


def installed_doc_lists_grid_sample() -> Optional[str]:
    """Which list of the installed torch's use_deterministic_algorithms docstring has CUDA
    grid_sample: 'act' (deterministic), 'throw', or None (in neither)."""
    from detgrid.kit import installed_torch

    torch = installed_torch.load()

    doc = torch.use_deterministic_algorithms.__doc__ or ""
    entry = "grid_sample` when attempting to differentiate a CUDA tensor"
    act, _, throw = doc.partition("will throw a")
    return "act" if entry in act else "throw" if entry in throw else None


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def patch_stats(path: Path, kit_root: Path = KIT_ROOT) -> PatchStats:
    """Files and lines of a `git format-patch` file (as `git apply --numstat` counts them); the
    base is the file's name (``patches/<base>.patch``) and its ``base-commit:`` trailer. Reads
    the file only."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    commit = None
    files: List[FileStat] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"base-commit: ([0-9a-f]{7,40})$", line)
        if m:
            commit = m.group(1)
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
    return PatchStats(rel, Path(path).stem, commit, files)


def all_patch_stats(kit_root: Path = KIT_ROOT) -> List[PatchStats]:
    return [patch_stats(Path(p), kit_root) for p in sorted(glob.glob(str(kit_root / "patches" / "*.patch")))]


def newest_bench(kit_root: Path = KIT_ROOT) -> Optional[BenchResults]:
    """The newest benchmarks/results/*.json (by its recorded time, then the file's), if any; a GPU
    run before any CPU smoke run, which must not hide that the kernels have run on a GPU."""
    found = []
    for p in glob.glob(str(kit_root / "benchmarks" / "results" / "*.json")):
        try:
            with open(p) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "workloads" in data:
            found.append((ran_on_gpu(data), str(data.get("time_utc", "")), os.path.getmtime(p), p, data))
    if not found:
        return None
    *_, p, data = max(found)
    png = p[:-5] + ".png"
    rel = os.path.relpath(p, kit_root)
    return BenchResults(rel, os.path.relpath(png, kit_root) if os.path.exists(png) else None, data)


def core_source_lines(kit_root: Path = KIT_ROOT) -> Optional[int]:
    """Lines of the files the upstream core adds (as the machine-code count counts them), None
    when the kit holds no core."""
    from detgrid.kit import stack

    try:
        return sum(len(text.splitlines()) for text in stack.core_sources(kit_root).values())
    except OSError:
        return None


def read_machine_code(kit_root: Path = KIT_ROOT, core_lines: Optional[int] = None) -> Optional[MachineCode]:
    """The core's entry of benchmarks/machine_code.json (``core``, else ``levels.core``); None
    when the file or the entry is absent, or when the entry counted a source of other lines than
    the core's (``core_lines``), an older core's. ReportError when the file is there but
    unreadable or the entry malformed, since a size claim must come from the file or not at
    all."""
    path = Path(kit_root) / MACHINE_CODE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"a {type(data).__name__}, not an object")
        core = data.get("core")
        if core is None:
            core = (data.get("levels") or {}).get("core")
        if core is None:
            return None
        arch = core.get("arch", data.get("arch"))
        code = MachineCode(str(MACHINE_CODE), None if arch is None else str(arch), int(core["kernels"]),
                           int(core["text_bytes"]),
                           None if core.get("lines") is None else int(core["lines"]))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ReportError(f"{MACHINE_CODE}: not the kit's machine-code count ({type(e).__name__}: {e})") from None
    if code.lines is not None and core_lines is not None and code.lines != core_lines:
        return None
    return code


def inspect_checkout(tree: Path, kit_root: Path = KIT_ROOT) -> Checkout:
    """What `detgrid patch --check` finds on a checkout (the change planned and built in a
    temporary copy), its notes and the grep linters on the new files; writes nothing."""
    from detgrid.kit import patch

    tree = Path(tree).resolve()
    base = patch.detect_base(tree)
    patch.refuse_pending(tree)
    pl = patch.plan(tree, kit_root)
    applies, verdict = patch.check(tree, pl)
    new_files = {rel: pl.new[rel] for rel in pl.changed if pl.old[rel] is None}
    return Checkout(str(tree), base.label, str(base), verdict, applies, list(pl.notes),
                    patch.lint_new_files(tree, new_files))


def gather(pytorch: Optional[str] = None, junit: Optional[str] = None, kit_root: Path = KIT_ROOT,
           runner: Runner = run_command, env: Optional[Dict[str, Any]] = None,
           notes: Optional[str] = None) -> Report:
    """Everything the bodies say. The arguments (and the machine-code file) are read and checked
    first: a bad --junit, --notes or --pytorch fails before any script runs."""
    kit_root = Path(kit_root)
    tests = parse_junit(junit) if junit else None
    submitter_notes = read_notes(notes)
    core_lines = core_source_lines(kit_root)
    machine_code = read_machine_code(kit_root, core_lines)
    checkout = inspect_checkout(Path(pytorch), kit_root) if pytorch else None
    return Report(
        environment=env if env is not None else environment(),
        collect_env=collect_env(runner, kit_root),
        repro=run_repro(kit_root, runner),
        tests=tests,
        bench=newest_bench(kit_root),
        patches=all_patch_stats(kit_root),
        checkout=checkout,
        submitter_notes=submitter_notes,
        installed_doc=installed_doc_lists_grid_sample(),
        machine_code=machine_code,
        core_lines=core_lines,
    )


# --------------------------------------------------------------------------- rendering helpers

# #196856's state as its stored thread showed it on this date (kit research notes,
# shared/UPSTREAM.md): open, its description as DESCRIPTION_196856 gives it; its code in
# SIDE_BY_SIDE.
CHECKED_ON = "2026-12-07"
# Context::alertNotDeterministic's message in v2.6.0 (aten/src/ATen/Context.cpp), for the 2-D op
ALERT_TEXT = (
    "grid_sampler_2d_backward_cuda does not have a deterministic implementation, but you set "
    "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
    "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
    "application. You can also file an issue at https://github.com/pytorch/pytorch/issues to help "
    "us prioritize adding deterministic support for this operation.")
# The core's memory, as GridSamplerDeterministic.cu allocates it and tests/test_core.py counts
# it from the shapes (test_workspace_stays_within_64_mib). CUB's temporary storage is allocated
# inside at::cuda::cub and is not in that count.
MEMORY = ("Caching allocator: a chunk's sort buffers (≤ 64 MiB, counted from the shapes), CUB's "
          "temporary storage and, for Half/BFloat16 over several chunks, a float scratch of "
          "grad_input's size.")

AI_DISCLOSURE = "**AI-generated:** an AI assistant wrote everything in this quote (PyTorch's `AI_POLICY.md`)."
NOTES_PLACEHOLDER = ("<!-- The submitter's own words: what you reviewed and ran yourself, and why "
                     "you believe the change is right. `detgrid report --notes FILE` puts FILE here; "
                     "until then this body is a draft. -->")
# How to fill the notes is in the notes section's placeholder, right below the banner.
DRAFT_BANNER = "**DRAFT, not for {what}:** no human notes yet."

# The issue's repro, in view: the smallest call that reaches the alert (any CUDA backward
# with grad_input requested does). tests/test_report.py runs it on CPU, where it must not raise.
REPRO = """\
import torch
torch.use_deterministic_algorithms(True)
x = torch.rand(1, 1, 2, 2, device="cuda", requires_grad=True)
torch.nn.functional.grid_sample(x, x.new_zeros(1, 2, 2, 2), align_corners=False).sum().backward()"""


def visible_words(text: str) -> int:
    r"""The words a reader sees without opening anything, which the word limits count:
    ``len(re.findall(r"\w+", text))`` once HTML comments and whole ``<details>`` blocks (their
    summary included) are removed. Code counts by its runs of word characters (``x.y(1)`` is three
    words, a fence's language name one); Markdown's markers alone (``>``, ``|``, ``-``, ``**``)
    are none."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"<details\b.*?</details>", " ", text, flags=re.S)
    return len(re.findall(r"\w+", text))


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _quote(text: str) -> str:
    """Markdown blockquote of ``text``: the container for AI-generated content."""
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def render_details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def signature(env: Dict[str, Any]) -> str:
    """The set-up a report was made on, one line (rendered into every body)."""
    device = f"CUDA device {env['device_name']}" if env["cuda_available"] else "no CUDA device"
    return (f"torch {env['torch']}, Python {env['python']}, {device}, "
            f"{env['machine']} CPU ({env['cpu_capability']})")


def provenance(report: Report, what: str, where: str) -> str:
    return (f"<!-- {what}: {where}. Generated by `detgrid report` (tools/detgrid/kit/report.py) on "
            f"{signature(report.environment)}. Regenerate it rather than editing it. -->")


# Each body's file, what its draft banner withholds it from, and where it goes.
BODY_PLACES = {"ISSUE.md": ("posting", "a comment on #68959"),
               "PR.md": ("submission", "the body of the PR that fixes #68959"),
               "COMMENT_196856.md": ("posting", "a comment on #196856")}


def render_body(report: Report, name: str, opening: List[str], agent: str) -> str:
    """A body as AI_POLICY.md asks: the draft banner while the human notes are empty, then the
    notes, then the generated text in a quote under its disclosure."""
    withheld_from, where = BODY_PLACES[name]
    banner = [DRAFT_BANNER.format(what=withheld_from), ""] if report.draft else []
    notes = report.submitter_notes or NOTES_PLACEHOLDER
    return "\n".join([provenance(report, name, where), *banner, *opening,
                      "### Human notes", "", notes, "", "### Agent report", "",
                      _quote(AI_DISCLOSURE + "\n\n" + agent), ""])


def stock_error(report: Report) -> Tuple[str, str]:
    """The stock error's message and where it comes from: captured by show_error.py on CUDA,
    verbatim, or else the one v2.6.0's source composes."""
    run = next((r for r in report.repro if r.name == "show_error.py"), None)
    data = run.data if run else None
    if data and data.get("device") == "cuda" and data.get("error_message"):
        return (data["error_message"], f"captured by `python repro/show_error.py` on "
                f"{data.get('device_name')} (torch {data.get('torch')}), verbatim")
    why = "show_error.py did not run" if run is None else f"`repro/show_error.py`: {run.status}"
    return (ALERT_TEXT, f"not captured on this machine ({why}: no CUDA device); the message "
            "`Context::alertNotDeterministic` composes in v2.6.0's `aten/src/ATen/Context.cpp`")


def first_sentence(message: str) -> str:
    """Up to the first full stop that ends a sentence (the names inside hold dots too)."""
    return message.split(". ", 1)[0].rstrip(".") + "."


def gpu_results(report: Report) -> Optional[BenchResults]:
    """Benchmark results from a GPU; a CPU smoke run of the harness says nothing about CUDA."""
    return report.bench if report.bench is not None and report.bench.on_gpu else None


def render_gpu_status(report: Report) -> str:
    """Whether the CUDA kernels have run on a GPU, as far as `benchmarks/results/` shows."""
    b = gpu_results(report)
    if b is None:
        return "Never run on a GPU."
    d = b.data
    measured = [r for r in d.get("workloads", []) if r.get("status") == "measured"]
    ratios = [r["ratio"] for r in measured if r.get("ratio")]
    if not ratios:
        return f"{d.get('device_name')}: no workload was timed."
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    wrong = sum(1 for r in measured if not _row_correct(r))
    core = ((d.get("summary") or {}).get("levels") or {}).get("core") or {}
    alone = f" (the core alone: {_fmt(core['geomean'])})" if core.get("geomean") else ""
    return (f"{d.get('device_name')}: deterministic/existing time geomean {_fmt(geomean)}{alone}, "
            f"worst {_fmt(max(ratios))} over {len(ratios)} workloads; {wrong} incorrect.")


def _row_correct(row: Dict[str, Any]) -> bool:
    """Within tolerance of the reference, and every build with the core's bits (where the
    bench compared them)."""
    return bool(row.get("correct")) and row.get("same_bits") is not False


def render_repro_failures(report: Report) -> str:
    """One sentence when a repro script failed or broke, '' when all held: a passing run is
    evidence for the details, a failing one must be seen."""
    bad = report.failed
    if not bad:
        return ""
    return "Repro scripts failing: " + "; ".join(f"`{r.name}` {r.status}" for r in bad) + "."


def render_claims(run: ScriptRun) -> str:
    head = f"`{run.name}`: exit {run.exit_code}, **{run.status}**"
    if run.claims:
        return head
    tail = run.stderr.strip().splitlines()[-3:]
    return head + (" (stderr ends: `" + " / ".join(tail) + "`)" if tail else "")


def render_claims_list(run: ScriptRun) -> str:
    """A repro script's claims, one line each; its raw JSON (with every run's hash) stays out."""
    head = f"`{run.command}` (exit {run.exit_code}, {run.status}):"
    if not run.claims:
        tail = (run.stderr or run.stdout or "(no output)").strip().splitlines()[-3:]
        return head + "\n\n" + _fence("\n".join(tail))
    return head + "\n\n" + "\n".join(
        f"- {_cell(c.get('claim'))}: **{_cell(c.get('status'))}** ({_cell(c.get('detail'))})"
        for c in run.claims)


def render_bench_table(report: Report) -> str:
    b = gpu_results(report)
    if b is None:
        return ""
    # "core": the core's build alone (rows that request grad_input); "stack": the whole
    # upstream stack, which the extension's default backward runs.
    rows = ["| # | workload | existing route | existing ms | core ms | core/existing | "
            "stack ms | stack/existing | extra MiB | correct |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in b.data.get("workloads", []):
        if r.get("status") != "measured":
            why = r.get("skip_reason") or r.get("error") or ""
            rows.append(f"| {r.get('row')} | {r.get('name')} | {_cell(r.get('status'))}: "
                        f"{_cell(why)} | | | | | | | |")
            continue
        v = r.get("variants", {})
        route = r.get("stock_route", "native")
        stock_ms = (v.get(route) or v.get("native") or {}).get("median_ms")
        core = (r.get("levels") or {}).get("core") or {}
        rows.append(f"| {r.get('row')} | {r.get('name')} | {route} | {_fmt(stock_ms)} | "
                    f"{_fmt(core.get('ms'))} | {_fmt(core.get('ratio'))} | "
                    f"{_fmt((v.get('detgrid') or {}).get('median_ms'))} | {_fmt(r.get('ratio'))} | "
                    f"{_fmt(r.get('extra_peak_mib'))} | {'yes' if _row_correct(r) else 'NO'} |")
    plot = f"\n\n![new/existing per workload]({b.png})" if b.png else ""
    return "\n".join(rows) + plot


def render_tests(report: Report, source: bool = True) -> str:
    """The kit's suite as --junit summarised it; ``source`` adds the junit file's name."""
    t = report.tests
    if t is None:
        return "not run by this report (pass `--junit FILE` from `pytest --junitxml FILE`)"
    where = f" (junit `{os.path.basename(t.source)}`)" if source else ""
    return (f"{t.tests} tests, {t.passed} passed, {t.failures} failed, {t.errors} errors, "
            f"{t.skipped} skipped in {t.time_s:.1f} s{where}")


def render_tests_brief(report: Report) -> str:
    """The kit's suite in a few words (render_tests gives it in full)."""
    t = report.tests
    if t is None:
        return "not run by this report"
    errors = f", {t.errors} errors" if t.errors else ""
    return f"{t.passed} of {t.tests} passed, {t.failures} failed{errors}"


def render_patch_line(report: Report) -> str:
    """The change's size in view: each patch but the tests-only ones, which are a subset of the
    full patch (every patch's files are in the appendix)."""
    parts = [f"`{s.path}`: {len(s.files)} files, +{s.added} −{s.removed}" for s in report.patches
             if not s.base_label.endswith("-tests")]
    if not parts:
        return "No patch in `patches/` yet (`detgrid patch --pytorch PATH` writes one)."
    return "; ".join(parts) + "."


def render_code_size(report: Report, brief: bool = False) -> str:
    """The core's machine code, only from the kit's own count; '' without it. ``brief`` leaves
    out the arch and what the count includes (the comment's table says them once)."""
    m = report.machine_code
    if m is None:
        return ""
    if brief:
        return f"{m.kernels} kernels, {m.text_bytes / 2**20:.2f} MiB of `.text`"
    of = f"{m.arch} " if m.arch else ""
    return f"{m.kernels} kernels (CUB's included), {m.text_bytes / 2**20:.2f} MiB of {of}`.text`"


def render_machine_code(report: Report) -> str:
    """The size sentence, only from the kit's own count; '' without it."""
    size = render_code_size(report, brief=True)
    of = f", {report.machine_code.arch}" if size and report.machine_code.arch else ""
    return f"The new file{of}: {size}." if size else ""


def render_checkout(report: Report) -> str:
    c = report.checkout
    if c is None:
        return "`detgrid patch --check`: not run by this report (no `--pytorch PATH`)."
    lint = "clean" if not c.lint else "; ".join(c.lint)
    # the file count and list, and the path, are in the appendix
    verdict = re.sub(r": \d+ files$", "", c.check.split(" (", 1)[0])
    return f"`detgrid patch --check` ({c.base_label}): {verdict}; lint: {lint}."


def render_installed_doc(report: Report) -> str:
    """Which list of the installed torch's use_deterministic_algorithms docstring names CUDA
    grid_sample, as this report read it."""
    where = {"throw": "under *throw*", "act": "as deterministic"}.get(report.installed_doc, "in neither list")
    return (f"The installed torch {report.environment.get('torch')}'s `use_deterministic_algorithms` "
            f"docstring lists CUDA grid_sample {where} (read by this report).")


def render_collect_env(report: Report) -> str:
    """collect_env where it describes a GPU set-up; from a machine without one it says nothing
    about the CUDA path, so only the one-line signature is kept."""
    if not report.environment.get("cuda_available"):
        return (f"Made on {signature(report.environment)}; collect_env left out (no GPU here, "
                f"so it describes no CUDA set-up).\n\n{ENV_BEGIN}{ENV_END}")
    return f"Made on {signature(report.environment)}.\n\n{ENV_BEGIN}\n{_fence(report.collect_env)}\n{ENV_END}"


def mask_volatile(text: str) -> str:
    """The collect_env block (machine-specific) replaced by its markers."""
    return re.sub(re.escape(ENV_BEGIN) + ".*?" + re.escape(ENV_END), ENV_BEGIN + ENV_END, text, flags=re.S)


# --------------------------------------------------------------------------- ISSUE.md

EXPECTED = "No error; the same grad_input bits on every run."
PROPOSAL = ("Sort grad_input's contributions by destination and sum each in a fixed order, no float "
            "atomics, so it is bitwise reproducible; calls needing only grad_grid keep today's kernel.")
QUESTION = f"#196856 (open on {CHECKED_ON}) also sorts: should this kit's tests join it?"


def render_failure(report: Report) -> str:
    message, _ = stock_error(report)
    return f"CUDA backward: `RuntimeError: {first_sentence(message)}`"


def render_gpu_brief(report: Report) -> str:
    """The issue's status: whether the CUDA kernels have run on a GPU and were correct there (the
    timings are the PR's)."""
    b = gpu_results(report)
    if b is None:
        return "Never run on a GPU."
    measured = [r for r in b.data.get("workloads", []) if r.get("status") == "measured"]
    wrong = sum(1 for r in measured if not r.get("correct"))
    return f"Run on {b.data.get('device_name')}: {len(measured)} workloads, {wrong} incorrect."


def render_issue_details(report: Report) -> str:
    message, source = stock_error(report)
    return render_details("The full error, this report's runs, the environment", "\n\n".join([
        f"The error, {source}:",
        _fence("RuntimeError: " + message),
        render_installed_doc(report),
        *(render_claims_list(r) for r in report.repro),
        render_collect_env(report),
    ]))


def render_issue(report: Report) -> str:
    """A comment on #68959 with an issue's four parts in view (what fails, a repro, the expected
    behaviour, the proposal), then the status and one question; the evidence collapsed."""
    agent = "\n\n".join([
        f"**What fails.** {render_failure(report)}",
        "**Repro.**\n\n" + _fence(REPRO, "python"),
        f"**Expected.** {EXPECTED}",
        f"**Proposal.** {PROPOSAL}",
        " ".join(filter(None, ["**Status.**", render_gpu_brief(report), render_repro_failures(report)])),
        f"**Question.** {QUESTION}",
        render_issue_details(report),
    ])
    return render_body(report, "ISSUE.md", [], agent)


# --------------------------------------------------------------------------- PR.md


def render_problem(report: Report) -> str:
    """What fails today, in one paragraph, and #196856 in one sentence."""
    return ("In deterministic mode grid_sample's CUDA backward raises when grad_input is "
            "requested: its `atomicAdd` order varies between runs. #196856 also sorts; a comment there "
            "compares both.")


# The core as GridSamplerDeterministic.cu's Note [Deterministic grid_sampler backward] and the
# branch in GridSampler.cu state it, for a reviewer's first read.
APPROACH = "\n".join([
    ("In deterministic mode a new `GridSamplerDeterministic.cu` computes grad_input, and the "
     "existing kernel grad_grid alone. Per chunk of ≤ 2^19 records:"),
    "",
    ("1. a thread per output point writes a record per tap, keyed by its grad_input position "
     "(taps and weights from the existing helpers);"),
    "2. `at::cuda::cub` radix-sorts the records; `unique_by_key` finds each key's run;",
    ("3. runs are summed in 256-record partials (all but a run's first in parallel); a thread "
     "per (run, channel) adds them in order."),
    "",
    ("The same terms as the existing kernel, up to FMA contraction, summed in another order; "
     "32-bit keys and indices where `canUse32BitIndexMath` allows."),
])

CUDNN_COMMIT = (
    "A second commit keeps `grid_sampler()` off cuDNN in deterministic mode "
    "(`cudnn_grid_sampler_backward` alerts there, #180417).")


def render_speed_steps() -> str:
    """The cuDNN commit's sentence, with the stack's speed levels, which follow as commits of
    their own."""
    steps = ", ".join(f"`{p.patch}`" for p in UPSTREAM_STACK if p.speed_level)
    return CUDNN_COMMIT + (f" Speed steps follow: {steps}." if steps else "")


def render_approach(report: Report) -> str:
    size = " ".join(part for part in [render_patch_line(report), render_machine_code(report)] if part)
    return "\n\n".join(part for part in [APPROACH, render_speed_steps(), size] if part)


# What the kit runs on CPU (no GPU): the core's host build against the existing kernel's
# arithmetic (tests/test_core.py) and its goldens (tests/test_core_golden.py).
CPU_PROOF = (
    "On CPU, `tests/test_core.py` checks the `.cu`'s host build against the existing kernel's "
    "arithmetic run serially, and golden digests.")


def render_test_plan(report: Report) -> str:
    known = [n for n in (report.checkout.notes if report.checkout else []) if "will fail" in n]
    return "\n".join([
        _fence("python test/test_nn.py -k grid_sample\n"
               "python test/test_torch.py -k test_nondeterministic_alert_grid_sample", "sh"),
        "",
        ("Not run (`@onlyCUDA`, no GPU); `detgrid patch --tests-only` writes them as a "
         "conformance suite."),
        "",
        CPU_PROOF,
        *([""] if report.checkout or report.tests or report.failed else []),
        *([f"- {render_checkout(report)}"
           + (f" {len(known)} upstream test(s) fail as written (appendix)." if known else "")]
          if report.checkout else []),
        *([f"- The kit's suite: {render_tests_brief(report)}."] if report.tests else []),
        *([f"- {render_repro_failing(report)}"] if report.failed else []),
    ])


def render_repro_failing(report: Report) -> str:
    """The failing or broken repro scripts in one line (a script without claims shows its
    stderr's end); the claims of all of them are in the appendix."""
    return "Repro: " + "; ".join(render_claims(r) for r in report.failed) + "."


# What changes for users (fix_issue.md's BC section), both commits'.
BC_STATEMENT = "\n".join([
    "- No API change; outside deterministic mode nothing changes.",
    "- `warn_only=True` takes the new path silently; gradients equal the old up to rounding.",
    "- Grid-only calls (the existing kernel) no longer alert.",
    "- Deterministic-mode forwards leave cuDNN, so their bits can change.",
    "- Half/BFloat16 grad_input: rounded once, not per atomic add.",
])


def _box(done: bool) -> str:
    return "[x]" if done else "[ ]"


def render_checklist(report: Report) -> str:
    return "\n".join([
        f"- {_box(False)} `lintrunner -a` (not run)",
        f"- {_box(True)} docs",
    ])


def render_patch_tables(report: Report) -> List[str]:
    out = []
    for s in report.patches:
        rows = ["| file | + | − |", "|---|---|---|"]
        rows += [f"| `{f.path}`{' (new)' if f.new else ''} | {f.added} | {f.removed} |" for f in s.files]
        base = f", base commit {s.commit}" if s.commit else ""
        out.append(f"`{s.path}` ({s.base_label}{base}):\n\n" + "\n".join(rows))
    return out


# Where the core's sums may differ from the existing kernel's beyond their order.
FMA_NOTE = (
    "FMA contraction: each term is the existing kernel's expression, but nvcc contracts the core's "
    "`acc += w * g` into one fused multiply-add, where the existing kernel rounds `w * g` before "
    "its `atomicAdd`.")


def render_appendix(report: Report) -> str:
    parts = [FMA_NOTE]
    parts += [render_claims_list(run) for run in report.repro]
    if report.checkout:
        parts.append(f"`detgrid patch --check` on `{report.checkout.path}`: {report.checkout.check}.")
    else:
        parts.append(render_checkout(report))
    parts.append(f"The kit's suite: {render_tests(report)}.")
    if report.machine_code:
        parts.append(f"Machine code: the core's entry in `{report.machine_code.path}`; a kernel "
                     "count includes the CUB kernels built in the unit.")
    if report.checkout and report.checkout.notes:
        parts.append("`detgrid patch --check`'s notes on the checkout:\n\n"
                     + "\n".join(f"- {_cell(n)}" for n in report.checkout.notes))
    parts += render_patch_tables(report)
    table = render_bench_table(report)
    if table:
        b = gpu_results(report)
        parts.append(f"GPU timing, `{b.path}` (torch {b.data.get('torch')}):\n\n" + table)
    parts.append(render_collect_env(report))
    return render_details("Appendix: FMA contraction, the repro scripts' claims, the patch's files, "
                          "the environment",
                          "\n\n".join(parts))


def render_pr(report: Report) -> str:
    """The core's PR body: Fixes, the problem, the approach, test plan, GPU timing, memory,
    BC-breaking and checklist in view; the evidence in one collapsed appendix."""
    agent = "\n".join([
        "#### Problem", "", render_problem(report), "",
        "#### Approach", "", render_approach(report), "",
        "#### Test plan", "", render_test_plan(report), "",
        "#### GPU timing", "", render_gpu_status(report), "",
        "#### Memory", "", MEMORY, "",
        "#### BC-breaking", "", BC_STATEMENT, "",
        "#### Checklist", "", render_checklist(report), "",
        render_appendix(report),
    ])
    return render_body(report, "PR.md", ["Fixes #68959", ""], agent)


# --------------------------------------------------------------------------- COMMENT_196856.md

# #196856 as its description stood when checked (CHECKED_ON; shared/UPSTREAM.md): its Agent
# Report's route, and that it carries benchmarks (cited, not restated).
DESCRIPTION_196856 = (
    f"Your description (read {CHECKED_ON}) makes the path opt-in: atomics and cuDNN stay the "
    "default, the cuDNN backward hands over in deterministic mode, with GB300 benchmarks.")
# Its code as stored: an earlier version of its branch (shared/UPSTREAM.md, "#196856's code, as
# stored"), built by the kit for sm_90 against torch 2.14.1's headers.
SIDE_BY_SIDE_READ = "2026-12-05"
CODE_196856 = {"lines": 374, "size": "20 kernels, 0.42 MiB of `.text`"}
STORED_196856 = (
    f"The table reads older code ({SIDE_BY_SIDE_READ}), which took the path for every call with "
    "grad_input, deterministic or not.")
# Row by row: its stored code, then this kit's core (GridSamplerDeterministic.cu). Facts of
# design only: neither has been timed. The first row, the size, is rendered from the counts.
SIDE_BY_SIDE = (
    ("Records per chunk", "≤ 2^20", "≤ 2^19"),
    ("Sort key + id", "int64 + int64", "int32 where `canUse32BitIndexMath`, else int64; + int32"),
    ("Partials", "256 records, runs > 256 only, payload ≤ 64 MiB", "256 records, every run"),
    ("Buffers", "`at::empty`, filled in deterministic mode",
     "caching allocator, unfilled; ≤ 64 MiB plus CUB's own"),
    ("Half sums across chunks", "rounded into grad_input per chunk", "float scratch, rounded once"),
    ("grad_grid", "a copy of the existing kernel, atomics removed", "the existing kernel, grad_input off"),
)
SIDE_BY_SIDE_ROWS = ("New code", *(row[0] for row in SIDE_BY_SIDE))

# The same comparison in full, for the comment's appendix: where each side's facts come from.
SIDE_BY_SIDE_SOURCES = (
    f"#196856's column is read from its stored code, an earlier version of its branch (read "
    f"{SIDE_BY_SIDE_READ}): int64 keys and int64 record ids, an int64 grad_output offset per point "
    "and a scalar_t weight per record (two for bicubic); chunks of at most 2^20 records; runs "
    "longer than 256 records split into 256-record partials when their payload fits 64 MiB, "
    "reduced in order; buffers from `at::empty`, which deterministic mode fills; each chunk adds "
    "into the zero-filled grad_input in scalar_t; grad_grid from a copy of the existing kernel "
    "with its atomic part removed; its size as the kit built it for sm_90 against torch 2.14.1's "
    "headers, as the core's. The core's column is `GridSamplerDeterministic.cu` (Note [Deterministic "
    "grid_sampler backward]): int32 keys and index math where `canUse32BitIndexMath` allows, "
    "else int64, int32 record ids; chunks of at most 2^19 records, fewer beyond 256 channels; "
    "every run summed in 256-record partials, those after its first in parallel; buffers from "
    "the caching allocator, sized for one chunk from the shapes, within 64 MiB as the kit counts "
    "them (CUB's temporary storage, allocated inside `at::cuda::cub`, is not in that count); "
    "half and bfloat16 sums over several chunks in a float scratch of grad_input's size, rounded "
    "once; grad_grid from the existing kernel with grad_input not requested. Neither "
    "implementation has been timed against the other.")

# What this kit's core does that #196856 could take, each with its evidence: the upstream tests
# (`detgrid patch --tests-only`, not run: no GPU) and the kit's CPU tests of the core.
DELTAS = "\n".join([
    ("- Grid-only calls (`output_mask[0]` false) in deterministic mode: the existing kernel, no "
     "sort, no alert (`test_grid_sample_backward_deterministic_grid_only`)."),
    ("- Half/BFloat16 sums over chunks kept in float, rounded once (the kit's "
     "`test_sums_over_several_chunks_match_the_float64_sum`)."),
    "- 32-bit keys where they fit: 8 bytes per sorted item, not 16.",
    ("- Caching-allocator workspace, bounded and unfilled, where deterministic mode fills "
     "`at::empty` (the kit's `test_workspace_stays_within_64_mib`)."),
])

TESTS_OFFER = (
    "`detgrid patch --tests-only` writes the kit's upstream tests "
    "(`patches/v2.6.0-tests.patch`), offered as a conformance suite; `@onlyCUDA`, not yet run "
    "on a GPU.")


def render_side_by_side(report: Report) -> str:
    """#196856's stored code beside the core, as a table; no speed either way."""
    ours = "; ".join(part for part in [
        f"{report.core_lines} lines" if report.core_lines is not None else "",
        render_code_size(report, brief=True)] if part) or "-"
    theirs = f"{CODE_196856['lines']} lines; {CODE_196856['size']}"
    rows = ["| | #196856, stored | this kit's core |", "|---|---|---|",
            f"| New code | {theirs} | {ours} |"]
    rows += [f"| {what} | {theirs} | {ours} |" for what, theirs, ours in SIDE_BY_SIDE]
    return "\n".join(rows)


def render_machine_code_source(report: Report) -> str:
    m = report.machine_code
    arch = f" ({m.arch})" if m.arch else ""
    return f"The core's size: its entry in `{m.path}`{arch}."


def render_comment_details(report: Report) -> str:
    return render_details("Where each column comes from, the environment", "\n\n".join([
        SIDE_BY_SIDE_SOURCES,
        *([render_machine_code_source(report)] if report.machine_code else []),
        ("Kernel counts include the CUB kernels built in each unit; both call libtorch's radix "
         "sort (`at::cuda::cub::radix_sort_pairs`)."),
        render_collect_env(report),
    ]))


def render_comment_196856(report: Report) -> str:
    """A comment on #196856: its description and its stored code beside this kit's core, row by
    row (facts of design, neither timed), the kit's tests offered as a conformance suite, and
    the deltas with their evidence."""
    agent = "\n\n".join([
        "detgrid, a kit for #68959, also sorts. Below, its core beside this PR, by design (neither was timed).",
        f"{DESCRIPTION_196856} {STORED_196856}",
        render_side_by_side(report),
        f"**Tests.** {TESTS_OFFER}",
        "**Deltas to consider:**\n\n" + DELTAS,
        render_comment_details(report),
    ])
    return render_body(report, "COMMENT_196856.md", [], agent)


# --------------------------------------------------------------------------- CLI

BODIES = {"ISSUE.md": render_issue, "PR.md": render_pr, "COMMENT_196856.md": render_comment_196856}
# Visible words (visible_words) each body may hold: a maintainer's few lines on the issue, a PR
# body short enough that fix_issue.md does not count it as spam, and a comment of a few lines.
WORD_LIMITS = {"ISSUE.md": 150, "PR.md": 400, "COMMENT_196856.md": 300}


def check_out_dir(out: Path) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out} is a file; give a directory")
    parent = out if out.exists() else out.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ReportError(f"--out {out}: {parent} is not a writable directory")
    return out


def write(report: Report, out_dir: Path) -> Dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(exist_ok=True)
    paths = {}
    for name, render in BODIES.items():
        paths[name] = out_dir / name
        tmp = paths[name].with_name(f".{name}.tmp")
        tmp.write_text(render(report), encoding="utf-8")
        os.replace(tmp, paths[name])
    return paths


def render_length(name: str, text: str) -> str:
    """A body's visible words against its limit; long human notes can push it over."""
    words, limit = visible_words(text), WORD_LIMITS[name]
    return f"{words} words in view, limit {limit}{', OVER THE LIMIT' if words > limit else ''}"


def run(args: argparse.Namespace) -> int:
    from detgrid.kit import patch

    try:
        out = check_out_dir(Path(args.out) if args.out else KIT_ROOT)
        if args.final and not read_notes(args.notes):
            raise ReportError("--final: the submitter's notes are empty (pass --notes FILE with your own "
                              "words); the bodies stay drafts until then")
        report = gather(pytorch=args.pytorch, junit=args.junit, notes=args.notes)
        paths = write(report, out)
    except (ReportError, patch.AnchorError, OSError) as e:
        print(f"detgrid report: {e}", file=sys.stderr)
        return 2
    for r in report.repro:
        print(f"{r.command}: exit {r.exit_code} ({r.status})")
    print(f"tests: {render_tests(report)}")
    for name, path in paths.items():
        print(f"wrote {path} ({render_length(name, path.read_text(encoding='utf-8'))}"
              f"{', DRAFT' if report.draft else ''})")
    # The files are written either way; a failed claim or a broken script is the exit code.
    return 1 if report.failed else 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="run the repro scripts, collect the environment, test and benchmark results and the "
        "patch's stats, and write ISSUE.md (a comment on #68959), PR.md and COMMENT_196856.md (a "
        "comment on #196856)",
    )
    p.add_argument("--pytorch", metavar="PATH",
                   help="a PyTorch checkout: `detgrid patch --check` on it, in a temporary copy")
    p.add_argument("--out", metavar="DIR",
                   help="where ISSUE.md, PR.md and COMMENT_196856.md go (default: the kit's root)")
    p.add_argument("--junit", metavar="FILE",
                   help="a junit XML from `pytest --junitxml FILE`: its summary goes in the test plan")
    p.add_argument("--notes", metavar="FILE",
                   help="the submitter's own notes (Markdown): the bodies' \"Human notes\"; without "
                   "them every body is marked DRAFT")
    p.add_argument("--final", action="store_true",
                   help="refuse (before running anything) unless --notes gives non-empty notes")
    p.set_defaults(handler=run)
    return p
