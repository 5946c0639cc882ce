# Owner(s): ["module: nn"]
"""Tests of the GPU check's parts that need no GPU (tools/gpu_check.sh,
detgrid.kit.gpucheck, detgrid.kit.gpucheck_report, detgrid.bench.workloads): report
assembly, workloads, sanitizer parsing, and the bitwise and timing logic run
on the host executor.

Names here avoid the word the device run selects tests by (-k cuda), so the
GPU check does not run these again.
"""

import contextlib
import dataclasses
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.bench import workloads
from detgrid.kit import gpucheck, gpucheck_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "gpu_check.sh")

# In the order the script runs them: what a verdict needs first.
STEP_NAMES = ("env", "deps", "build", "kernels", "bitwise", "routes", "tests", "racecheck",
              "memcheck", "exact", "initcheck", "timing")
OPTIONAL_STEPS = tuple(n for n in STEP_NAMES if n not in gpucheck_report.REQUIRED_STEPS)


def strict_json(path):
    """Loads JSON that must be standard (no NaN/Infinity tokens)."""
    def reject(token):
        raise ValueError(f"non-standard JSON token {token}")

    with open(path) as f:
        return json.load(f, parse_constant=reject)


@contextlib.contextmanager
def stand_in_sanitizer(body):
    """A bash script with body as compute-sanitizer, first on PATH."""
    with tempfile.TemporaryDirectory() as bindir:
        path = os.path.join(bindir, "compute-sanitizer")
        with open(path, "w") as f:
            f.write("#!/usr/bin/env bash\n" + body)
        os.chmod(path, 0o755)
        with mock.patch.dict(os.environ, {"PATH": bindir + os.pathsep + os.environ["PATH"]}):
            yield


def run_script(env_overrides, timeout=120):
    env = dict(os.environ)
    env.update({"DETGRID_PYTHON": sys.executable, **env_overrides})
    return subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="10" time="12.5">
<testcase classname="tests.test_x.TestXCUDA" name="test_a_cuda" time="0.1"/>
<testcase classname="tests.test_x.TestXCUDA" name="test_b_cuda" time="0.1">
<failure message="AssertionError: bits differ">trace</failure></testcase>
<testcase classname="tests.test_x.TestXCUDA" name="test_c_cuda" time="0.1">
<error message="RuntimeError: CUDA error">trace</error></testcase>
</testsuite></testsuites>
"""
PASSING_JUNIT = JUNIT.replace('errors="1" failures="1"', 'errors="0" failures="0"')

SANITIZER_CLEAN = """========= COMPUTE-SANITIZER
DETGRID_CASES_DONE cases=29 mismatches=0
========= ERROR SUMMARY: 0 errors
"""
SANITIZER_ERRORS = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at reduce_kernel+0x1c0
RuntimeError: CUDA error: unspecified launch failure
========= ERROR SUMMARY: 3 errors
"""
SANITIZER_GVISOR = """========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the "Supported Devices" section.
RuntimeError: CUDA error: unknown error (error 999)
========= ERROR SUMMARY: 0 errors
"""
RACECHECK_CLEAN = """========= COMPUTE-SANITIZER
DETGRID_CASES_DONE cases=1 mismatches=0
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""
RACECHECK_HAZARD = """========= COMPUTE-SANITIZER
DETGRID_CASES_DONE cases=1 mismatches=0
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""


def fake_bitwise(distinct=1, fp32_equal=24, distinct_3d=1, fp32_equal_3d=16,
                 fidelity_failing=(), core_equal=24, core_errors=(),
                 core_distinct=1, level_equal=24):
    def repeat(case, dim, input_shape, grid_shape, det_distinct):
        return {"case": case, "dim": dim, "input_shape": input_shape, "grid_shape": grid_shape,
                "detgrid": {"reps": 100, "grad_input_distinct": det_distinct,
                            "grad_grid_distinct": 1},
                "stock": {"reps": 100, "grad_input_distinct": 97, "grad_grid_distinct": 1}}

    def executor(dtype, dim, cases, equal, exact):
        return {"dtype": dtype, "dim": dim, "cases": cases, "bitwise_equal": equal,
                "max_abs_diff": 0.0 if equal == cases else math.inf, "must_be_equal": exact,
                "mismatches": [] if equal == cases else ["x"], "errors": []}

    settings = [{}, {"chunk_points": 4096}]
    return {
        "device": "cuda",
        "repeat": [repeat("tensorf_line", 2, [1, 48, 300, 1], [1, 1000000, 1, 2], distinct),
                   repeat("simplebev_lift_3d", 3, [4, 96, 1, 42, 75], [4, 150, 6, 150, 3],
                          distinct_3d)],
        "knobs": [{"case": "tensorf_line", "dim": 2, "settings": settings, "distinct": 1},
                  {"case": "simplebev_lift_3d", "dim": 3, "settings": settings, "distinct": 1}],
        "executor": [executor("float32", 2, 24, fp32_equal, True),
                     executor("float32", 3, 16, fp32_equal_3d, True),
                     executor("float16", 2, 24, 20, False),
                     executor("float16", 3, 16, 12, False)],
        "fidelity": [{"dtype": dtype, "dim": dim, "device": "cuda", "cases": 18,
                      "failing": list(fidelity_failing) if (dtype, dim) == ("float16", 2) else [],
                      "max_abs_diff": 0.002, "errors": []}
                     for dtype in ("float16", "bfloat16") for dim in (2, 3)],
        "core": [{"dtype": "float32", "dim": 2, "cases": 24,
                       "bitwise_equal": core_equal, "max_abs_diff": 0.0,
                       "mismatches": [], "errors": list(core_errors)}],
        "core_levels": [{"level": "grouped-channels", "dtype": "float32", "dim": 2,
                         "cases": 24, "bitwise_equal": level_equal,
                         "mismatches": ["a"] if level_equal < 24 else [], "errors": []}],
        "core_repeat": [{"case": "tensorf_line", "dim": 2, "reps": 100,
                              "grad_input_distinct": core_distinct,
                              "grad_grid_distinct": None}],
    }


def fake_exact(distinct_3d=1, float16_host_equal=27):
    def repeat(case, dim, distinct):
        return {"case": case, "dim": dim, "reps": 10, "runs": 34, "distinct": distinct,
                "distinct_by_group": {"exact": 1, "exact_atomic": distinct, "knobs": 1},
                "host_equal": True}

    def executor(dtype, dim):
        host_equal = float16_host_equal if (dtype, dim) == ("float16", 2) else 27
        return {"dtype": dtype, "dim": dim, "cases": 27, "runs_per_case": 14,
                "variants_agree": 27, "host_equal": host_equal, "disagreeing": [],
                "mismatches": [] if host_equal == 27 else ["zoom"], "errors": []}

    return {"device": "cuda", "variants": ["exact", "exact_atomic"],
            "settings": [{}, {"chunk_points": 4096}],
            "repeat": [repeat("tensorf_line", 2, 1), repeat("simplebev_lift_3d", 3, distinct_3d)],
            "executor": [executor(dtype, dim) for dtype in workloads.DTYPES for dim in (2, 3)]}


def fake_routes(error=None):
    """routes.json as `gpucheck routes` writes it on one GPU: grid-only rows in
    float32 (one element fused differently by stock's build) and bfloat16."""
    grid_only = [
        {"name": "stn_mnist", "dtype": "float32", "bitwise_equal": False, "mismatches": 1,
         "max_abs_diff": 1e-9},
        {"name": "F.grid_sample 2-D bilinear grid only", "dtype": "bfloat16",
         "bitwise_equal": True, "mismatches": 0, "max_abs_diff": 0.0},
    ]
    if error:
        grid_only.append({"name": "monodepth2_grid_only", "error": error})
    return {"device": "cuda", "grid_only": grid_only,
            "cross_device": [{"name": "cross-device", "skipped": "needs two GPUs"}]}


