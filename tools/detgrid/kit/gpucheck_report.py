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
# initcheck, timing) only reports: a lease rarely leaves a cold
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
                        + core_checks(bw)
                        + golden_checks(bw)
                        + default_checks(bw)
                        + stock_checks(bw.get("stock") or [])
                        + fidelity_checks(bw.get("fidelity") or []))
            + from_step("routes", route_checks(data.get("routes") or {}))
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


# Why a device == host comparison of the core has no answer: the host build gives
# nvcc's bits only where it contracts a * b + c into FMAs as nvcc does.
NO_FMA = "n/a here: the host build contracts no FMA on this CPU, so it cannot give nvcc's bits"


def _row_detail(row: Dict[str, Any], against: str) -> str:
    detail = (f"{row['bitwise_equal']}/{row['cases']} bitwise equal to {against}, max abs "
              f"diff {_fmt(row['max_abs_diff'])}")
    for key in ("mismatches", "errors"):
        if row.get(key):
            detail += f", {key}: {row[key][:3]}"
    return detail


def _rows_equal(row: Dict[str, Any]) -> bool:
    return not row.get("errors") and row["bitwise_equal"] == row["cases"] > 0


def core_checks(bw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each build of the core on the device gives its host build's bits (NaN
    payloads aside), per dtype and spatial dims: the CPU tests' proof of the
    CUDA bits, the check's key claim. n/a where the host cannot give nvcc's bits
    (host_contracts false)."""
    rows = bw.get("core")
    if not rows:
        return [_check("device == host build", None, "not run")]
    contracts = bw.get("host_contracts", True)
    return [_check(f"{row['level']}: device == host build ({row['dtype']}, {row['dim']}-D)",
                   _rows_equal(row) if contracts else None,
                   _row_detail(row, "the host build") if contracts else NO_FMA)
            for row in rows]


def golden_checks(bw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each build on the device over the golden corpus gives the golden bits
    (tests/golden/core_digests.json, which the host core build must give too)."""
    rows = bw.get("golden")
    if not rows:
        return [_check("golden corpus on the device", None, "not run")]
    checks = []
    for row in rows:
        if "level" not in row:
            why = row.get("skipped") or row.get("error")
            checks.append(_check("golden corpus on the device",
                                 None if "skipped" in row else False, str(why)))
            continue
        detail = _row_detail(row, "the golden bits")
        if row.get("host_differ_count"):
            detail += (f"; the host core build misses {row['host_differ_count']} golden "
                       f"digests: {row['host_differ'][:3]}")
        checks.append(_check(f"{row['level']}: golden corpus on the device",
                             _rows_equal(row) and not row.get("host_differ_count"), detail))
    return checks


