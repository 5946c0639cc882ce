"""The GPU check's report: the fragments that tools/gpu_check.sh's steps left
in its work folder (steps.tsv, *.json, the pytest junit xml) assembled into
one dict, a verdict per claim and overall, and gpu_check.json / gpu_check.md.

Needs neither torch nor the extension, so a report comes out of any run.
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Optional, Sequence


def junit_summary(path: str) -> Dict[str, Any]:
    """Counts and the failing tests of a pytest junit xml."""
    if not os.path.isfile(path):
        return {"present": False}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"present": True, "parse_error": str(e)}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    summary: Dict[str, Any] = {"present": True, "tests": 0, "failures": 0, "errors": 0,
                               "skipped": 0, "time_s": 0.0}
    for s in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            summary[key] += int(s.get(key, 0) or 0)
        summary["time_s"] += float(s.get("time", 0) or 0)
    summary["time_s"] = round(summary["time_s"], 1)
    summary["passed"] = summary["tests"] - summary["failures"] - summary["errors"] - summary["skipped"]
    failed = []
    for tc in root.iter("testcase"):
        for tag in ("failure", "error"):
            el = tc.find(tag)
            if el is not None:
                msg = (el.get("message") or el.text or "").strip().splitlines()
                failed.append({"test": f"{tc.get('classname')}::{tc.get('name')}",
                               "kind": tag, "message": (msg[0] if msg else "")[:300]})
    summary["failed"] = failed[:25]
    return summary


def read_steps(path: str) -> List[Dict[str, Any]]:
    """steps.tsv lines: name, status, rc, seconds, limit, note."""
    steps = []
    if not os.path.isfile(path):
        return steps
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if not parts or not parts[0]:
                continue
            parts += [""] * (6 - len(parts))
            name, status, rc, secs, limit, note = parts[:6]
            steps.append({
                "name": name, "status": status,
                "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                "seconds": int(secs) if secs.isdigit() else None,
                "limit_s": int(limit) if limit.isdigit() else None,
                "note": note,
            })
    return steps


def _load_json(path: str) -> Optional[Any]:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"unreadable {os.path.basename(path)}: {e}"}


# The steps whose results decide the verdict. Every other step (env, deps,
# exact, initcheck, timing) only reports: a lease rarely leaves a cold
# machine time for all of them, and a check that cannot finish in time must
# not hold back a PASS the required ones earned.
REQUIRED_STEPS = ("build", "kernels", "bitwise", "routes", "tests", "racecheck", "memcheck")
SANITIZER_STEPS = ("racecheck", "memcheck", "initcheck")


def _check(name: str, ok: Optional[bool], detail: str, required: bool = True) -> Dict[str, Any]:
    result = "n/a" if ok is None else ("pass" if ok else "fail")
    return {"check": name, "result": result, "detail": detail, "required": required}


def from_step(step: str, checks: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """checks, tagged with the step that made them; an optional step's
    checks never decide the verdict (a failing one is a finding)."""
    for c in checks:
        c["step"] = step
        c["required"] = c["required"] and step in REQUIRED_STEPS
    return checks


def verdict_checks(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """pass / fail / n/a for each claim the GPU check is there to make."""
    bw = data.get("bitwise") or {}
    sanitizer = data.get("sanitizer") or {}
    return (from_step("kernels", build_checks(data.get("build") or {}))
            + from_step("tests", cuda_test_checks(data.get("tests") or {}))
            + from_step("bitwise", repeat_checks(bw.get("repeat") or [])
                        + knob_checks(bw.get("knobs") or [])
                        + executor_checks(bw.get("executor") or [])
                        + core_checks(bw)
                        + fidelity_checks(bw.get("fidelity") or []))
            + from_step("routes", route_checks(data.get("routes") or {}))
            + from_step("exact", exact_checks(data.get("exact") or {}))
            + [c for tool in SANITIZER_STEPS
               for c in from_step(tool, [sanitizer_check(tool, sanitizer.get(tool))])]
            + from_step("timing", timing_checks(data.get("timing") or {})))


def build_checks(build: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The extension has CUDA kernels (n/a on a --device cpu run)."""
    if not build:
        return [_check("CUDA kernels built", None, "no build facts")]
    detail = f"has_cuda_kernels={build.get('has_cuda_kernels')} sass={build.get('sass_archs')}"
    if build.get("import_error"):
        detail += f"; {build['import_error'][:200]}"
    if not build.get("require_cuda", True):
        return [_check("CUDA kernels built", None, detail + " (cpu run)")]
    return [_check("CUDA kernels built", bool(build.get("has_cuda_kernels")), detail)]


