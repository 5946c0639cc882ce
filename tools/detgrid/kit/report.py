"""``detgrid report``: the upstream issue body (a comment on #68959) and a PR body, from real runs.

``gather()`` collects the evidence (``torch.utils.collect_env``, the repro scripts' ``--json`` output
and exit codes, an optional pytest junit summary, the newest benchmark results, the patch's stats,
``detgrid patch --check`` on a checkout) into a ``Report``; ``render_issue()`` and ``render_pr()``
turn it into ``ISSUE.md`` (about 300 words in the shape of PyTorch's feature-request template,
headed by where to post it: a comment on #68959, since a new issue would duplicate it) and ``PR.md``
(PyTorch's PR body: ``Fixes``, summary, the patch's lines per component, test plan, benchmarks, BC
statement, checklist; the long output collapsed in one appendix).

Claims are measured here or cited with what was checked and when; what could not be gathered (no
GPU, tests not run, no benchmark results) is said as such. Per PyTorch's ``AI_POLICY.md`` every
body holds its generated text in a quote, under a disclosure, after a "Human notes" section for the
submitter's own words (``--notes FILE``); without them the body is marked DRAFT, and ``--final``
refuses. The output holds no timestamps: on one machine it is a pure function of the kit, the
environment and the notes.
"""

import argparse
import collections
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

KIT_ROOT = Path(__file__).resolve().parents[3]
REPRO_SCRIPTS = ("show_error.py", "show_nondeterminism.py", "show_fix.py")
EXIT_MEANING = {0: "claims held", 1: "FAILED", 77: "not checkable here"}
ENV_BEGIN, ENV_END = "<!-- collect_env: begin -->", "<!-- collect_env: end -->"

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
        return str(self.data.get("device", "cpu")) != "cpu"


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
    # component_lines(): the kernel files' lines per component, core path first
    components: List[Tuple["Component", int]] = field(default_factory=list)

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
    """Everything the bodies say. The arguments are read and checked first: a bad --junit,
    --notes or --pytorch fails before any script runs."""
    kit_root = Path(kit_root)
    tests = parse_junit(junit) if junit else None
    submitter_notes = read_notes(notes)
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
        components=component_lines(kit_root),
    )


# --------------------------------------------------------------------------- rendering helpers

# What was checked, and when, for each claim about upstream the bodies make (kit research notes,
# shared/UPSTREAM.md, 2026-12-01)
CHECKED_ON = "2026-12-01"
PR_196856_STATE = (f"an open PR as far as checked (its stored thread, read {CHECKED_ON}, shows it open "
                   "with no reviews)")
MAIN_UNKNOWN = ("Whether commit 2046ae1a, which carries #196856's tests and docs, is on main is "
                "unknown.")
RELEASE_215 = (f"the 2.15.0 wheel's docstring lists CUDA grid_sample under *throw* (kit research "
               f"notes, {CHECKED_ON})")
NUMBERS_196856 = ("#196856's description reports, on a GB300: 2.00x faster at C=1024 channels-first, "
                  "1.07x channels-last, and \"ordinary small-channel images become slower\"")
# Context::alertNotDeterministic's message in v2.6.0 (aten/src/ATen/Context.cpp), for the 2-D op
ALERT_TEXT = (
    "grid_sampler_2d_backward_cuda does not have a deterministic implementation, but you set "
    "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
    "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
    "application. You can also file an issue at https://github.com/pytorch/pytorch/issues to help "
    "us prioritize adding deterministic support for this operation.")

AI_DISCLOSURE = (
    "**AI-generated.** Everything in this quote was written by an AI coding assistant, through "
    "the kit's `detgrid report`, from the runs it names. The human commentary is \"Human notes\" "
    "above; the submitter answers for all of it (PyTorch's `AI_POLICY.md`).")
NOTES_PLACEHOLDER = ("<!-- The submitter's own words: what you reviewed and ran yourself, and why "
                     "you believe the change is right. `detgrid report --notes FILE` puts FILE here; "
                     "until then this body is a draft. -->")