def default_checks(bw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The default backward (the operator enable() routes to) on the device:
    grad_input as the host build of the whole stack gives it, grad_grid as the
    grid gradient's host build gives it, per dtype and spatial dims."""
    top = bw.get("default_build", "default")
    contracts = bw.get("host_contracts", True)
    checks = []
    for key, name, against, needs_contraction in (
            ("default_grad_input", "default grad_input == host", f"the host {top} build", True),
            ("grid_gradient", "grad_grid == host grid gradient", "the host grid gradient",
             False)):
        rows = bw.get(key)
        if not rows:
            checks.append(_check(name, None, "not run"))
            continue
        for row in rows:
            answered = contracts or not needs_contraction
            checks.append(_check(f"{name} ({row['dtype']}, {row['dim']}-D)",
                                 _rows_equal(row) if answered else None,
                                 _row_detail(row, against) if answered else NO_FMA))
    return checks


def stock_checks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The default backward within tolerance of stock's atomic backward (or of
    float64 stock, where stock is further off), per dtype and spatial dims;
    required on CUDA only (on the CPU stock is aten's CPU kernel)."""
    if not rows:
        return [_check("agrees with stock", None, "not run")]
    checks = []
    for row in rows:
        ok = not row["failing"] and not row.get("errors") and row["cases"] > 0
        detail = (f"{row['cases'] - len(row['failing'])}/{row['cases']} finite cases within "
                  f"{_fmt(row['tolerance'])} of stock {row.get('device')}, max rel diff "
                  f"{_fmt(row['max_rel_diff'])}")
        for key in ("failing", "errors"):
            if row.get(key):
                detail += f", {key}: {row[key][:3]}"
        if row.get("refused"):
            detail += f"; stock refuses {row['refused']} ({row['refused_first'][0]})"
        checks.append(_check(f"agrees with stock ({row['dtype']}, {row['dim']}-D)", ok, detail,
                             required=row.get("device") == "cuda"))
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
    """The timing table: fail where a workload raised (a wrong result, not a
    slow one) or a build gave other bits than the default backward, n/a where
    none was timed (out of time)."""
    rows = timing.get("rows") or []
    timed = [r for r in rows if "detgrid_ms" in r]
    errors = [r["name"] for r in rows if "error" in r]
    differ = [f"{r['name']} ({level})" for r in timed
              for level, build in (r.get("builds") or {}).items()
              if build.get("equals_default") is False]
    detail = f"{len(timed)}/{len(rows)} workloads timed"
    if errors:
        detail += f", raised: {errors[:3]}"
    if differ:
        detail += f", other bits than the default: {differ[:3]}"
    return [_check("timing table", False if differ else _table_result(timed, errors), detail)]


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


def _hashes(row: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The repeat hashes of the default backward and of each build."""
    return [row.get("detgrid") or {}] + list((row.get("builds") or {}).values())


def repeat_checks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per repeated case (one per spatial dims): every run of the default
    backward and of each build gives one set of bits, and the builds and the
    default give the same one."""
    if not rows:
        return [_check("repeat runs bitwise identical", None, "not run")]
    checks = []
    for row in rows:
        runs = _hashes(row)
        distinct = [r.get(f"{g}_distinct") for r in runs for g in ("grad_input", "grad_grid")]
        counted = [v for v in distinct if v is not None]
        errors = [r["error"] for r in runs if r.get("error")]
        rep, stock = row.get("detgrid") or {}, row.get("stock") or {}
        builds = ", ".join(f"{level} grad_input={r.get('grad_input_distinct', r.get('error'))}"
                           for level, r in (row.get("builds") or {}).items())
        checks.append(_check(
            f"repeat runs bitwise identical ({row['dim']}-D)",
            not errors and bool(counted) and all(v == 1 for v in counted),
            f"{rep.get('reps')} runs of {row.get('case')} {_shape(row.get('input_shape'))}: "
            f"distinct hashes grad_input={rep.get('grad_input_distinct')} "
            f"grad_grid={rep.get('grad_grid_distinct')}; {builds}; "
            f"stock grad_input={stock.get('grad_input_distinct', stock.get('error'))}"
            + (f"; {errors[0]}" if errors else "")))
        heads = {g: {r.get(f"{g}_sha256") for r in runs} for g in ("grad_input", "grad_grid")}
        checks.append(_check(
            f"every build gives the default's bits ({row['dim']}-D)",
            not errors and all(len(h) == 1 and None not in h for h in heads.values()),
            f"{row.get('case')}: {len(heads['grad_input'])} grad_input and "
            f"{len(heads['grad_grid'])} grad_grid hashes over the default and "
            f"{len(runs) - 1} builds"))
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
    data: Dict[str, Any] = {"schema": 3}
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
    lines += bits_markdown(data.get("bitwise") or {})
    lines += timing_markdown(data.get("timing") or {})
    return "\n".join(lines) + "\n"


def bits_markdown(bw: Dict[str, Any]) -> List[str]:
    """The device against the host: each build's grad_input, the default
    backward's gradients, and the golden corpus, one line per row."""
    rows = ([(f"{r['level']} grad_input", r) for r in bw.get("core") or []]
            + [(f"default grad_input ({bw.get('default_build')})", r)
               for r in bw.get("default_grad_input") or []]
            + [("default grad_grid", r) for r in bw.get("grid_gradient") or []])
    lines: List[str] = []
    if rows:
        lines += ["", "## Device vs host build", "",
                  "Bitwise equal: the same bits, or NaN on both sides (a NaN made by "
                  "arithmetic has other bits on the GPU than on x86; see detgrid.kit.bitwise).",
                  "", "| what | dtype | dims | cases | bitwise equal | max abs diff |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {what} | {r['dtype']} | {r['dim']}-D | {r['cases']} | "
                  f"{r['bitwise_equal']} | {_fmt(r['max_abs_diff'])} |" for what, r in rows]
    golden = [r for r in bw.get("golden") or [] if "level" in r]
    if golden:
        lines += ["", "## Golden corpus on the device (tests/golden/core_digests.json)", "",
                  "| build | cases | bitwise equal to the golden bits | max abs diff |",
                  "|---|---|---|---|"]
        lines += [f"| {r['level']} | {r['cases']} | {r['bitwise_equal']} | "
                  f"{_fmt(r['max_abs_diff'])} |" for r in golden]
    return lines


def timing_markdown(timing: Dict[str, Any]) -> List[str]:
    """The timing table: stock, the default backward and each other build, with
    each build's ratio to stock."""
    rows = timing.get("rows") or []
    if not rows:
        return []
    clock = "CUDA events" if timing.get("device") == "cuda" else "host clock"
    top = timing.get("default_build")
    others = [b for b in timing.get("builds") or [] if b != top]
    build_heads = "".join(f" {b} ms | {b}/stock |" for b in others)
    lines = ["", f"## Backward timing (median ms, {clock})", "",
             f"detgrid: the default backward ({top}); the other builds of the core beside it "
             "(a grid-only call runs none).", "",
             "| workload | input | grid | dtype | mode·pad·ac | mask | stock ms | detgrid ms | "
             f"det/stock |{build_heads} extra peak MiB | rel err gI | rel err gG |",
             "|---" * (12 + 2 * len(others)) + "|"]
    for r in rows:
        if "detgrid_ms" not in r:
            lines.append(f"| {r['name']} | {r.get('error') or r.get('skipped')} |"
                         + " |" * (10 + 2 * len(others)))
            continue
        mask = "".join("T" if m else "F" for m in r["output_mask"])
        builds = r.get("builds") or {}
        build_cells = "".join(
            f" {_fmt(builds[b]['ms'])} | {_fmt(builds[b]['ratio'], '.2f')} |" if b in builds
            else " – | – |" for b in others)
        lines.append(
            f"| {r['name']} | {_shape(r['input_shape'])} | {_shape(r['grid_shape'])} | "
            f"{r['dtype']} | {r['mode']}·{r['padding']}·{int(r['align_corners'])} | {mask} | "
            f"{_fmt(r['stock_ms'])} | {_fmt(r['detgrid_ms'])} | {_fmt(r['ratio'], '.2f')} |"
            f"{build_cells} {_fmt(r['extra_peak_mib'], '.1f')} | "
            f"{_fmt(r['rel_err_grad_input'], '.1e')} | {_fmt(r['rel_err_grad_grid'], '.1e')} |")
    return lines


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