def cuda_test_checks(tests: Dict[str, Any]) -> List[Dict[str, Any]]:
    """pytest -k cuda ran tests, and none failed."""
    if not (tests.get("present") and "tests" in tests):
        return [_check("CUDA tests", None, "no junit xml")]
    bad = tests["failures"] + tests["errors"]
    return [_check("CUDA tests", bad == 0 and tests["tests"] > 0,
                   f"{tests['passed']} passed, {tests['failures']} failed, "
                   f"{tests['errors']} errors, {tests['skipped']} skipped")]


def executor_checks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The device backward against the host executor: bit for bit where the
    dtype must be (float32, float64), informative elsewhere."""
    if not rows:
        return [_check("device == host executor", None, "not run")]
    checks = []
    for row in rows:
        exact = row.get("must_be_equal")
        ok = (row["bitwise_equal"] == row["cases"] and not row.get("errors")) if exact else (
            not row.get("errors"))
        checks.append(_check(
            f"device == host executor ({row['dtype']}, {row['dim']}-D)", ok,
            f"{row['bitwise_equal']}/{row['cases']} bitwise equal, max abs diff "
            f"{_fmt(row['max_abs_diff'])}" + (f", errors: {row['errors'][:2]}" if row.get("errors") else ""),
            required=bool(exact)))
    return checks


def core_checks(bw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The core (aten_kernels/aten/) on the device: it runs every case
    without an error, and its repeats hash the same. Its bits against its
    host build are reported, not required: both builds contract
    multiply-adds where their compilers choose, and that measurement is what
    the row is for. Each speed level must give the core's bits on the device
    (core_levels). A check for a run that recorded no core rows (a results
    file from before them) says n/a."""
    rows, repeats = bw.get("core"), bw.get("core_repeat")
    if not rows and not repeats:
        return [_check("core runs and repeats", None, "not run", required=False)]
    checks = [_check(
        f"core runs ({row['dtype']}, {row['dim']}-D)", not row.get("errors"),
        f"{row['bitwise_equal']}/{row['cases']} bitwise equal to its host build, max abs "
        f"diff {_fmt(row['max_abs_diff'])}"
        + (f", errors: {row['errors'][:2]}" if row.get("errors") else ""))
        for row in rows or []]
    for row in bw.get("core_levels") or []:
        checks.append(_check(
            f"{row['level']} keeps the core's bits ({row['dtype']}, {row['dim']}-D)",
            not row.get("errors") and row["bitwise_equal"] == row["cases"],
            f"{row['bitwise_equal']}/{row['cases']} bitwise equal to the core on the device"
            + (f", mismatches: {row['mismatches'][:3]}" if row.get("mismatches") else "")
            + (f", errors: {row['errors'][:2]}" if row.get("errors") else "")))
    for row in repeats or []:
        distinct = row.get("grad_input_distinct")
        checks.append(_check(
            f"core repeat runs bitwise identical ({row['dim']}-D)", distinct == 1,
            f"{row.get('reps')} runs of {row.get('case')}: distinct hashes {distinct}"
            + (f"; {row['error']}" if row.get("error") else "")))
    return checks