DRAFT_BANNER = ("**DRAFT, not for {what}:** \"Human notes\" is empty. Pass `detgrid report --notes FILE` "
                "with the submitter's own words.")

SNIPPET = """\
import torch
import torch.nn.functional as F

torch.use_deterministic_algorithms(True)
x = torch.randn(2, 8, 32, 32, device="cuda", requires_grad=True)
theta = torch.tensor([[0.25, 0.0, 0.0], [0.0, 0.25, 0.0]], device="cuda").expand(2, 2, 3)
grid = F.affine_grid(theta, (2, 8, 128, 128), align_corners=False)  # zoom-in: many samples per pixel
F.grid_sample(x, grid, align_corners=False).sum().backward()  # RuntimeError on CUDA"""


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


def visible_words(text: str) -> int:
    """Words a reader sees without opening a collapsed <details>: HTML comments and <details>
    blocks aside, counting tokens that hold a letter or digit (not quote markers or pipes)."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"<details>.*?</details>", " ", text, flags=re.S)
    return sum(1 for token in text.split() if re.search(r"[0-9A-Za-z]", token))


def signature(env: Dict[str, Any]) -> str:
    """The set-up a report was made on, one line (rendered into both bodies)."""
    device = f"CUDA device {env['device_name']}" if env["cuda_available"] else "no CUDA device"
    return (f"torch {env['torch']}, Python {env['python']}, {device}, "
            f"{env['machine']} CPU ({env['cpu_capability']})")


def provenance(report: Report, what: str, where: str) -> str:
    return (f"<!-- {what}: {where}. Generated by `detgrid report` (tools/detgrid/kit/report.py) on "
            f"{signature(report.environment)}. Regenerate it rather than editing it. -->")


def render_human_notes(report: Report) -> str:
    return "### Human notes\n\n" + (report.submitter_notes or NOTES_PLACEHOLDER)


def _head(report: Report, what: str) -> List[str]:
    return [DRAFT_BANNER.format(what=what), ""] if report.draft else []


def render_claims(run: ScriptRun) -> str:
    counts = collections.Counter(c.get("status") for c in run.claims)
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no claims"
    head = f"`{run.command}`: exit {run.exit_code}, **{run.status}** ({tally})"
    if run.claims:
        return head
    tail = run.stderr.strip().splitlines()[-3:]
    return head + ("; stderr ends: `" + " / ".join(tail) + "`" if tail else "")


def render_stock_error(report: Report) -> str:
    """The error text: captured by show_error.py on CUDA, verbatim, or the one the source composes."""
    run = next((r for r in report.repro if r.name == "show_error.py"), None)
    data = run.data if run else None
    if data and data.get("device") == "cuda" and data.get("error_message"):
        return (f"Captured by `python repro/show_error.py` on {data.get('device_name')} "
                f"(torch {data.get('torch')}), verbatim:\n\n" + _fence("RuntimeError: " + data["error_message"]))
    why = "show_error.py did not run" if run is None else f"`repro/show_error.py`: {run.status}"
    return (f"Not captured on this machine ({why}: no CUDA device). The message "
            "`Context::alertNotDeterministic` composes for it (v2.6.0's "
            "`aten/src/ATen/Context.cpp`):\n\n" + _fence("RuntimeError: " + ALERT_TEXT))


def render_bench_summary(report: Report) -> str:
    b = report.bench
    if b is None or not b.on_gpu:
        have = "none" if b is None else f"only a CPU smoke run of the harness (`{b.path}`)"
        return f"not measured: no GPU benchmark results yet (`benchmarks/results/` holds {have})."
    d = b.data
    s = d.get("summary", {})
    measured = [r for r in d.get("workloads", []) if r.get("status") == "measured"]
    return (f"Measured on {d.get('device_name')} (torch {d.get('torch')}, `{b.path}`): det/stock "
            f"geomean {_fmt(s.get('geomean'))}, worst {_fmt(s.get('worst'))}, over {len(measured)} "
            f"workloads; {sum(1 for r in measured if not r.get('correct'))} incorrect.")


def render_bench_table(report: Report) -> str:
    b = report.bench
    if b is None or not b.on_gpu:
        return ""
    rows = ["| # | workload | stock route | stock ms | det ms | det/stock | extra MiB | correct |",
            "|---|---|---|---|---|---|---|---|"]
    for r in b.data.get("workloads", []):
        if r.get("status") != "measured":
            why = r.get("skip_reason") or r.get("error") or ""
            rows.append(f"| {r.get('row')} | {r.get('name')} | {_cell(r.get('status'))}: {_cell(why)} | | | | | |")
            continue
        v = r.get("variants", {})
        route = r.get("stock_route", "native")
        stock_ms = (v.get(route) or v.get("native") or {}).get("median_ms")
        rows.append(f"| {r.get('row')} | {r.get('name')} | {route} | {_fmt(stock_ms)} | "
                    f"{_fmt((v.get('detgrid') or {}).get('median_ms'))} | {_fmt(r.get('ratio'))} | "
                    f"{_fmt(r.get('extra_peak_mib'))} | {'yes' if r.get('correct') else 'NO'} |")
    plot = f"\n\n![det/stock per workload]({b.png})" if b.png else ""
    return "\n".join(rows) + plot


def render_tests(report: Report) -> str:
    t = report.tests
    if t is None:
        return "not run by this report (pass `--junit FILE` from `pytest --junitxml FILE`)"
    return (f"{t.tests} tests, {t.passed} passed, {t.failures} failed, {t.errors} errors, "
            f"{t.skipped} skipped in {t.time_s:.1f} s (junit `{os.path.basename(t.source)}`)")


def render_patch_line(report: Report) -> str:
    parts = [f"`{s.path}`: {len(s.files)} files, +{s.added} −{s.removed}" for s in report.patches]
    if not parts:
        return "No patch in `patches/` yet (`detgrid patch --pytorch PATH` writes one)."
    return "; ".join(parts) + "."


def render_checkout(report: Report) -> str:
    c = report.checkout
    if c is None:
        return "`detgrid patch --check`: not run by this report (no `--pytorch PATH`)."
    lint = "clean" if not c.lint else "; ".join(c.lint)
    verdict = c.check.split(" (", 1)[0]  # the file list is in the appendix
    return (f"`detgrid patch --check` on `{c.path}` ({c.base_label}): {verdict}. The checkout's grep "
            f"linters on the new files: {lint}.")


def render_claims_list(run: ScriptRun) -> str:
    """A repro script's claims, one line each; its raw JSON (with every run's hash) stays out."""
    head = f"`{run.command}` (exit {run.exit_code}, {run.status}):"
    if not run.claims:
        tail = (run.stderr or run.stdout or "(no output)").strip().splitlines()[-3:]
        return head + "\n\n" + _fence("\n".join(tail))
    return head + "\n\n" + "\n".join(
        f"- {_cell(c.get('claim'))}: **{_cell(c.get('status'))}** ({_cell(c.get('detail'))})"
        for c in run.claims)


def render_appendix(report: Report) -> str:
    parts = [render_claims_list(run) for run in report.repro]
    if report.checkout:
        parts.append(f"`detgrid patch --check`: {report.checkout.check}.")
    if report.checkout and report.checkout.notes:
        parts.append("`detgrid patch --check`'s notes on the checkout:\n\n"
                     + "\n".join(f"- {_cell(n)}" for n in report.checkout.notes))
    for s in report.patches:
        rows = ["| file | + | − |", "|---|---|---|"]
        rows += [f"| `{f.path}`{' (new)' if f.new else ''} | {f.added} | {f.removed} |" for f in s.files]
        base = f", base commit {s.commit}" if s.commit else ""
        parts.append(f"`{s.path}` ({s.base_label}{base}):\n\n" + "\n".join(rows))
    table = render_bench_table(report)
    if table:
        parts.append("Benchmarks:\n\n" + table)
    parts.append(render_collect_env(report))
    return render_details("Appendix: the repro scripts' claims, the patch's files, the environment",
                          "\n\n".join(parts))


def mask_volatile(text: str) -> str:
    """The collect_env block (machine-specific) replaced by its markers."""
    return re.sub(re.escape(ENV_BEGIN) + ".*?" + re.escape(ENV_END), ENV_BEGIN + ENV_END, text, flags=re.S)


def _installed_release_line(report: Report) -> str:
    torch_v = report.environment.get("torch")
    if report.installed_doc == "throw":
        return f"so does the installed torch {torch_v}'s (read by this report)"
    where = "as deterministic" if report.installed_doc == "act" else "in neither list"
    return f"the installed torch {torch_v}'s lists it {where} (read by this report)"


# --------------------------------------------------------------------------- ISSUE.md

WHERE_TO_POST = (
    "**Where to post:** as a comment on #68959 (\"Deterministic implementation for "
    "grid_sampler_2d_backward_cuda\", open since 2021). A new issue would duplicate it; #152171 "
    "and #179123, filed for the same request, were closed.")


def _cuda_equals_host(report: Report) -> str:
    """The CUDA == host equality is a design property until a GPU has compared them."""
    if report.environment.get("cuda_available"):
        return "this report did not compare them; the kit's `tools/gpu_check.sh` does"
    return "not yet measured: the kit's GPU check, which compares them, has not run"


def render_details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def render_collect_env(report: Report) -> str:
    """collect_env where it describes a GPU set-up; from a machine without one it says nothing
    about the CUDA path, so only the one-line signature is kept."""
    if not report.environment.get("cuda_available"):
        return (f"Made on {signature(report.environment)}; collect_env left out (no GPU here, "
                f"so it describes no CUDA set-up).\n\n{ENV_BEGIN}{ENV_END}")
    return f"Made on {signature(report.environment)}.\n\n{ENV_BEGIN}\n{_fence(report.collect_env)}\n{ENV_END}"


def render_issue(report: Report) -> str:
    """The body of a comment on #68959, in the shape of PyTorch's feature-request template."""
    agent = "\n".join([
        AI_DISCLOSURE,
        "",
        "### 🚀 The feature, motivation and pitch",
        "",
        "Under `torch.use_deterministic_algorithms(True)`, the CUDA backward of "
        "`F.grid_sample` raises, because grad_input is accumulated with `atomicAdd`; with "
        "`warn_only=True` its bits change from run to run.",
        "",
        _fence(SNIPPET, "python"),
        "",
        "Expected: the same gradient bits on every run. Proposed: sort the contributions by "
        "destination (`at::cuda::cub`) and reduce them with one writer per grad_input element, "
        "in an order fixed by shapes and grid values, in bounded workspace. "
        f"A patch: {render_patch_line(report)}",
        "",
        "### Alternatives",
        "",
        f"- #196856, {PR_196856_STATE}, takes the same road. What this patch's tests check, on "
        "its CPU executor, beyond the bits repeating (not compared with #196856, whose code was "
        "not run): a grid-only backward with no sort and no alert, NaN/Inf grids that form no "
        "index (#24823), and bits that do not change with the chunk size.",
        "- `warn_only=True`, or the backward on the CPU: nondeterministic bits, or slow.",
        "",
        "### Additional context",
        "",
        f"Benchmarks: {render_bench_summary(report)} The CPU executor runs the same pipeline "
        f"code, built to reproduce the CUDA result bit for bit ({_cuda_equals_host(report)}). "
        f"{MAIN_UNKNOWN}",
        "",
        render_details("Repro scripts and environment",
                       "\n\n".join([*(render_claims_list(r) for r in report.repro),
                                    render_collect_env(report)])),
    ])
    out = [provenance(report, "ISSUE.md", "a comment on #68959"),
           *_head(report, "posting"),
           WHERE_TO_POST, "",
           render_human_notes(report), "", "### Agent report", "", _quote(agent), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- the patch's components

KERNEL_DIR = "aten/src/ATen/native/cuda"


@dataclass
class Component:
    name: str
    definitions: Tuple[Tuple[str, str], ...]  # (kernel file, name of a top-level definition)
    why: str
    evidence: str  # begins with "measured" or "modelled"


# The optional parts of the kernel, each named by its definitions; "core path" is the rest of the
# kernel files. What each costs is its definitions' lines, comments above them included.
COMPONENTS = (
    Component("second (sparse) reduction",
              (("GridSamplerDeterministicPipeline.cuh", "MarkRunHeads"),
               ("GridSamplerDeterministicPipeline.cuh", "RecordRunStarts"),
               ("GridSamplerDeterministicPipeline.cuh", "ReduceSparse"),
               ("GridSamplerDeterministicPipeline.cuh", "RoundCarry")),
              "grids that touch few of many pixels: the dense reduce passes over every "
              "element of the images a chunk's points lie in, this one only over the "
              "chunk's records",
              "modelled: exact launch and item counts (`detgrid.ops.work_counters`); no GPU time"),
    Component("per-cell keying",
              (("GridSamplerDeterministicPipeline.cuh", "CellSegments"),
               ("GridSamplerDeterministicPipeline.cuh", "make_cell_segments"),
               ("GridSamplerDeterministic.cuh", "cell_key"),
               ("GridSamplerDeterministic.cuh", "MergedCellRecords")),
              "bilinear/trilinear sort one item per point instead of 4 (8), with the same bits",
              "modelled: 4x (8x) fewer sort items counted by `work_counters`; no GPU time"),
    Component("channels-fastest gather",
              (("GridSamplerDeterministicPipeline.cuh", "kChannelsFastestFrom"),
               ("GridSamplerDeterministicPipeline.cuh", "prefers_channels_fastest"),
               ("GridSamplerDeterministicPipeline.cuh", "ReduceDenseChannelsFastest"),
               ("GridSamplerDeterministicPipeline.cuh", "GatherChannelsLast")),
              "from 16 channels a warp reads one point's grad_output contiguously and shares "
              "one merge",
              "modelled: 32-byte sectors per warp (the comment at kChannelsFastestFrom); no GPU "
              "time"),
    Component("NaN/Inf guards",
              (("GridSamplerDeterministic.cuh", "kMaxSafeCoordinate"),
               ("GridSamplerDeterministic.cuh", "is_safe_coordinate")),
              "a non-finite or huge coordinate forms no index (stock CPU segfaults, #24823)",
              "measured on CPU: `tests/test_nan_rule.py`; the guard's calls in the tap math are "
              "counted in the core"),
    Component("tricubic (5-D bicubic)",
              (("GridSamplerDeterministic.cu", "check_5d_input_and_grid"),),
              "accepts 5-D bicubic where the tree's check_grid_sampler_3d does; the math is the "
              "shared template's 3-D instance, no code of its own",
              "modelled: one more instantiation per dtype; leaving it out is rejecting mode 2 here"),
)


def _definition_span(lines: List[str], name: str) -> Optional[Tuple[int, int]]:
    """[start, end) of the top-level definition of `name`: from the comment and template lines
    above it to its closing brace (or the `;` of a one-line constant)."""
    pattern = re.compile(rf"^(?:[\w:<>,\s*&]*\s)?{re.escape(name)}\b(?!\s*::)")
    at = next((i for i, line in enumerate(lines)
               if not line.startswith((" ", "/", "#", "}")) and pattern.match(line)), None)
    if at is None:
        return None
    start = at
    while start > 0 and (lines[start - 1].startswith(("//", "template", "    typename", "    int ",
                                                     "    bool ", "    Keying"))
                         or lines[start - 1].startswith(">")):
        start -= 1
    depth, end, opened = 0, at, False
    while end < len(lines):
        code = re.sub(r"//.*", "", lines[end]).rstrip()
        depth += code.count("{") - code.count("}")
        opened = opened or "{" in code
        end += 1
        if (opened and depth == 0) or (not opened and code.endswith(";")):
            break
    return start, end


def component_lines(kit_root: Path = KIT_ROOT) -> List[Tuple[Component, int]]:
    """Lines of the kit's kernel files per component, core path first (the rest)."""
    texts = {}
    for path in sorted((Path(kit_root) / "aten_kernels" / KERNEL_DIR).glob("GridSamplerDeterministic*")):
        texts[path.name] = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for comp in COMPONENTS:
        count = 0
        for file, name in comp.definitions:
            span = _definition_span(texts.get(file, []), name)
            count += span[1] - span[0] if span else 0
        rows.append((comp, count))
    total = sum(len(lines) for lines in texts.values())
    core = Component("core path", (), "point pass, stable sort, dense reduce, chunk loop, "
                     "executor, launchers",
                     "measured on CPU: the kit's suite runs the same pipeline code; no GPU run yet")
    return [(core, total - sum(n for _, n in rows)), *rows]


# The patch's lines outside the kernel files, by where they are.
OUTSIDE_KERNEL = (
    Component("dispatch, cuDNN delegation, docs", (),
              "the launchers' branch, the cuDNN backward's delegation, docstring and notes",
              "measured: `.ci/intree_compile.sh` compiles the patched v2.6.0 units with nvcc 12.4"),
    Component("upstream tests", (),
              "test_nn.py, a test per path above; the alert tests expect none",
              "measured on CPU: the new ones run through the host executor (tests/test_upstream_tests.py); "
              "not yet on a GPU"),
)


def _outside_kernel_lines(stats: PatchStats) -> List[Tuple[Component, int]]:
    tests = sum(f.added for f in stats.files if f.path.startswith("test/"))
    kernel = sum(f.added for f in stats.files if f.path.startswith(f"{KERNEL_DIR}/GridSamplerDeterministic"))
    return [(OUTSIDE_KERNEL[0], stats.added - tests - kernel), (OUTSIDE_KERNEL[1], tests)]


def render_components(report: Report) -> str:
    rows = ["| component | lines | why it is there | argument |", "|---|---|---|---|"]
    outside = _outside_kernel_lines(report.patches[0]) if report.patches else []
    for comp, lines in [*report.components, *outside]:
        rows.append(f"| {comp.name} | {lines} | {_cell(comp.why)} | {_cell(comp.evidence)} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- PR.md


def render_summary(report: Report) -> str:
    return (
        "Adds a deterministic CUDA backward for `grid_sampler_2d` and `grid_sampler_3d`, taken "
        "in deterministic mode (`warn_only=True` included) when grad_input is requested; "
        "`cudnn_grid_sampler_backward` delegates to it after its argument checks, and no forward "
        "changes. Contributions are sorted (bilinear and trilinear: one key per point) and "
        "reduced with one writer per grad_input element, in an order fixed by shapes and grid "
        "values; the workspace is at most 64 MiB per chunk (plus a float carry of grad_input's size for "
        f"half/bfloat16 inputs needing several chunks). #196856, {PR_196856_STATE}, takes the same road. "
        "No release has a deterministic path: "
        f"{RELEASE_215}; {_installed_release_line(report)}. {MAIN_UNKNOWN}")


def render_test_plan(report: Report) -> str:
    return "\n".join([
        "Upstream tests, in the patched checkout:",
        "",
        _fence("python test/test_nn.py -k grid_sample\n"
               "python test/test_torch.py -k test_nondeterministic_alert_grid_sample", "sh"),
        "",
        "Not run: they need a CUDA build of the patched tree and a GPU; this report had neither. "
        "The added ones are `@onlyCUDA`; the patch carries no CPU-run test. The kit's "
        "`tools/gpu_check.sh` runs them against the extension build of the same sources.",
        "",
        f"- {render_checkout(report)}",
        *[f"- Known to fail: {n}" for n in (report.checkout.notes if report.checkout else []) if "will fail" in n],
        f"- The kit's suite (`python -m pytest tests`): {render_tests(report)}.",
        *[f"- {render_claims(r)}" for r in report.repro],
    ])


def _box(done: bool) -> str:
    return "[x]" if done else "[ ]"


def render_checklist(report: Report) -> str:
    gpu_bench = report.bench is not None and report.bench.on_gpu
    lint_clean = report.checkout is not None and not report.checkout.lint
    return "\n".join([
        f"- {_box(False)} `lintrunner -a` on the changed files (not run; the checkout's grep "
        f"linters on the new files: "
        f"{'clean' if lint_clean else 'not run' if report.checkout is None else 'findings'})",
        f"- {_box(True)} tests added (`test/test_nn.py`; the alert tests expect no alert)",
        f"- {_box(False)} upstream tests run on a GPU",
        f"- {_box(gpu_bench)} benchmarks on a GPU",
        f"- {_box(True)} docs: the `use_deterministic_algorithms` docstring and the "
        "reproducibility notes",
        f"- {_box(True)} BC-breaking statement below",
    ])


BC_STATEMENT = (
    "No API change. Outside deterministic mode nothing changes. In deterministic mode the CUDA "
    "backward of `grid_sampler_2d`/`grid_sampler_3d` and of `cudnn_grid_sampler` returns "
    "deterministic gradients where it raised; with `warn_only=True` it no longer warns, and its "
    "gradients, computed by the new kernel, equal the old ones up to floating-point rounding, not "
    "bit for bit. Forward results and the forward's route do not change.")


def render_pr(report: Report) -> str:
    """The PR body in PyTorch's shape: Fixes, summary, the patch's components, test plan,
    benchmarks, BC statement and checklist in view; long output in one collapsed appendix."""
    agent = "\n".join([
        AI_DISCLOSURE,
        "",
        "#### Summary",
        "",
        render_summary(report),
        "",
        "#### What the patch's lines are for",
        "",
        f"{render_patch_line(report)} Its added lines by component (the kernel's optional parts "
        "counted by their definitions; a reviewer can ask for any of them as a separate PR):",
        "",
        render_components(report),
        "",
        "#### Repro (stock torch, any CUDA GPU)",
        "",
        _fence(SNIPPET, "python"),
        "",
        render_stock_error(report),
        "",
        "#### Test plan",
        "",
        render_test_plan(report),
        "",
        "#### Benchmarks",
        "",
        render_bench_summary(report)[0].upper() + render_bench_summary(report)[1:]
        + " " + NUMBERS_196856 + ".",
        "",
        "#### BC-breaking",
        "",
        BC_STATEMENT,
        "",
        "#### Checklist",
        "",
        render_checklist(report),
        "",
        render_appendix(report),
    ])
    out = [provenance(report, "PR.md", "the body of the PR that fixes #68959"),
           *_head(report, "submission"),
           "Fixes #68959", "", render_human_notes(report), "", "### Agent report", "", _quote(agent), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI

BODIES = {"ISSUE.md": render_issue, "PR.md": render_pr}


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
        words = visible_words(path.read_text(encoding="utf-8"))
        print(f"wrote {path} ({words} words in view{', DRAFT' if report.draft else ''})")
    # The files are written either way; a failed claim or a broken script is the exit code.
    return 1 if report.failed else 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="run the repro scripts, collect the environment, test and benchmark results and the "
        "patch's stats, and write ISSUE.md (a comment on #68959) and PR.md",
    )
    p.add_argument("--pytorch", metavar="PATH",
                   help="a PyTorch checkout: `detgrid patch --check` on it, in a temporary copy")
    p.add_argument("--out", metavar="DIR", help="where ISSUE.md and PR.md go (default: the kit's root)")
    p.add_argument("--junit", metavar="FILE",
                   help="a junit XML from `pytest --junitxml FILE`: its summary goes in the test plan")
    p.add_argument("--notes", metavar="FILE",
                   help="the submitter's own notes (Markdown): the bodies' \"Human notes\"; without "
                   "them both bodies are marked DRAFT")
    p.add_argument("--final", action="store_true",
                   help="refuse (before running anything) unless --notes gives non-empty notes")
    p.set_defaults(handler=run)
    return p