def fake_timing():
    return {"device": "cuda", "scale": 1.0, "rows": [
        {"name": "rtdetr_l80", "load": "sparse", "input_shape": [128, 32, 80, 80],
         "grid_shape": [128, 500, 4, 2], "dtype": "float32", "mode": "bilinear",
         "padding": "zeros", "align_corners": False, "output_mask": [True, True],
         "stock_ms": 1.5, "detgrid_ms": 1.2, "ratio": 0.8, "extra_peak_mib": 12.0,
         "rel_err_grad_input": 1e-7, "rel_err_grad_grid": None,
         "exact": {"ordered_ms": 1.25, "exact_ms": 2.5, "exact_atomic_ms": 1.875,
                   "exact_peak_mib": 80.0, "exact_atomic_peak_mib": 70.5, "reps": 5, "warmup": 2}},
        {"name": "liif_nearest", "error": "RuntimeError: boom"},
    ]}


class TestGpuCheckReport(TestCase):
    def write_work(self, work, *, steps=None, bitwise=None, exact=None, memcheck="clean",
                   junit=JUNIT, routes=None, replaced=None):
        """A work folder as a run leaves it; replaced: fragments to replace,
        or to leave out (None)."""
        steps = steps or [(name, "ok", 0, 3, 60) for name in STEP_NAMES]
        with open(os.path.join(work, "steps.tsv"), "w") as f:
            for name, status, rc, secs, limit, *note in steps:
                f.write(f"{name}\t{status}\t{rc}\t{secs}\t{limit}\t{''.join(note)}\n")
        fragments = {
            "env.json": {"device_name": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0"},
            "build.json": {"require_cuda": True, "has_cuda_kernels": True,
                           "sass_archs": ["sm_90"], "ok": True},
            "bitwise.json": gpucheck_report.jsonable(bitwise or fake_bitwise()),
            "exact.json": exact or fake_exact(),
            "routes.json": routes or fake_routes(),
            "timing.json": fake_timing(),
            "sanitizer_memcheck.json": gpucheck.parse_sanitizer(
                "memcheck", SANITIZER_CLEAN if memcheck == "clean" else SANITIZER_GVISOR, 0),
            "sanitizer_racecheck.json": gpucheck.parse_sanitizer("racecheck", RACECHECK_CLEAN, 0),
            **(replaced or {}),
        }
        for name, data in fragments.items():
            if data is not None:
                with open(os.path.join(work, name), "w") as f:
                    json.dump(data, f)
        path = os.path.join(work, "junit.xml")
        with open(path, "w") as f:
            f.write(junit)
        return path

    def report(self, **kwargs):
        with tempfile.TemporaryDirectory() as work:
            junit = self.write_work(work, **kwargs)
            data = gpucheck_report.write_report(work, work, junit)
            loaded = strict_json(os.path.join(work, "gpu_check.json"))
            with open(os.path.join(work, "gpu_check.md")) as f:
                md = f.read()
        return data, loaded, md

    def checks(self, data):
        return {c["check"]: c["result"] for c in data["checks"]}

    def test_grid_only_error_under_enable_fails_the_verdict(self):
        data, _, _ = self.report(junit=PASSING_JUNIT, routes=fake_routes(
            "RuntimeError: grid_sampler_2d_backward_cuda does not have a deterministic "
            "implementation"))
        self.assertEqual(self.checks(data)["grid-only calls under enable(): no error"], "fail")
        self.assertEqual(data["verdict"], "FAIL")

    def test_report_assembles_every_fragment(self):
        data, loaded, md = self.report(junit=PASSING_JUNIT)
        self.assertEqual(loaded["verdict"], "PASS")
        self.assertEqual(loaded["env"]["device_name"], "NVIDIA H200")
        self.assertEqual([s["name"] for s in loaded["steps"]], list(STEP_NAMES))
        self.assertEqual(loaded["bitwise"]["executor"][2]["max_abs_diff"], "inf")
        self.assertEqual(loaded["sanitizer"]["memcheck"]["status"], "clean")
        self.assertEqual(len(loaded["timing"]["rows"]), 2)
        checks = self.checks(data)
        self.assertEqual(checks["grid-only calls under enable(): no error"], "pass")
        self.assertEqual(checks["grid-only grad_grid == stock's (half, bfloat16)"], "pass")
        self.assertEqual(checks["grid-only grad_grid == stock's (float32)"], "fail")  # info only
        self.assertEqual(checks["cross-device"], "n/a")
        for dims in ("2-D", "3-D"):
            self.assertEqual(checks[f"repeat runs bitwise identical ({dims})"], "pass")
            self.assertEqual(checks[f"knobs change no bit ({dims})"], "pass")
            self.assertEqual(checks[f"device == host executor (float32, {dims})"], "pass")
            self.assertEqual(checks[f"device == host executor (float16, {dims})"], "pass")  # info
        self.assertTrue(md.startswith("# detgrid GPU check: PASS"))
        self.assertIn("| repeat runs bitwise identical (3-D) | pass | 100 runs of "
                      "simplebev_lift_3d 4×96×1×42×75: distinct hashes grad_input=1", md)
        self.assertIn("| float32 | 3-D | 16 | 16 | 0 | yes |", md)
        self.assertIn("| float16 | 3-D | 16 | 12 | inf | no |", md)
        self.assertIn("| rtdetr_l80 | 128×32×80×80 | 128×500×4×2 | float32 |", md)
        self.assertIn("| 1.5 | 1.2 | 0.80 | 12.0 |", md)
        self.assertIn("RuntimeError: boom", md)
        self.assertIn("CUDA events", md)
        for dims in ("2-D", "3-D"):
            self.assertEqual(checks[f"exact == exact_atomic over runs and knobs ({dims})"], "pass")
            for dtype in workloads.DTYPES:
                self.assertEqual(checks[f"exact variants == host exact ({dtype}, {dims})"], "pass")
        self.assertEqual(checks["exact timing table"], "pass")
        self.assertIn("| bfloat16 | 3-D | 27 | 14 | 27 | 27 |", md)
        # A timed workload that raised is a finding of the optional timing
        # step, listed above the tables; the float32 grid-only row that
        # differs is informative (a required step's), so not one.
        self.assertEqual(loaded["blockers"], {"FAIL": [], "INCOMPLETE": []})
        self.assertEqual(checks["timing table"], "fail")
        self.assertEqual(loaded["optional_findings"],
                         ["timing table: 1/2 workloads timed, raised: ['liif_nearest']"])
        self.assertLess(md.index("**Optional findings**"), md.index("## Checks"))
        self.assertIn("| timing table | fail (optional) |", md)
        self.assertIn("| grid-only grad_grid == stock's (float32) | fail (info) |", md)
        self.assertIn("| rtdetr_l80 | 1.5 | 1.25 | 2.5 | 1.88 | 2.00 | 1.50 | 80.0 | 70.5 |", md)

    def test_failures_make_the_verdict_fail(self):
        data, _, md = self.report()  # the junit has a failure and an error
        self.assertEqual(data["verdict"], "FAIL")
        self.assertEqual(self.checks(data)["CUDA tests"], "fail")
        self.assertIn("test_b_cuda", md)
        data, _, _ = self.report(bitwise=fake_bitwise(distinct=2))
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (2-D)"], "fail")
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (3-D)"], "pass")
        data, _, _ = self.report(bitwise=fake_bitwise(distinct_3d=2))
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (2-D)"], "pass")
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (3-D)"], "fail")
        self.assertEqual(data["verdict"], "FAIL")
        broken = fake_bitwise()
        broken["repeat"][1]["detgrid"] = {"error": "RuntimeError: CUDA error: illegal address"}
        broken["knobs"][1] = {"case": "simplebev_lift_3d", "dim": 3,
                              "error": "RuntimeError: CUDA error: illegal address"}
        data, _, md = self.report(bitwise=broken)
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (3-D)"], "fail")
        self.assertEqual(self.checks(data)["knobs change no bit (3-D)"], "fail")
        self.assertEqual(self.checks(data)["knobs change no bit (2-D)"], "pass")
        self.assertIn("illegal address", md)
        data, _, _ = self.report(bitwise=fake_bitwise(fp32_equal=23))
        self.assertEqual(self.checks(data)["device == host executor (float32, 2-D)"], "fail")
        data, _, md = self.report(bitwise=fake_bitwise(fidelity_failing=["fidelity_2d_x"]))
        self.assertEqual(self.checks(data)["half/bfloat16 taps as stock's (float16, 2-D)"], "fail")
        self.assertEqual(self.checks(data)["half/bfloat16 taps as stock's (bfloat16, 2-D)"], "pass")
        self.assertEqual(data["verdict"], "FAIL")
        self.assertIn("fidelity_2d_x", md)
        data, _, _ = self.report(bitwise=fake_bitwise(fp32_equal_3d=15))
        self.assertEqual(self.checks(data)["device == host executor (float32, 2-D)"], "pass")
        self.assertEqual(self.checks(data)["device == host executor (float32, 3-D)"], "fail")
        self.assertEqual(data["verdict"], "FAIL")

    def test_core_bits_against_its_host_build_are_reported_not_required(self):
        # FMA contraction may differ between nvcc and the host compiler: a
        # measurement; an error or a second hash over repeats is a failure.
        data, _, md = self.report(bitwise=fake_bitwise(core_equal=20))
        self.assertEqual(self.checks(data)["core runs (float32, 2-D)"], "pass")
        self.assertIn("20/24 bitwise equal to its host build", md)
        data, _, _ = self.report(bitwise=fake_bitwise(core_errors=["x: RuntimeError"]))
        self.assertEqual(self.checks(data)["core runs (float32, 2-D)"], "fail")
        self.assertEqual(data["verdict"], "FAIL")
        data, _, _ = self.report(bitwise=fake_bitwise(core_distinct=2))
        self.assertEqual(self.checks(data)["core repeat runs bitwise identical (2-D)"],
                         "fail")
        self.assertEqual(data["verdict"], "FAIL")

    def test_a_speed_level_must_give_the_core_bits_on_the_device(self):
        name = "grouped-channels keeps the core's bits (float32, 2-D)"
        data, _, md = self.report(bitwise=fake_bitwise())
        self.assertEqual(self.checks(data)[name], "pass")
        self.assertIn("24/24 bitwise equal to the core on the device", md)
        data, _, _ = self.report(bitwise=fake_bitwise(level_equal=23))
        self.assertEqual(self.checks(data)[name], "fail")
        self.assertEqual(data["verdict"], "FAIL")

    def test_exact_variants_failing_are_optional_findings(self):
        # Wrong bits, but from an optional step: listed on top, the verdict
        # is the required steps'.
        data, _, md = self.report(junit=PASSING_JUNIT, exact=fake_exact(distinct_3d=2))
        checks = self.checks(data)
        self.assertEqual(checks["exact == exact_atomic over runs and knobs (2-D)"], "pass")
        self.assertEqual(checks["exact == exact_atomic over runs and knobs (3-D)"], "fail")
        self.assertEqual(data["verdict"], "PASS")
        self.assertEqual(len(data["optional_findings"]), 2)  # and the timing row that raised
        self.assertTrue(data["optional_findings"][0].startswith(
            "exact == exact_atomic over runs and knobs (3-D): 34 runs of simplebev_lift_3d"))
        self.assertIn("'exact_atomic': 2", md.split("## Checks")[0])
        # Half is as strict: the exact sum is rounded once, on both sides alike.
        data, _, md = self.report(junit=PASSING_JUNIT, exact=fake_exact(float16_host_equal=26))
        checks = self.checks(data)
        self.assertEqual(checks["exact variants == host exact (float16, 2-D)"], "fail")
        self.assertEqual(checks["exact variants == host exact (float16, 3-D)"], "pass")
        self.assertEqual(data["verdict"], "PASS")
        self.assertIn("| exact variants == host exact (float16, 2-D) | fail (optional) |", md)
        self.assertIn("mismatches: ['zoom']", md.split("## Checks")[0])

    def test_exact_not_run_is_not_applicable(self):
        data, _, md = self.report(junit=PASSING_JUNIT, exact={"device": "cuda"})
        self.assertEqual(self.checks(data)["exact variants"], "n/a")
        self.assertEqual(data["verdict"], "PASS")
        self.assertNotIn('## accumulate="exact"', md)

    def test_bitwise_not_run_is_not_applicable(self):
        data, _, _ = self.report(junit=PASSING_JUNIT, bitwise={"device": "cuda"})
        checks = self.checks(data)
        for name in ("repeat runs bitwise identical", "knobs change no bit",
                     "device == host executor"):
            self.assertEqual(checks[name], "n/a")
        self.assertEqual(data["verdict"], "INCOMPLETE")

    def test_unavailable_sanitizer_is_incomplete(self):
        data, _, md = self.report(junit=PASSING_JUNIT, memcheck="gvisor")
        self.assertEqual(self.checks(data)["compute-sanitizer memcheck"], "n/a")
        self.assertEqual(data["verdict"], "INCOMPLETE")
        self.assertIn("- INCOMPLETE: compute-sanitizer memcheck: n/a (unavailable", md)

    def test_each_step_outcome_under_the_verdict_policy(self):
        # One step not ok, every result passing: a required step decides
        # (failed: FAIL; skipped or out of time: INCOMPLETE), an optional one
        # never does, and one that failed is listed as a finding.
        expected = {"fail": "FAIL", "skipped": "INCOMPLETE", "timeout": "INCOMPLETE"}
        for name in STEP_NAMES:
            for status, rc in (("fail", 1), ("skipped", ""), ("timeout", 124)):
                with self.subTest(step=name, status=status):
                    steps = [(n, "ok", 0, 3, 60) for n in STEP_NAMES]
                    steps[STEP_NAMES.index(name)] = (name, status, rc, 60, 60)
                    data, _, md = self.report(junit=PASSING_JUNIT, steps=steps)
                    required = name in gpucheck_report.REQUIRED_STEPS
                    self.assertEqual(data["verdict"], expected[status] if required else "PASS")
                    line = f"step {name}: {status}"
                    blocking = data["blockers"][expected[status]]
                    self.assertEqual(any(b.startswith(line) for b in blocking), required)
                    self.assertEqual(any(f.startswith(line) for f in data["optional_findings"]),
                                     not required and status == "fail")
                    self.assertEqual(f"{name} ({status}" in md.split("## Checks")[0],
                                     not required and status != "fail")

    def test_cold_run_without_the_optional_steps_passes(self):
        # The budget ran out after the required steps: exact was cut and left
        # nothing, initcheck and timing never started.
        late = ("exact", "initcheck", "timing")
        steps = [(n, "ok", 0, 3, 60) for n in STEP_NAMES if n not in late]
        steps += [("exact", "timeout", 124, 21, 21, "limit cut to the budget's rest"),
                  ("initcheck", "skipped", "", 0, 0, "out of budget"),
                  ("timing", "skipped", "", 0, 0, "out of budget")]
        data, _, md = self.report(junit=PASSING_JUNIT, steps=steps,
                                  replaced={"exact.json": None, "timing.json": None})
        self.assertEqual(data["verdict"], "PASS")
        checks = self.checks(data)
        for name in ("exact variants", "compute-sanitizer initcheck", "timing table"):
            self.assertEqual(checks[name], "n/a")
        self.assertEqual(data["optional_findings"], [])
        self.assertIn("Optional steps not run to their end: exact (timeout, limit cut to the "
                      "budget's rest), initcheck (skipped, out of budget), timing (skipped, out "
                      "of budget).", md)

    def test_sanitizer_out_of_its_time_is_not_run(self):
        # compute-sanitizer stopped at its own limit (the step's, cut to what
        # was left of the budget) checked nothing: a required sanitizer makes
        # INCOMPLETE, not FAIL; an optional one changes nothing.
        def timed_out(tool):
            result = gpucheck.parse_sanitizer(tool, "========= COMPUTE-SANITIZER\n", None)
            return {**result, "seconds": 37.0}

        for tool in ("memcheck", "racecheck", "initcheck"):
            with self.subTest(tool=tool):
                steps = [(n, "ok", 0, 3, 60) for n in STEP_NAMES]
                steps[STEP_NAMES.index(tool)] = (tool, "timeout", 124, 42, 42,
                                                 "limit cut to the budget's rest")
                data, _, md = self.report(junit=PASSING_JUNIT, steps=steps,
                                          replaced={f"sanitizer_{tool}.json": timed_out(tool)})
                self.assertEqual(self.checks(data)[f"compute-sanitizer {tool}"], "n/a")
                self.assertIn("not run: out of its time limit after 37.0 s", md)
                self.assertEqual(data["blockers"]["FAIL"], [])
                if tool == "initcheck":
                    self.assertEqual(data["verdict"], "PASS")
                    continue
                self.assertEqual(data["verdict"], "INCOMPLETE")
                self.assertIn(f"- INCOMPLETE: step {tool}: timeout, rc 124, limit cut to the "
                              "budget's rest", md)

    def test_empty_work_dir(self):
        with tempfile.TemporaryDirectory() as work:
            data = gpucheck_report.write_report(work, work, os.path.join(work, "missing.xml"))
            strict_json(os.path.join(work, "gpu_check.json"))
        self.assertEqual(data["verdict"], "INCOMPLETE")
        self.assertFalse(data["tests"]["present"])

    def test_junit_summary(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "j.xml")
            with open(path, "w") as f:
                f.write(JUNIT)
            s = gpucheck_report.junit_summary(path)
        self.assertEqual((s["tests"], s["failures"], s["errors"], s["skipped"], s["passed"]),
                         (10, 1, 1, 2, 6))
        self.assertEqual([f["kind"] for f in s["failed"]], ["failure", "error"])
        self.assertEqual(s["failed"][0]["test"], "tests.test_x.TestXCUDA::test_b_cuda")
        self.assertEqual(s["failed"][1]["message"], "RuntimeError: CUDA error")

    def test_parse_sanitizer(self):
        def status(tool, text, rc):
            return gpucheck.parse_sanitizer(tool, text, rc)

        clean = status("memcheck", SANITIZER_CLEAN, 0)
        self.assertEqual((clean["status"], clean["errors"], clean["cases"]), ("clean", 0, 29))
        bad = status("memcheck", SANITIZER_ERRORS, 86)
        self.assertEqual((bad["status"], bad["errors"]), ("errors", 3))
        gvisor = status("memcheck", SANITIZER_GVISOR, 1)
        self.assertEqual(gvisor["status"], "unavailable")
        self.assertEqual(status("racecheck", RACECHECK_CLEAN, 0)["status"], "clean")
        hazard = status("racecheck", RACECHECK_HAZARD, 86)
        self.assertEqual((hazard["status"], hazard["errors"], hazard["hazards"]), ("errors", 1, 2))
        self.assertEqual(status("memcheck", "partial", None)["status"], "timeout")
        self.assertEqual(status("memcheck", "Traceback ...", 1)["status"], "failed")
        crashed = SANITIZER_CLEAN.replace("DETGRID_CASES_DONE cases=29 mismatches=0\n", "")
        self.assertEqual(status("memcheck", crashed, 1)["status"], "case_failed")
        mismatch = SANITIZER_CLEAN.replace("mismatches=0", "mismatches=2")
        self.assertEqual(status("memcheck", mismatch, 1)["status"], "case_failed")
        exits = {name: gpucheck.sanitize_exit_status(name) for name in
                 ("clean", "unavailable", "errors", "case_failed", "failed", "timeout")}
        self.assertEqual(exits, {"clean": 0, "unavailable": 0, "errors": 1, "case_failed": 1,
                                 "failed": 1, "timeout": 124})

    def test_sanitizer_driver_with_a_stand_in_tool(self):
        # A stand-in compute-sanitizer that runs the case program on the
        # host executor and prints the real tool's summary line.
        fake = (
            "echo '========= COMPUTE-SANITIZER'\n"
            "echo \"tool=$2 caching=$PYTORCH_NO_CUDA_MEMORY_CACHING\"\n"
            "while [[ \"$1\" == --* ]]; do shift 2; done\n"
            "args=(\"$@\"); args=(\"${args[@]/cuda/cpu}\")\n"
            "\"${args[@]}\"; rc=$?\n"
            "echo '========= ERROR SUMMARY: 0 errors'\n"
            "exit $rc\n")
        with stand_in_sanitizer(fake):
            result = gpucheck.run_sanitizer("racecheck", "tiny", timeout=60)
        self.assertEqual(result["status"], "clean", result["output_tail"])
        self.assertEqual((result["cases"], result["mismatches"]), (2, 0))
        self.assertIn("tool=racecheck caching=1", result["output_tail"])
        self.assertIn("--report-api-errors no", result["command"])

    def test_sanitizer_out_of_its_time_exits_as_timeout_does(self):
        # A stand-in compute-sanitizer that never finishes: `sanitize` stops
        # it at --timeout and exits 124, which the driver records as a
        # timeout (not run), not as a failure.
        with tempfile.TemporaryDirectory() as work, stand_in_sanitizer(
                "echo '========= COMPUTE-SANITIZER'\nexec sleep 60\n"):
            path = os.path.join(work, "s.json")
            with open(os.devnull, "w") as devnull, mock.patch.object(sys, "stdout", devnull):
                rc = gpucheck.main(["sanitize", "--tool", "memcheck", "--set", "tiny",
                                    "--timeout", "1", "--json", path])
            result = strict_json(path)
        self.assertEqual(rc, 124)
        self.assertEqual(result["status"], "timeout")
        self.assertLess(result["seconds"], 30)

    def test_jsonable(self):
        self.assertEqual(gpucheck_report.jsonable({"a": [math.nan, -math.inf, 1.5], "b": (math.inf,)}),
                         {"a": ["nan", "-inf", 1.5], "b": ["inf"]})


class TestGpuCheckWorkloads(TestCase):
    def test_full_size_shapes_follow_the_benchmarks(self):
        w = workloads.WORKLOADS
        self.assertEqual(w["rtdetr_l80"].shapes(), ((128, 32, 80, 80), (128, 500, 4, 2)))
        self.assertEqual(w["mask2former_l32"].shapes(), ((16, 32, 32, 32), (16, 21504, 4, 2)))
        self.assertEqual(w["tensorf_line"].shapes(), ((1, 48, 300, 1), (1, 1000000, 1, 2)))
        self.assertEqual(w["positional_table_c1024"].shapes()[0], (8, 1024, 31, 31))
        self.assertEqual(w["rgb_warp_bicubic_fp16"].dtype, torch.float16)
        self.assertEqual((w["rgb_warp_bicubic_fp16"].mode, w["rgb_warp_bicubic_fp16"].padding),
                         ("bicubic", "reflection"))
        self.assertEqual(w["monodepth2_grid_only"].output_mask, (False, True))
        self.assertEqual(w["monodepth2_grid_only"].padding, "border")
        self.assertEqual(w["liif_nearest"].mode, "nearest")
        self.assertTrue(w["basicvsr_flow_warp"].align_corners)

    def test_builders_give_consistent_inputs(self):
        for name, workload in workloads.WORKLOADS.items():
            case = workload.build("cpu", seed=3, scale=0.02)
            n, c, h, w = case.input.shape
            _, gh, gw, two = case.grid.shape
            self.assertEqual(two, 2, name)
            self.assertEqual(case.grid.shape[0], n, name)
            self.assertEqual(tuple(case.grad_output.shape), (n, c, gh, gw), name)
            for t in (case.input, case.grid, case.grad_output):
                self.assertEqual(t.dtype, workload.dtype, name)
            self.assertEqual(case.interpolation_mode, workloads.MODES[workload.mode], name)
            self.assertEqual(case.padding_mode, workloads.PADDINGS[workload.padding], name)
            self.assertEqual(case.output_mask, workload.output_mask, name)
            self.assertTrue(bool(case.grid.isfinite().all()), name)
            if workload.expanded_batch and n > 1:
                self.assertEqual(case.input.stride(0), 0, name)
            again = workload.build("cpu", seed=3, scale=0.02)
            self.assertTrue(workloads.bitwise_equal(case.grid, again.grid), name)
            other = workload.build("cpu", seed=4, scale=0.02)
            self.assertFalse(workloads.bitwise_equal(case.grad_output, other.grad_output), name)

    def test_grid_kinds(self):
        for align in (False, True):
            ident = workloads._identity_grid(2, 3, 4, align)
            theta = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).expand(2, 2, 3)
            ref = torch.nn.functional.affine_grid(theta, [2, 1, 3, 4], align_corners=align)
            self.assertEqual(ident, ref, atol=1e-6, rtol=0)
        g = torch.Generator().manual_seed(0)
        zoom = workloads.make_grid("zoom", 2, 16, 16, (31, 31), False, g, extent=0.28)
        self.assertLess(float(zoom.abs().max()), 0.28 + 2 / 31)
        line = workloads.make_grid("line", 1, 100, 1, (300, 1), True, g)
        self.assertEqual(float(line[..., 0].abs().max()), 0.0)
        smooth = workloads.make_grid("smooth", 1, 8, 8, (8, 8), True, g)
        self.assertLess(float(smooth.abs().max()), 2.5)
        with self.assertRaises(ValueError):
            workloads.make_grid("spiral", 1, 2, 2, (2, 2), True, g)

    def test_sanitizer_cases_cover_modes_specials_and_chunks(self):
        cases = workloads.sanitizer_cases("all")
        names = [c.name for c in cases]
        self.assertEqual(len(names), len(set(names)))
        for dim, combos in ((2, 9), (3, 9)):
            ranked = [c for c in cases if c.dim == dim]
            for c in ranked:
                self.assertEqual((c.input.dim(), c.grid.shape[-1]), (dim + 2, dim), c.name)
                self.assertEqual(c.grad_output.shape, c.input.shape[:2] + c.grid.shape[1:-1])
            self.assertEqual(len({(c.interpolation_mode, c.padding_mode) for c in ranked}),
                             combos, dim)
            self.assertEqual({c.align_corners for c in ranked}, {False, True}, dim)
            grids = torch.cat([c.grid.double().reshape(-1) for c in ranked])
            self.assertTrue(bool(grids.isnan().any()), dim)
            self.assertTrue(bool((grids == math.inf).any()) and bool((grids == -math.inf).any()))
            huge = grids.isfinite() & (grids.abs() > 1e37)  # +-1e38 stays finite in float32
            self.assertTrue(bool(huge.any()), dim)
            self.assertEqual({c.input.dtype for c in ranked},
                             {torch.float32, torch.float64, torch.float16, torch.bfloat16})
            self.assertEqual({c.output_mask for c in ranked},
                             {(True, True), (True, False), (False, True)}, dim)
            chunked = [c for c in ranked if c.options.get("chunk_points") == 4096]
            self.assertTrue(chunked, dim)
            for c in chunked:
                self.assertGreater(c.grid[..., 0].numel(), 2 * 4096, c.name)
            layouts = [c for c in ranked if not c.input.is_contiguous()]
            self.assertTrue(any(c.input.stride(0) == 0 for c in layouts), dim)
            fmt = workloads.channels_last(dim)
            self.assertTrue(any(c.input.is_contiguous(memory_format=fmt) for c in layouts), dim)
        self.assertEqual([c.dim for c in workloads.sanitizer_cases("tiny")], [2, 3])

    def test_three_d_specials_reach_each_axis_alone(self):
        # NaN/Inf/huge in z with x and y finite and in range: the third axis
        # takes its own path from a coordinate to a voxel index.
        grid = workloads.special_grid(torch.zeros(1, 2, 3, 4, 3))
        points = grid.reshape(-1, 3)
        z_only = points[:, :2].abs().le(1).all(-1) & ~points[:, 2].abs().le(1)
        self.assertTrue(bool(points[z_only, 2].isnan().any()))
        self.assertEqual(set(points[z_only, 2].isinf().tolist()), {True, False})
        self.assertTrue(bool((points[z_only, 2].abs() == 1e38).any()))
        self.assertTrue(bool(points[:, 0].isnan().any() and points[:, 1].isinf().any()))
        flat = workloads.special_grid(torch.zeros(1, 4, 4, 2)).reshape(-1, 2)
        self.assertEqual(flat.shape, (16, 2))
        self.assertFalse(bool(flat[:10].abs().le(1).all(-1).any()))  # each one out of range
        self.assertTrue(bool(flat[10:].eq(0).all()))

    def test_multichunk_cases_take_both_reductions_in_each_rank(self):
        # The reduction is dense when the input has no more destinations
        # (batch x pixels or voxels) than a chunk has records (plan_chunks;
        # keyed per cell, the cells must fit too, and they outnumber the
        # destinations); each rank reaches both, and the sparse one with the
        # float16 carry that is copied out after the last chunk.
        mode_of = {v: k for k, v in workloads.MODES.items()}
        for dim in (2, 3):
            kinds = set()
            for c in workloads.sanitizer_cases("all"):
                if c.dim != dim or "chunk_points" not in c.options:
                    continue
                taps = workloads.TAPS[(mode_of[c.interpolation_mode], dim)]
                destinations = c.input.shape[0] * math.prod(c.input.shape[2:])
                dense = destinations <= c.options["chunk_points"] * taps
                kinds.add((dense, c.input.dtype))
                if not dense:
                    self.assertIn("sparse", c.name)
                elif dim == 3:
                    self.assertIn("dense", c.name)
            self.assertIn((True, torch.float32), kinds, dim)
            self.assertIn((False, torch.float32), kinds, dim)
            self.assertIn((False, torch.float16), kinds, dim)

    def test_executor_cases_per_rank(self):
        for dim, count in ((2, 24), (3, 24)):
            cases = workloads.executor_cases(torch.float64, dim=dim)
            self.assertEqual(len(cases), count)
            self.assertEqual({c.dim for c in cases}, {dim})
            self.assertEqual({c.input.dtype for c in cases}, {torch.float64})
            modes = {c.interpolation_mode for c in cases}
            self.assertEqual(modes, {0, 1, 2})  # 5-D bicubic is tricubic
            self.assertEqual(len({(c.interpolation_mode, c.padding_mode, c.align_corners)
                                  for c in cases}), 6 * len(modes))
            self.assertTrue(any(not bool(c.grid.isfinite().all()) for c in cases), dim)
            outside = torch.cat([c.grid.reshape(-1) for c in cases])
            self.assertTrue(bool((outside.abs() > 1).any()), dim)  # some points out of bounds
        names = {c.name for c in workloads.executor_cases(torch.float32, dim=3)}
        self.assertIn("3d_trilinear_border_ac", names)
        self.assertIn("3d_nearest_zeros_zoom", names)
        self.assertIn("3d_tricubic_reflection_special", names)

    def test_non_finite_grad_output_cases_make_nans_in_both_gradients(self):
        # Where NaNs come from arithmetic, the GPU's bits differ from the
        # host's: these cases are what makes the device == host rows test
        # the NaN rule (detgrid.kit.bitwise).
        for dim in (2, 3):
            cases = [c for c in gpucheck.executor_row_cases("float32", dim)
                     if c.name.endswith("_non_finite_grad_output")]
            self.assertEqual(len(cases), 3, dim)
            for case in cases:
                self.assertFalse(bool(case.grad_output.isfinite().all()), case.name)
                grad_input, grad_grid = workloads.run_detgrid(case)
                self.assertTrue(bool(grad_input.isnan().any()), case.name)
                if case.interpolation_mode != 1:  # nearest: no grid gradient
                    self.assertTrue(bool(grad_grid.isnan().any()), case.name)

    def test_repeat_cases_collide_and_span_chunks(self):
        # At --scale 1: the 2-D case is TensoRF's line, the 3-D one many
        # points per voxel over more than two chunks of the default size
        # (2^21 records: 262,144 trilinear points).
        self.assertEqual([name for name, _ in gpucheck.REPEAT_WORKLOADS],
                         ["tensorf_line", "simplebev_lift_3d"])
        dims = [workloads.BENCH_WORKLOADS[name].dim for name, _ in gpucheck.REPEAT_WORKLOADS]
        self.assertEqual(dims, [2, 3])
        name, relative = gpucheck.REPEAT_WORKLOADS[1]
        in_shape, grid_shape = workloads.BENCH_WORKLOADS[name].shapes(relative)
        points = math.prod(grid_shape[:-1])
        self.assertGreater(points, 2 * (2**21 // 8))
        self.assertGreater(points / in_shape[0] / math.prod(in_shape[2:]), 16)
        cases = gpucheck.repeat_cases("cpu", scale=0.01)
        self.assertEqual([c.dim for c in cases], [2, 3])
        self.assertEqual([c.output_mask for c in cases], [(True, True)] * 2)

    def test_sanitizer_cases_run_on_the_host_executor(self):
        result = gpucheck.run_sanitizer_cases("cpu", "all")
        self.assertEqual(result["cases"], len(workloads.sanitizer_cases("all")))
        self.assertEqual(result["mismatches"], [])

    def test_case_moves_keep_layouts(self):
        case = workloads.WORKLOADS["positional_table_c1024"].build("cpu", scale=0.3)
        moved = workloads._move_input(case.input, "meta")
        self.assertEqual(moved.stride(0), 0)
        cl = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
        self.assertTrue(workloads._move_input(cl, "meta").is_contiguous(
            memory_format=torch.channels_last))


class TestGpuCheckFidelity(TestCase):
    """The half/bfloat16 comparison with stock's CUDA backward: its tolerance
    passes rounding differences and catches a tap moved by a pixel."""

    def _ours(self, case):
        return gpucheck.run_detgrid(case)[0]

    def test_cases_cover_every_mode_padding_and_align_corners_in_both_ranks(self):
        for dim in (2, 3):
            cases = gpucheck.fidelity_cases(torch.float16, dim)
            self.assertEqual(len({(c.interpolation_mode, c.padding_mode, c.align_corners)
                                  for c in cases}), 18)
            for case in cases:
                self.assertEqual(case.dim, dim)
                self.assertTrue(bool((case.grad_output == 1).all()))

    def test_rounding_differences_pass(self):
        for case in gpucheck.fidelity_cases(torch.float16, 2)[:6]:
            ours = self._ours(case)
            # Four ulps off everywhere: more than stock's few 16-bit atomic
            # additions per pixel make.
            noisy = ours.double() * (1 + 4 * 2.0 ** -11)
            self.assertEqual(gpucheck.fidelity_mismatches(noisy, ours), 0, case.name)

    def test_taps_computed_in_float_are_caught(self):
        # What detgrid did before (taps and weights in float, not in the
        # dtype) moves taps at this width: every mode must show it.
        for dtype in (torch.float16, torch.bfloat16):
            caught = set()
            for case in gpucheck.fidelity_cases(dtype, 2):
                ours = self._ours(case)
                in_float = gpucheck.run_detgrid(dataclasses.replace(
                    case, grad_output=case.grad_output.float(), input=case.input.float(),
                    grid=case.grid.float()))[0].to(dtype)
                if gpucheck.fidelity_mismatches(in_float, ours):
                    caught.add(case.interpolation_mode)
            self.assertEqual(caught, {0, 1, 2}, dtype)

    def test_one_tap_moved_by_a_pixel_is_caught(self):
        case = gpucheck.fidelity_cases(torch.float16, 2)[0]  # bilinear
        ours = self._ours(case)
        moved = ours.clone()
        y, x = (ours[0, 0] > 0.3).nonzero()[0].tolist()
        moved[0, 0, y, x] -= 0.3
        moved[0, 0, y, (x + 1) % ours.shape[-1]] += 0.3
        self.assertGreater(gpucheck.fidelity_mismatches(moved, ours), 0)

    def test_row_on_host_is_informative_only(self):
        row = gpucheck.fidelity_row("cpu", "float16", 2)
        self.assertEqual(row["cases"], 18)
        check = gpucheck_report.fidelity_checks([row])[0]
        self.assertFalse(check["required"])


class TestGpuCheckHostRuns(TestCase):
    def test_bitwise_on_host(self):
        result = gpucheck.run_bitwise("cpu", reps=3, scale=0.005, dtypes=("float32", "float64"))
        self.assertEqual([(r["case"], r["dim"]) for r in result["repeat"]],
                         [("tensorf_line", 2), ("simplebev_lift_3d", 3)])
        for repeat in result["repeat"]:
            self.assertEqual(repeat["detgrid"]["grad_input_distinct"], 1)
            self.assertEqual(repeat["detgrid"]["grad_grid_distinct"], 1)
            self.assertEqual(repeat["stock"]["grad_input_distinct"], 1)  # CPU stock is too
            self.assertEqual(len(repeat["input_shape"]), repeat["dim"] + 2)
        self.assertEqual([(k["dim"], k["distinct"]) for k in result["knobs"]], [(2, 1), (3, 1)])
        # executor_cases (24 per rank) and their 3 zoom-in cases with a
        # non-finite grad_output.
        self.assertEqual([(r["dtype"], r["dim"], r["cases"]) for r in result["executor"]],
                         [("float32", 2, 27), ("float32", 3, 27), ("float64", 2, 27),
                          ("float64", 3, 27)])
        for row in result["executor"]:
            self.assertEqual(row["bitwise_equal"], row["cases"], row)
            self.assertEqual(row["errors"], [])
        self.assertEqual([(r["level"], r["dtype"], r["dim"]) for r in result["core_levels"]],
                         [("grouped-channels", d, dim) for d in ("float32", "float64")
                          for dim in (2, 3)])
        for row in result["core_levels"]:
            self.assertGreater(row["cases"], 0)
            self.assertEqual(row["bitwise_equal"], row["cases"], row)
            self.assertEqual(row["errors"], [])

    def test_exact_variants_on_host(self):
        result = gpucheck.run_exact("cpu", reps=2, scale=0.005)
        self.assertEqual(result["variants"], ["exact", "exact_atomic"])
        settings = result["settings"]
        for knob in ("chunk_points", "keying", "index_bits", "grain_size"):
            self.assertTrue(any(knob in opts for opts in settings), knob)
        self.assertEqual([(r["case"], r["dim"]) for r in result["repeat"]],
                         [("tensorf_line", 2), ("simplebev_lift_3d", 3)])
        for row in result["repeat"]:
            self.assertNotIn("error", row)
            self.assertEqual(row["runs"], 2 * (2 + len(settings)))
            self.assertEqual(row["distinct"], 1, row)
            self.assertTrue(row["host_equal"], row)
        self.assertEqual([(r["dtype"], r["dim"]) for r in result["executor"]],
                         [(dtype, dim) for dtype in workloads.DTYPES for dim in (2, 3)])
        for row in result["executor"]:
            self.assertEqual(row["errors"], [], row)
            self.assertEqual(row["runs_per_case"], 2 * len(settings))
            self.assertEqual(row["variants_agree"], row["cases"], row)
            self.assertEqual(row["host_equal"], row["cases"], row)

    def test_exact_case_tells_agreement_from_equality_with_the_host(self):
        case = gpucheck.executor_row_cases("float32", 2)[0]
        self.assertEqual(gpucheck.exact_case(case, "cpu"), (True, True))
        # A stand-in whose fourth call (the third of the runs under knobs)
        # comes back with one bit of grad_input flipped.
        calls = iter(range(100))

        def one_bit_off(c, **opts):
            grad_input, grad_grid = workloads.run_detgrid(c, **opts)
            if next(calls) == 3:
                grad_input.view(torch.int32).view(-1)[0] ^= 1
            return grad_input, grad_grid

        with mock.patch.object(gpucheck, "run_detgrid", side_effect=one_bit_off):
            self.assertEqual(gpucheck.exact_case(case, "cpu"), (False, False))

    def test_repeat_hashes_count_distinct_results(self):
        values = iter(range(10))
        result = gpucheck.repeat_hashes(
            lambda: (torch.tensor([float(next(values) % 2)]), None), 4, "cpu")
        self.assertEqual(result["grad_input_distinct"], 2)
        self.assertIsNone(result["grad_grid_distinct"])

    def test_comparisons(self):
        a = torch.tensor([1.0, math.nan, math.inf, -0.0])
        self.assertTrue(workloads.bitwise_equal(a, a.clone()))
        self.assertFalse(workloads.bitwise_equal(a, torch.tensor([1.0, math.nan, math.inf, 0.0])))
        self.assertEqual(workloads.max_abs_diff(a, a.clone()), 0.0)
        self.assertEqual(workloads.max_abs_diff(a, torch.tensor([1.5, math.nan, math.inf, 0.0])),
                         0.5)
        self.assertEqual(workloads.max_abs_diff(a, torch.tensor([1.0, 0.0, math.inf, 0.0])),
                         math.inf)
        self.assertAlmostEqual(workloads.rel_err(torch.tensor([1.0, 2.2]),
                                                torch.tensor([1.0, 2.0])), 0.1, places=6)
        self.assertIsNone(workloads.rel_err(None, torch.tensor([1.0])))

    def test_sha256_of_several_tensors(self):
        a = torch.arange(6.0).reshape(2, 3)
        b = torch.tensor([1.5], dtype=torch.float64)
        self.assertEqual(workloads.sha256(a), hashlib.sha256(a.numpy().tobytes()).hexdigest())
        self.assertEqual(workloads.sha256(a.t()), workloads.sha256(a.t().contiguous()))
        joined = torch.cat([a.reshape(-1).view(torch.uint8), b.view(torch.uint8)])
        self.assertEqual(workloads.sha256(a, b), workloads.sha256(joined))
        self.assertNotEqual(workloads.sha256(a, b), workloads.sha256(b, a))
        self.assertIsNone(workloads.sha256(None))
        self.assertIsNone(workloads.sha256(a, None))

    def test_timing_on_host(self):
        # rgb_warp_bicubic_fp16 times stock's CPU float16 backward: at scale
        # 0.05 its input (11x11) is far below where that breaks
        # (detgrid.bench.stock_limits; run_timing skips the row beyond it).
        names = ["basicvsr_flow_warp", "rgb_warp_bicubic_fp16", "monodepth2_grid_only"]
        result = gpucheck.run_timing("cpu", names, warmup=1, reps=3, scale=0.05)
        self.assertEqual([r["name"] for r in result["rows"]], names)
        for row in result["rows"]:
            self.assertNotIn("error", row)
            self.assertGreater(row["stock_ms"], 0)
            self.assertGreater(row["detgrid_ms"], 0)
            self.assertAlmostEqual(row["ratio"], row["detgrid_ms"] / row["stock_ms"])
            self.assertIsNone(row["extra_peak_mib"])  # measured on CUDA only
        fp32 = result["rows"][0]
        self.assertLess(fp32["rel_err_grad_input"], 1e-5)
        self.assertLess(fp32["rel_err_grad_grid"], 1e-5)
        self.assertIsNone(result["rows"][2]["rel_err_grad_input"])  # grid-only workload
        for row in result["rows"][:2]:
            exact = row["exact"]
            for variant in ("ordered", "exact", "exact_atomic"):
                self.assertGreater(exact[f"{variant}_ms"], 0, row["name"])
            self.assertIsNone(exact["exact_peak_mib"])  # measured on CUDA only
            self.assertEqual((exact["reps"], exact["warmup"]), (5, 1))
        self.assertEqual(result["rows"][2]["exact"], {"skipped": "no grad_input"})

    def test_exact_timing_stops_at_the_deadline_too(self):
        row = gpucheck.exact_timing(workloads.WORKLOADS["liif_nearest"], "cpu", 1, 2, 0.05, 0,
                                    deadline=0.0)
        self.assertEqual(row, {"skipped": "time budget"})

    def test_timing_stops_at_its_deadline(self):
        result = gpucheck.run_timing("cpu", ["liif_nearest"], scale=0.05, deadline=0.0)
        self.assertEqual(result["rows"], [{"name": "liif_nearest", "skipped": "time budget"}])

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "t.json")
            with open(os.devnull, "w") as devnull:
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    rc = gpucheck.main(["timing", "--device", "cpu", "--reps", "2", "--warmup",
                                        "1", "--scale", "0.02", "--workloads", "liif_nearest",
                                        "--json", path])
                finally:
                    sys.stdout = stdout
            self.assertEqual(rc, 0)
            self.assertEqual(strict_json(path)["rows"][0]["name"], "liif_nearest")

    def test_exact_command_line(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "e.json")
            with open(os.devnull, "w") as devnull:
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    rc = gpucheck.main(["exact", "--device", "cpu", "--reps", "1", "--scale",
                                        "0.005", "--dtypes", "float64", "--json", path])
                finally:
                    sys.stdout = stdout
            self.assertEqual(rc, 0)
            result = strict_json(path)
        self.assertEqual([(r["dtype"], r["dim"]) for r in result["executor"]],
                         [("float64", 2), ("float64", 3)])
        self.assertEqual(len(result["repeat"]), 2)


class TestGpuCheckScript(TestCase):
    def test_syntax(self):
        subprocess.run(["bash", "-n", SCRIPT], check=True)

    def test_expecttest_wheel_travels(self):
        wheels = glob.glob(os.path.join(ROOT, "tools", "gpu_wheels", "expecttest-*.whl"))
        self.assertEqual(len(wheels), 1)

    def test_dry_run_lists_every_step(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script({"DETGRID_GPU_CHECK_DRY_RUN": "1", "OUT": out})
            self.assertEqual(proc.returncode, 0, proc.stdout)
            order = [line.split("dry-run: ")[1].split()[0]
                     for line in proc.stdout.splitlines() if "dry-run: " in line]
            self.assertEqual(order, list(STEP_NAMES))
            # The required steps right after the two cheap set-up steps, so a
            # cold run that the budget cuts has still answered them.
            self.assertEqual(tuple(order[2:2 + len(gpucheck_report.REQUIRED_STEPS)]),
                             gpucheck_report.REQUIRED_STEPS)
            self.assertIn("budget=300s", proc.stdout)
            data = strict_json(os.path.join(out, "gpu_check.json"))
            self.assertEqual(data["verdict"], "DRY-RUN")
            self.assertEqual({s["status"] for s in data["steps"]}, {"dry-run"})
            self.assertEqual(sorted(os.listdir(out)),
                             ["gpu_check.json", "gpu_check.log", "gpu_check.md"])

    def test_env_and_report_run_without_the_extension(self):
        # The script's env, build-info and report steps where the build
        # failed: a copy of the package without the compiled extension.
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "tools", "detgrid")
            shutil.copytree(os.path.join(ROOT, "tools", "detgrid"), pkg,
                            ignore=shutil.ignore_patterns("*.so", "__pycache__"))
            work, out = os.path.join(tmp, "work"), os.path.join(tmp, "out")
            os.makedirs(work)

            def run(*args):
                return subprocess.run([sys.executable, os.path.join(pkg, "kit", "gpucheck.py"),
                                       *args],
                                      cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=120)

            proc = run("env", "--root", ROOT, "--json", os.path.join(work, "env.json"))
            self.assertEqual(proc.returncode, 0, proc.stdout)
            proc = run("build-info", "--json", os.path.join(work, "build.json"))
            self.assertEqual(proc.returncode, 1, proc.stdout)
            build = strict_json(os.path.join(work, "build.json"))
            self.assertIn("detgrid._C", build["import_error"])
            proc = run("report", "--work", work, "--out", out)
            self.assertEqual(proc.returncode, 0, proc.stdout)
            data = strict_json(os.path.join(out, "gpu_check.json"))
        self.assertEqual(data["env"]["torch"], torch.__version__)
        self.assertFalse(data["build"]["has_cuda_kernels"])
        self.assertEqual(data["verdict"], "INCOMPLETE")

    def test_host_run_records_results_and_optional_timeouts(self):
        # Required steps, then the optional exact outliving what is left of
        # the budget: it is killed and recorded, timing after it is skipped,
        # the report still comes, and neither keeps the verdict from what the
        # required steps make (INCOMPLETE only for those not selected, and
        # for the claims a host run cannot make).
        required = ("kernels", "bitwise", "routes", "memcheck")
        with tempfile.TemporaryDirectory() as out:
            proc = run_script({
                "OUT": out,
                "DETGRID_GPU_CHECK_DEVICE": "cpu",
                "DETGRID_GPU_CHECK_SCALE": "0.005",
                "DETGRID_GPU_CHECK_REPS": "2",
                "DETGRID_GPU_CHECK_EXACT_REPS": "1000000",
                "DETGRID_GPU_CHECK_BUDGET_S": "40",
                "DETGRID_GPU_CHECK_MIN_S": "2",
                "DETGRID_GPU_CHECK_STEPS": ",".join(required + ("exact", "timing")),
            })
            data = strict_json(os.path.join(out, "gpu_check.json"))
            with open(os.path.join(out, "gpu_check.log")) as f:
                log = f.read()
        steps = {s["name"]: s for s in data["steps"]}
        self.assertEqual({k: steps[k]["status"] for k in required}, dict.fromkeys(required, "ok"),
                         proc.stdout)
        self.assertEqual((steps["exact"]["status"], steps["exact"]["note"]),
                         ("timeout", "limit cut to the budget's rest"))
        self.assertEqual((steps["timing"]["status"], steps["timing"]["note"]),
                         ("skipped", "out of budget"))
        self.assertEqual(steps["build"]["note"], "not selected")
        self.assertIn("exact: timeout", proc.stdout)
        self.assertIn("=================== bitwise", log)
        self.assertEqual([k["distinct"] for k in data["bitwise"]["knobs"]], [1, 1])
        checks = {c["check"]: c["result"] for c in data["checks"]}
        self.assertEqual(checks["device == host executor (float64, 3-D)"], "pass")
        self.assertEqual(checks["grid-only calls under enable(): no error"], "pass")
        self.assertEqual(checks["grid-only grad_grid == stock's (half, bfloat16)"], "pass")
        self.assertEqual(checks["cross-device"], "n/a")
        self.assertEqual(checks["exact variants"], "n/a")
        self.assertEqual(data["sanitizer"]["memcheck"]["status"], "unavailable")
        self.assertEqual(data["verdict"], "INCOMPLETE")
        self.assertEqual(data["blockers"]["FAIL"], [])
        not_selected = [f"step {name}: skipped, not selected" for name in
                        gpucheck_report.REQUIRED_STEPS if name not in required]
        self.assertEqual(data["blockers"]["INCOMPLETE"][:len(not_selected)], not_selected)
        self.assertFalse([b for b in data["blockers"]["INCOMPLETE"]
                          if "exact" in b or "timing" in b])
        self.assertNotEqual(proc.returncode, 0)

    def test_build_step_reuses_a_build_of_the_same_inputs(self):
        # A warm rerun keeps build/ and the extension: the build step builds
        # nothing while what it is made from is unchanged in content, even
        # under new mtimes (a re-sent working tree), and builds again once a
        # source changes or the extension is gone. setup.py is a stand-in.
        with tempfile.TemporaryDirectory() as tmp:
            for rel in ("tools/gpu_check.sh", "setup.py", "tools/detgrid/kit/toolchain.py"):
                os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
                shutil.copy(os.path.join(ROOT, rel), os.path.join(tmp, rel))
            shutil.copytree(os.path.join(ROOT, "aten_kernels"), os.path.join(tmp, "aten_kernels"))
            python = os.path.join(tmp, "python")
            with open(python, "w") as f:
                f.write('#!/usr/bin/env bash\nif [[ "$1" == setup.py ]]; then '
                        'echo STAND-IN BUILD; touch tools/detgrid/_C.stand_in.so; exit 0; fi\n'
                        f'exec {sys.executable} "$@"\n')
            os.chmod(python, 0o755)
            source = os.path.join(tmp, "aten_kernels", "extension", "register.cpp")

            def build():
                proc = subprocess.run(
                    ["bash", os.path.join(tmp, "tools", "gpu_check.sh"), "__step", "build"],
                    cwd=tmp, env={**os.environ, "DETGRID_PYTHON": python}, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
                self.assertEqual(proc.returncode, 0, proc.stdout)
                return "STAND-IN BUILD" in proc.stdout

            self.assertTrue(build())
            # What loading setup.py's helpers by path leaves behind.
            cache = os.path.join(tmp, "aten_kernels", "hostify", "__pycache__")
            os.makedirs(cache, exist_ok=True)
            with open(os.path.join(cache, "hostify.cpython-312.pyc"), "wb") as f:
                f.write(b"bytecode")
            later = os.stat(source).st_mtime + 1000
            for folder, _, files in os.walk(os.path.join(tmp, "aten_kernels")):
                for name in files:
                    os.utime(os.path.join(folder, name), (later, later))
            self.assertFalse(build())
            with open(source, "a") as f:
                f.write("// changed\n")
            self.assertTrue(build())
            self.assertFalse(build())
            os.remove(os.path.join(tmp, "tools", "detgrid", "_C.stand_in.so"))
            self.assertTrue(build())


if __name__ == "__main__":
    run_tests()