def sanitizer_check(tool: str, s: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """compute-sanitizer's answer; n/a where it gave none: unavailable on this
    runtime, or out of its time limit (its own, or the step's cut to the
    budget), which says nothing about the kernels."""
    name = f"compute-sanitizer {tool}"
    if not s:
        return _check(name, None, "not run")
    status = s.get("status")
    if status == "timeout":
        return _check(name, None, f"not run: out of its time limit after {s.get('seconds')} s")
    detail = f"{status}, errors={s.get('errors')}"
    if s.get("cases") is not None:
        detail += f", {s['cases']} cases, mismatches={s.get('mismatches')}"
    if s.get("reason"):
        detail += f" ({s['reason']})"
    return _check(name, None if status == "unavailable" else status == "clean", detail)


def timing_checks(timing: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The timing tables: fail where a workload raised (a wrong result, not
    a slow one), n/a where none was timed (out of time)."""
    rows = timing.get("rows") or []
    timed = [r for r in rows if "detgrid_ms" in r]
    errors = [r["name"] for r in rows if "error" in r]
    exact_timed = [r for r in timed if "exact_ms" in (r.get("exact") or {})]
    exact_errors = [r["name"] for r in timed if "error" in (r.get("exact") or {})]
    return [_check("timing table", _table_result(timed, errors),
                   f"{len(timed)}/{len(rows)} workloads timed"
                   + (f", raised: {errors[:3]}" if errors else "")),
            _check("exact timing table", _table_result(exact_timed, exact_errors),
                   f"{len(exact_timed)}/{len(timed)} timed workloads"
                   + (f", raised: {exact_errors[:3]}" if exact_errors else ""))]


def _table_result(timed: List[Any], errors: List[str]) -> Optional[bool]:
    return False if errors else (True if timed else None)


def route_checks(routes: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Grid-only calls under enable() in deterministic mode: no error, and
    grad_grid's bits stock's (required in half and bfloat16; float32 may
    differ where stock's build fused a multiply-add). Cross-device calls:
    stock's route gives stock's bits."""
    grid_only = routes.get("grid_only")
    if not grid_only:
        return [_check("grid-only calls under enable()", None, "not run")]
    errors = [r for r in grid_only if "error" in r]
    checks = [_check("grid-only calls under enable(): no error", not errors,
                     f"{len(grid_only) - len(errors)}/{len(grid_only)} ran"
                     + (f"; {errors[0]['name']}: {errors[0]['error']}" if errors else ""))]
    for reduced in (True, False):
        rows = [r for r in grid_only if "error" not in r
                and (r["dtype"] in ("float16", "bfloat16")) == reduced]
        if rows:
            equal = sum(r["bitwise_equal"] for r in rows)
            checks.append(_check(
                f"grid-only grad_grid == stock's ({'half, bfloat16' if reduced else 'float32'})",
                equal == len(rows), f"{equal}/{len(rows)} bitwise equal, mismatching elements "
                f"{sum(r['mismatches'] for r in rows)}", required=reduced))
    for row in routes.get("cross_device") or []:
        if "skipped" in row:
            checks.append(_check(row["name"], None, row["skipped"], required=False))
        elif "error" in row:
            checks.append(_check(row["name"], False, row["error"]))
        else:
            checks.append(_check(row["name"], row["stock_route_equal"],
                                 f"stock route equal: {row['stock_route_equal']}, deterministic "
                                 f"max abs diff {_fmt(row['deterministic_max_abs_diff'])}"))
    return checks


def exact_checks(exact: Dict[str, Any]) -> List[Dict[str, Any]]:
    """accumulate="exact" and "exact_atomic": per high-collision case, one
    set of bits over every run and knob setting of both, and grad_input as
    the host executor's; per dtype and rank, the same on the executor
    cases. Strict in every dtype (the sum is rounded once, by the same code
    on both sides), but the exact step is optional: a failure is a finding,
    never the verdict."""
    if not exact.get("repeat") and not exact.get("executor"):
        return [_check("exact variants", None, "not run")]
    checks = []
    for row in exact.get("repeat") or []:
        detail = (f"{row.get('runs')} runs of {row.get('case')}: distinct={row.get('distinct')} "
                  f"{row.get('distinct_by_group')}, grad_input == host exact: "
                  f"{row.get('host_equal')}" + (f"; {row['error']}" if row.get("error") else ""))
        checks.append(_check(f"exact == exact_atomic over runs and knobs ({row['dim']}-D)",
                             row.get("distinct") == 1 and row.get("host_equal") is True, detail))
    for row in exact.get("executor") or []:
        ok = (row["variants_agree"] == row["host_equal"] == row["cases"]
              and not row.get("errors"))
        detail = (f"{row['cases']} cases x {row['runs_per_case']} runs: variants agree in "
                  f"{row['variants_agree']}, grad_input == host exact in {row['host_equal']}")
        for key in ("disagreeing", "mismatches", "errors"):
            if row.get(key):
                detail += f", {key}: {row[key][:2]}"
        checks.append(_check(f"exact variants == host exact ({row['dtype']}, {row['dim']}-D)",
                             ok, detail))
    return checks


def repeat_checks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One check per repeated case (one per spatial dims): every run's
    gradients hash the same."""
    if not rows:
        return [_check("repeat runs bitwise identical", None, "not run")]
    checks = []
    for row in rows:
        rep = row.get("detgrid") or {}
        stock = row.get("stock") or {}
        distinct = [v for v in (rep.get("grad_input_distinct"), rep.get("grad_grid_distinct"))
                    if v is not None]
        checks.append(_check(
            f"repeat runs bitwise identical ({row['dim']}-D)",
            all(v == 1 for v in distinct) and bool(distinct),
            f"{rep.get('reps')} runs of {row.get('case')} {_shape(row.get('input_shape'))}: "
            f"distinct hashes grad_input={rep.get('grad_input_distinct')} "
            f"grad_grid={rep.get('grad_grid_distinct')}; "
            f"stock grad_input={stock.get('grad_input_distinct', stock.get('error'))}"
            + (f"; {rep['error']}" if rep.get("error") else "")))
    return checks


def fidelity_checks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """detgrid's half/bfloat16 grad_input within rounding of stock's CUDA
    backward (no tap moved); required on CUDA only (stock CPU rounds
    differently)."""
    if not rows:
        return [_check("half/bfloat16 taps as stock's", None, "not run")]
    checks = []
    for row in rows:
        on_cuda = row.get("device") == "cuda"
        ok = not row["failing"] and row["cases"] > 0
        detail = (f"{row['cases'] - len(row['failing'])}/{row['cases']} cases within rounding "
                  f"of stock {row.get('device')}, max abs diff {_fmt(row['max_abs_diff'])}")
        if row["failing"]:
            detail += f", failing: {row['failing'][:3]}"
        if row.get("errors"):
            detail += f", not run: {row['errors'][:2]}"
        checks.append(_check(f"half/bfloat16 taps as stock's ({row['dtype']}, {row['dim']}-D)",
                             ok, detail, required=on_cuda))
    return checks


def knob_checks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One check per repeated case: no launch or chunk setting changes a bit."""
    if not rows:
        return [_check("knobs change no bit", None, "not run")]
    return [_check(f"knobs change no bit ({row['dim']}-D)", row.get("distinct") == 1,
                   f"{row.get('case')}: {len(row.get('settings', []))} settings, "
                   f"distinct={row.get('distinct')}"
                   + (f"; {row['error']}" if row.get("error") else ""))
            for row in rows]


def _step_line(step: Dict[str, Any]) -> str:
    rc = f", rc {step['rc']}" if step["rc"] is not None else ""
    note = f", {step['note']}" if step["note"] else ""
    return f"step {step['name']}: {step['status']}{rc}{note}"


def blockers(checks: List[Dict[str, Any]], steps: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """What keeps the verdict from PASS, under the verdict each makes: a
    required step that failed, or a failing required check, FAIL; a required
    step not run to its end (skipped, timed out, not recorded), or a required
    check without an answer, INCOMPLETE. Optional steps never appear."""
    found: Dict[str, List[str]] = {"FAIL": [], "INCOMPLETE": []}
    recorded = {s["name"]: s for s in steps}
    for name in REQUIRED_STEPS:
        step = recorded.get(name)
        if step is None:
            found["INCOMPLETE"].append(f"step {name}: not recorded")
        elif step["status"] != "ok":
            found["FAIL" if step["status"] == "fail" else "INCOMPLETE"].append(_step_line(step))
    for c in checks:
        if c["required"] and c["result"] != "pass":
            found["FAIL" if c["result"] == "fail" else "INCOMPLETE"].append(
                f"{c['check']}: {c['result']} ({c['detail']})")
    return found


def optional_findings(checks: List[Dict[str, Any]], steps: List[Dict[str, Any]]) -> List[str]:
    """What the optional steps found wrong: a failing check, or the step
    itself failing. A step skipped or out of time found nothing. Shown on top
    of the report; they never change the verdict."""
    found = [f"{c['check']}: {c['detail']}" for c in checks
             if c["step"] not in REQUIRED_STEPS and c["result"] == "fail"]
    return found + [_step_line(s) for s in steps
                    if s["name"] not in REQUIRED_STEPS and s["status"] == "fail"]


def overall(found: Dict[str, List[str]], steps: List[Dict[str, Any]]) -> str:
    """The verdict from blockers() (found)."""
    if steps and all(s["status"] == "dry-run" for s in steps):
        return "DRY-RUN"
    if found["FAIL"]:
        return "FAIL"
    return "INCOMPLETE" if found["INCOMPLETE"] else "PASS"


def assemble_report(work: str, junit: Optional[str] = None) -> Dict[str, Any]:
    """Everything the steps left in work/ (and the junit xml) as one dict."""
    data: Dict[str, Any] = {"schema": 2}
    data["steps"] = read_steps(os.path.join(work, "steps.tsv"))
    data["env"] = _load_json(os.path.join(work, "env.json"))
    data["build"] = _load_json(os.path.join(work, "build.json"))
    data["tests"] = junit_summary(junit) if junit else {"present": False}
    data["sanitizer"] = {}
    for tool in SANITIZER_STEPS:
        s = _load_json(os.path.join(work, f"sanitizer_{tool}.json"))
        if s is not None:
            data["sanitizer"][tool] = s
    data["bitwise"] = _load_json(os.path.join(work, "bitwise.json"))
    data["exact"] = _load_json(os.path.join(work, "exact.json"))
    data["routes"] = _load_json(os.path.join(work, "routes.json"))
    data["timing"] = _load_json(os.path.join(work, "timing.json"))
    data["checks"] = verdict_checks(data)
    data["blockers"] = blockers(data["checks"], data["steps"])
    data["optional_findings"] = optional_findings(data["checks"], data["steps"])
    data["verdict"] = overall(data["blockers"], data["steps"])
    return data


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _shape(s: Optional[Sequence[int]]) -> str:
    return "×".join(str(d) for d in s) if s else "–"


def markdown_report(data: Dict[str, Any]) -> str:
    env = data.get("env") or {}
    lines = [f"# detgrid GPU check: {data.get('verdict')}", ""] + verdict_markdown(data)
    if env:
        lines.append(
            f"{env.get('device_name', 'no GPU')} (sm {env.get('capability', '–')}, "
            f"{env.get('sm_count', '–')} SMs), torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
            f"{env.get('nvcc') or 'no nvcc'}, kernel {env.get('kernel_release')} "
            f"({env.get('runtime_guess')}), sources {str(env.get('sources_sha256'))[:12]}")
        if env.get("nvidia_smi"):
            lines.append(f"nvidia-smi: `{env['nvidia_smi']}`")
        lines.append("")
    lines += ["## Checks", "", "| check | result | detail |", "|---|---|---|"]
    for c in data.get("checks", []):
        lines.append(f"| {c['check']} | {_mark(c)} | {c['detail']} |")
    lines += ["", "## Steps", "", "| step | status | rc | s | limit s | note |", "|---|---|---|---|---|---|"]
    for s in data.get("steps", []):
        lines.append(f"| {s['name']} | {s['status']} | {_fmt(s['rc'])} | {_fmt(s['seconds'])} | "
                     f"{_fmt(s['limit_s'])} | {s['note']} |")
    tests = data.get("tests") or {}
    for f in tests.get("failed", [])[:10]:
        lines.append(f"- failed `{f['test']}`: {f['message']}")
    bw = data.get("bitwise") or {}
    if bw.get("executor"):
        lines += ["", "## Device vs host executor", "",
                  "Bitwise equal: the same bits, or NaN on both sides (a NaN made by "
                  "arithmetic has other bits on the GPU than on x86; see detgrid.kit.bitwise).", "",
                  "| dtype | dims | cases | bitwise equal | max abs diff | required |",
                  "|---|---|---|---|---|---|"]
        for r in bw["executor"]:
            lines.append(f"| {r['dtype']} | {r['dim']}-D | {r['cases']} | {r['bitwise_equal']} | "
                         f"{_fmt(r['max_abs_diff'])} | {'yes' if r['must_be_equal'] else 'no'} |")
    lines += exact_markdown(data.get("exact") or {})
    rows = (data.get("timing") or {}).get("rows") or []
    if rows:
        clock = "CUDA events" if data["timing"].get("device") == "cuda" else "host clock"
        lines += ["", f"## Backward timing (median ms, {clock})", "",
                  "| workload | input | grid | dtype | mode·pad·ac | mask | stock ms | detgrid ms | "
                  "det/stock | extra peak MiB | rel err gI | rel err gG |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "detgrid_ms" not in r:
                lines.append(f"| {r['name']} | {r.get('error') or r.get('skipped')} |" + " |" * 10)
                continue
            mask = "".join("T" if m else "F" for m in r["output_mask"])
            lines.append(
                f"| {r['name']} | {_shape(r['input_shape'])} | {_shape(r['grid_shape'])} | "
                f"{r['dtype']} | {r['mode']}·{r['padding']}·{int(r['align_corners'])} | {mask} | "
                f"{_fmt(r['stock_ms'])} | {_fmt(r['detgrid_ms'])} | {_fmt(r['ratio'], '.2f')} | "
                f"{_fmt(r['extra_peak_mib'], '.1f')} | {_fmt(r['rel_err_grad_input'], '.1e')} | "
                f"{_fmt(r['rel_err_grad_grid'], '.1e')} |")
        lines += exact_timing_markdown(rows, clock)
    return "\n".join(lines) + "\n"


def verdict_markdown(data: Dict[str, Any]) -> List[str]:
    """Why the verdict is what it is, then what the optional steps found
    wrong and which did not run: the lines a reader needs before the tables."""
    if data.get("verdict") == "DRY-RUN":
        return []
    lines = [f"The required steps ({', '.join(REQUIRED_STEPS)}) decide; the others only "
             "report.", ""]
    found = data.get("blockers") or {}
    lines += [f"- {verdict}: {why}" for verdict in ("FAIL", "INCOMPLETE")
              for why in found.get(verdict, [])]
    findings = data.get("optional_findings") or []
    if findings:
        lines += ["", "**Optional findings** (wrong results an optional step found; "
                  "they do not change the verdict):", ""] + [f"- {f}" for f in findings]
    not_run = [s for s in data.get("steps", [])
               if s["name"] not in REQUIRED_STEPS and s["status"] in ("skipped", "timeout")]
    if not_run:
        lines += ["", "Optional steps not run to their end: " + ", ".join(
            f"{s['name']} ({s['status']}{', ' + s['note'] if s['note'] else ''})"
            for s in not_run) + "."]
    return lines + [""]


def _mark(check: Dict[str, Any]) -> str:
    """A check's result, and why it does not decide the verdict where it does not."""
    if check["required"]:
        return check["result"]
    return check["result"] + (" (optional)" if check["step"] not in REQUIRED_STEPS else " (info)")


def exact_markdown(exact: Dict[str, Any]) -> List[str]:
    """The executor cases' table of the exact variants."""
    rows = exact.get("executor") or []
    if not rows:
        return []
    lines = ["", '## accumulate="exact" and "exact_atomic"', "",
             f"Each case under both variants x {len(exact.get('settings') or [])} knob settings "
             f"({exact.get('settings')}): variants agree = one set of bits (both gradients); "
             "== host = grad_input as the host executor's exact, bit for bit (NaN aside).", "",
             "| dtype | dims | cases | runs per case | variants agree | == host |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['dim']}-D | {r['cases']} | {r['runs_per_case']} | "
                     f"{r['variants_agree']} | {r['host_equal']} |")
    return lines


def exact_timing_markdown(rows: List[Dict[str, Any]], clock: str) -> List[str]:
    """The exact variants beside the ordered backward, timed in their own
    rotation after the main table (stock ms is the main table's)."""
    timed = [r for r in rows if "detgrid_ms" in r]
    if not any("exact" in r for r in timed):
        return []
    lines = ["", f"## Exact accumulation timing (median ms, {clock})", "",
             "Ordered, exact and exact_atomic interleaved rep by rep after the table above; "
             "stock ms from the table above.", "",
             "| workload | stock ms | ordered ms | exact ms | exact_atomic ms | exact/ordered | "
             "atomic/ordered | exact peak MiB | atomic peak MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in timed:
        e = r.get("exact") or {}
        if "exact_ms" not in e:
            lines.append(f"| {r['name']} | {e.get('error') or e.get('skipped')} |" + " |" * 7)
            continue
        ordered = e["ordered_ms"]
        lines.append(
            f"| {r['name']} | {_fmt(r['stock_ms'])} | {_fmt(ordered)} | {_fmt(e['exact_ms'])} | "
            f"{_fmt(e['exact_atomic_ms'])} | {_ratio(e['exact_ms'], ordered)} | "
            f"{_ratio(e['exact_atomic_ms'], ordered)} | {_fmt(e['exact_peak_mib'], '.1f')} | "
            f"{_fmt(e['exact_atomic_peak_mib'], '.1f')} |")
    return lines


def _ratio(a: float, b: float) -> str:
    return _fmt(a / b, ".2f") if b > 0 else "–"


def write_report(work: str, out: str, junit: Optional[str] = None) -> Dict[str, Any]:
    data = assemble_report(work, junit)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(jsonable(data), f, indent=1, default=str, allow_nan=False)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown_report(data))
    return data


def jsonable(obj: Any) -> Any:
    """obj with non-finite floats as the strings "inf", "-inf", "nan", so the
    JSON stays standard (jq, browsers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj
