# Owner(s): ["module: nn"]
"""Tests of the GPU check's parts that need no GPU (tools/gpu_check.sh,
detgrid.kit.gpucheck, detgrid.kit.gpucheck_report, detgrid.bench.workloads): report
assembly, workloads, sanitizer parsing, and the bitwise and timing logic run
on the host build.

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

from detgrid import levels, ops
from detgrid.bench import workloads
from detgrid.kit import gpucheck, gpucheck_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "gpu_check.sh")

# In the order the script runs them: what a verdict needs first.
STEP_NAMES = ("env", "deps", "build", "kernels", "bitwise", "routes", "tests", "racecheck",
              "memcheck", "initcheck", "timing")
OPTIONAL_STEPS = tuple(n for n in STEP_NAMES if n not in gpucheck_report.REQUIRED_STEPS)
BUILDS = levels.CORE_BUILDS
TOP = levels.TOP
OTHER = levels.CORE_BUILDS[0]  # a build other than the default's
DIMS = ("2-D", "3-D")
# Stock's 3-D bicubic (tricubic) backward exists from torch 2.15.
STOCK_HAS_TRICUBIC = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 15)
_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}


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


def _row(cases, equal, errors=(), **fields):
    """A device == host row as gpucheck._compare_cases ends it."""
    return {**fields, "cases": cases, "bitwise_equal": equal,
            "max_abs_diff": 0.0 if equal == cases else math.inf,
            "mismatches": [] if equal == cases else ["x"], "errors": list(errors)}


def fake_bitwise(distinct=1, distinct_3d=1, other_build_hash="a", core_equal=27,
                 core_errors=(), core_equal_3d=27, golden_equal=120, host_differ=(),
                 grid_equal=24, default_equal=27, stock_failing=(), fidelity_failing=(),
                 host_contracts=True):
    """bitwise.json as `gpucheck bitwise` writes it on a GPU: two dtypes here (the
    real run has four); each argument breaks one claim."""
    def hashes(det_distinct, head="a"):
        return {"reps": 100, "grad_input_distinct": det_distinct, "grad_grid_distinct": 1,
                "grad_input_sha256": head, "grad_grid_sha256": "g"}

    def repeat(case, dim, input_shape, grid_shape, det_distinct):
        return {"case": case, "dim": dim, "input_shape": input_shape, "grid_shape": grid_shape,
                "detgrid": hashes(det_distinct),
                "builds": {level: hashes(1, other_build_hash if level != TOP else "a")
                           for level in BUILDS},
                "stock": {"reps": 100, "grad_input_distinct": 97, "grad_grid_distinct": 1}}

    def core_equal_in(level, dtype, dim):
        if (level, dtype) != (TOP, "float32"):
            return 27
        return core_equal if dim == 2 else core_equal_3d

    dtypes = ("float32", "float16")
    return {
        "device": "cuda",
        "builds": list(BUILDS),
        "default_build": TOP,
        "host_contracts": host_contracts,
        "repeat": [repeat("tensorf_line", 2, [1, 48, 300, 1], [1, 1000000, 1, 2], distinct),
                   repeat("simplebev_lift_3d", 3, [4, 96, 1, 42, 75], [4, 150, 6, 150, 3],
                          distinct_3d)],
        "core": [_row(27, core_equal_in(level, dtype, dim),
                      core_errors if (level, dtype, dim) == (TOP, "float32", 2) else (),
                      level=level, dtype=dtype, dim=dim)
                 for level in BUILDS for dtype in dtypes for dim in (2, 3)],
        "golden": [{**_row(120, golden_equal if level == TOP else 120, level=level),
                    "host_differ": list(host_differ), "host_differ_count": len(host_differ)}
                   for level in BUILDS],
        "default_grad_input": [_row(27, default_equal if (dtype, dim) == ("float16", 3) else 27,
                                    gradient="grad_input", dtype=dtype, dim=dim)
                               for dtype in dtypes for dim in (2, 3)],
        "grid_gradient": [_row(24, grid_equal if (dtype, dim) == ("float32", 2) else 24,
                               gradient="grad_grid", dtype=dtype, dim=dim)
                          for dtype in dtypes for dim in (2, 3)],
        "stock": [{"dtype": dtype, "dim": dim, "device": "cuda", "cases": 18,
                   "tolerance": {"float32": 1e-4, "float16": 1e-2}[dtype],
                   "max_rel_diff": 1e-7,
                   "failing": list(stock_failing) if (dtype, dim) == ("float32", 3) else [],
                   "errors": []}
                  for dtype in dtypes for dim in (2, 3)],
        "fidelity": [{"dtype": dtype, "dim": dim, "device": "cuda", "cases": 18,
                      "failing": list(fidelity_failing) if (dtype, dim) == ("float16", 2) else [],
                      "max_abs_diff": 0.002, "errors": []}
                     for dtype in ("float16", "bfloat16") for dim in (2, 3)],
    }


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


def fake_timing(equals_default=True):
    return {"device": "cuda", "scale": 1.0, "builds": list(BUILDS), "default_build": TOP,
            "rows": [
        {"name": "rtdetr_l80", "load": "sparse", "input_shape": [128, 32, 80, 80],
         "grid_shape": [128, 500, 4, 2], "dtype": "float32", "mode": "bilinear",
         "padding": "zeros", "align_corners": False, "output_mask": [True, True],
         "stock_ms": 1.5, "detgrid_ms": 1.2, "ratio": 0.8, "extra_peak_mib": 12.0,
         "rel_err_grad_input": 1e-7, "rel_err_grad_grid": None,
         "builds": {TOP: {"ms": 1.2, "ratio": 0.8},
                    OTHER: {"ms": 3.0, "ratio": 2.0, "equals_default": equals_default}}},
        {"name": "monodepth2_grid_only", "load": "smooth, grid only",
         "input_shape": [12, 3, 192, 640], "grid_shape": [12, 192, 640, 2], "dtype": "float32",
         "mode": "bilinear", "padding": "border", "align_corners": False,
         "output_mask": [False, True], "stock_ms": 2.0, "detgrid_ms": 2.5, "ratio": 1.25,
         "extra_peak_mib": 0.0, "rel_err_grad_input": None, "rel_err_grad_grid": 0.0,
         "builds": {}},
        {"name": "liif_nearest", "error": "RuntimeError: boom"},
    ]}


class TestGpuCheckReport(TestCase):
    def write_work(self, work, *, steps=None, bitwise=None, memcheck="clean",
                   junit=JUNIT, routes=None, timing=None, replaced=None):
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
            "routes.json": routes or fake_routes(),
            "timing.json": timing or fake_timing(),
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

    def assert_fails(self, check, **kwargs):
        """The fake results with kwargs' one claim broken: the check fails and
        with it the verdict; returns the report."""
        data, loaded, md = self.report(junit=PASSING_JUNIT, **kwargs)
        self.assertEqual(self.checks(data)[check], "fail")
        self.assertEqual(data["verdict"], "FAIL")
        self.assertTrue(any(b.startswith(check) for b in data["blockers"]["FAIL"]))
        return data, md

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
        self.assertEqual(loaded["bitwise"]["core"][0]["max_abs_diff"], 0.0)
        self.assertEqual(loaded["sanitizer"]["memcheck"]["status"], "clean")
        self.assertEqual(len(loaded["timing"]["rows"]), 3)
        checks = self.checks(data)
        self.assertEqual(checks["grid-only calls under enable(): no error"], "pass")
        self.assertEqual(checks["grid-only grad_grid == stock's (half, bfloat16)"], "pass")
        self.assertEqual(checks["grid-only grad_grid == stock's (float32)"], "fail")  # info only
        self.assertEqual(checks["cross-device"], "n/a")
        for dims in DIMS:
            self.assertEqual(checks[f"repeat runs bitwise identical ({dims})"], "pass")
            self.assertEqual(checks[f"every build gives the default's bits ({dims})"], "pass")
            for dtype in ("float32", "float16"):
                for level in BUILDS:
                    self.assertEqual(checks[f"{level}: device == host build ({dtype}, {dims})"],
                                     "pass")
                self.assertEqual(checks[f"default grad_input == host ({dtype}, {dims})"], "pass")
                self.assertEqual(checks[f"grad_grid == host grid gradient ({dtype}, {dims})"],
                                 "pass")
                self.assertEqual(checks[f"agrees with stock ({dtype}, {dims})"], "pass")
        for level in BUILDS:
            self.assertEqual(checks[f"{level}: golden corpus on the device"], "pass")
        # The claims about bits decide: every one of them is required.
        for c in data["checks"]:
            if c["step"] == "bitwise":
                self.assertTrue(c["required"], c)
        self.assertTrue(md.startswith("# detgrid GPU check: PASS"))
        self.assertIn("| repeat runs bitwise identical (3-D) | pass | 100 runs of "
                      "simplebev_lift_3d 4×96×1×42×75: distinct hashes grad_input=1", md)
        self.assertIn(f"| {TOP} grad_input | float32 | 3-D | 27 | 27 | 0 |", md)
        self.assertIn(f"| default grad_input ({TOP}) | float16 | 2-D | 27 | 27 | 0 |", md)
        self.assertIn("| default grad_grid | float32 | 2-D | 24 | 24 | 0 |", md)
        self.assertIn(f"| {TOP} | 120 | 120 | 0 |", md)
        self.assertIn("| rtdetr_l80 | 128×32×80×80 | 128×500×4×2 | float32 |", md)
        self.assertIn(f"| stock ms | detgrid ms | det/stock | {OTHER} ms | {OTHER}/stock |", md)
        self.assertIn("| 1.5 | 1.2 | 0.80 | 3 | 2.00 | 12.0 |", md)
        self.assertIn("| 2 | 2.5 | 1.25 | – | – | 0.0 |", md)  # a grid-only call runs no build
        self.assertIn("RuntimeError: boom", md)
        self.assertIn("CUDA events", md)
        # A timed workload that raised is a finding of the optional timing
        # step, listed above the tables; the float32 grid-only row that
        # differs is informative (a required step's), so not one.
        self.assertEqual(loaded["blockers"], {"FAIL": [], "INCOMPLETE": []})
        self.assertEqual(checks["timing table"], "fail")
        self.assertEqual(loaded["optional_findings"],
                         ["timing table: 2/3 workloads timed, raised: ['liif_nearest']"])
        self.assertLess(md.index("**Optional findings**"), md.index("## Checks"))
        self.assertIn("| timing table | fail (optional) |", md)
        self.assertIn("| grid-only grad_grid == stock's (float32) | fail (info) |", md)

    def test_failures_make_the_verdict_fail(self):
        data, _, md = self.report()  # the junit has a failure and an error
        self.assertEqual(data["verdict"], "FAIL")
        self.assertEqual(self.checks(data)["CUDA tests"], "fail")
        self.assertIn("test_b_cuda", md)
        data, _ = self.assert_fails("repeat runs bitwise identical (2-D)",
                                    bitwise=fake_bitwise(distinct=2))
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (3-D)"], "pass")
        data, _ = self.assert_fails("repeat runs bitwise identical (3-D)",
                                    bitwise=fake_bitwise(distinct_3d=2))
        self.assertEqual(self.checks(data)["repeat runs bitwise identical (2-D)"], "pass")
        broken = fake_bitwise()
        broken["repeat"][1]["builds"][OTHER] = {"error": "RuntimeError: CUDA error: illegal "
                                                         "address"}
        _, md = self.assert_fails("repeat runs bitwise identical (3-D)", bitwise=broken)
        self.assertIn("illegal address", md)
        self.assert_fails("half/bfloat16 taps as stock's (float16, 2-D)",
                          bitwise=fake_bitwise(fidelity_failing=["fidelity_2d_x"]))

    def test_a_build_with_other_bits_than_the_default_fails(self):
        # Each build repeats alike, but one gives other bits than the rest.
        for dims in DIMS:
            self.assert_fails(f"every build gives the default's bits ({dims})",
                              bitwise=fake_bitwise(other_build_hash="b"))

    def test_the_device_must_give_the_host_builds_bits(self):
        # The key claim: no FMA contraction or order may differ between nvcc's
        # build and the host's; one case off fails, as does an error.
        check = f"{TOP}: device == host build (float32, 2-D)"
        data, md = self.assert_fails(check, bitwise=fake_bitwise(core_equal=26))
        self.assertEqual(self.checks(data)[f"{TOP}: device == host build (float32, 3-D)"],
                         "pass")
        self.assertIn("26/27 bitwise equal to the host build", md)
        self.assert_fails(f"{TOP}: device == host build (float32, 3-D)",
                          bitwise=fake_bitwise(core_equal_3d=0))
        _, md = self.assert_fails(check, bitwise=fake_bitwise(core_errors=["x: RuntimeError"]))
        self.assertIn("x: RuntimeError", md)

    def test_the_golden_corpus_must_keep_its_bits_on_the_device(self):
        _, md = self.assert_fails(f"{TOP}: golden corpus on the device",
                                  bitwise=fake_bitwise(golden_equal=119))
        self.assertIn("119/120 bitwise equal to the golden bits", md)
        # The host core build itself off its digests: the golden bits are
        # not there to compare with, a failure too.
        data, md = self.assert_fails(f"{OTHER}: golden corpus on the device",
                                     bitwise=fake_bitwise(host_differ=["case_a"]))
        self.assertIn("misses 1 golden digests: ['case_a']", md)

    def test_golden_corpus_not_found_or_failing_as_a_whole(self):
        bw = fake_bitwise()
        bw["golden"] = [{"skipped": "no tests/golden/core.py in this tree"}]
        data, _, _ = self.report(junit=PASSING_JUNIT, bitwise=bw)
        self.assertEqual(self.checks(data)["golden corpus on the device"], "n/a")
        self.assertEqual(data["verdict"], "INCOMPLETE")
        bw["golden"] = [{"error": "ImportError: golden"}]
        self.assert_fails("golden corpus on the device", bitwise=bw)

    def test_the_default_backward_must_give_the_hosts_gradients(self):
        self.assert_fails("grad_grid == host grid gradient (float32, 2-D)",
                          bitwise=fake_bitwise(grid_equal=23))
        self.assert_fails("default grad_input == host (float16, 3-D)",
                          bitwise=fake_bitwise(default_equal=25))

    def test_a_host_without_fma_cannot_answer_for_the_core(self):
        # Its host build contracts nothing, so it cannot give nvcc's bits:
        # no answer (INCOMPLETE), not a failure; the grid gradient contracts
        # on neither side and still answers.
        data, _, md = self.report(junit=PASSING_JUNIT, bitwise=fake_bitwise(
            host_contracts=False, core_equal=3))
        checks = self.checks(data)
        self.assertEqual(checks[f"{TOP}: device == host build (float32, 2-D)"], "n/a")
        self.assertEqual(checks["default grad_input == host (float32, 2-D)"], "n/a")
        self.assertEqual(checks["grad_grid == host grid gradient (float32, 2-D)"], "pass")
        self.assertEqual(data["verdict"], "INCOMPLETE")
        self.assertIn("contracts no FMA on this CPU", md)

    def test_agreement_with_stock_is_required_on_the_gpu_only(self):
        _, md = self.assert_fails("agrees with stock (float32, 3-D)",
                                  bitwise=fake_bitwise(stock_failing=["3d_zoom"]))
        self.assertIn("17/18 finite cases within 0.0001 of stock cuda", md)
        bw = fake_bitwise(stock_failing=["3d_zoom"])
        for row in bw["stock"]:
            row["device"] = "cpu"
        data, _, md = self.report(junit=PASSING_JUNIT, bitwise=bw)
        self.assertEqual(self.checks(data)["agrees with stock (float32, 3-D)"], "fail")
        self.assertEqual(data["verdict"], "PASS")
        self.assertIn("| agrees with stock (float32, 3-D) | fail (info) |", md)

    def test_a_timed_build_with_other_bits_is_an_optional_finding(self):
        data, _, _ = self.report(junit=PASSING_JUNIT, timing=fake_timing(equals_default=False))
        self.assertEqual(self.checks(data)["timing table"], "fail")
        self.assertEqual(data["verdict"], "PASS")
        self.assertIn(f"other bits than the default: ['rtdetr_l80 ({OTHER})']",
                      data["optional_findings"][0])

    def test_bitwise_not_run_is_not_applicable(self):
        data, _, _ = self.report(junit=PASSING_JUNIT, bitwise={"device": "cuda"})
        checks = self.checks(data)
        for name in ("repeat runs bitwise identical", "device == host build",
                     "golden corpus on the device", "default grad_input == host",
                     "grad_grid == host grid gradient", "agrees with stock"):
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
        ok_timing = fake_timing()
        ok_timing["rows"].pop()  # the row that raised: a finding of its own
        for name in STEP_NAMES:
            for status, rc in (("fail", 1), ("skipped", ""), ("timeout", 124)):
                with self.subTest(step=name, status=status):
                    steps = [(n, "ok", 0, 3, 60) for n in STEP_NAMES]
                    steps[STEP_NAMES.index(name)] = (name, status, rc, 60, 60)
                    data, _, md = self.report(junit=PASSING_JUNIT, steps=steps,
                                              timing=ok_timing)
                    required = name in gpucheck_report.REQUIRED_STEPS
                    self.assertEqual(data["verdict"], expected[status] if required else "PASS")
                    line = f"step {name}: {status}"
                    blocking = data["blockers"][expected[status]]
                    self.assertEqual(any(b.startswith(line) for b in blocking), required)
                    self.assertEqual(data["optional_findings"],
                                     [f"{line}, rc 1"] if not required and status == "fail"
                                     else [])
                    self.assertEqual(f"{name} ({status}" in md.split("## Checks")[0],
                                     not required and status != "fail")

    def test_cold_run_without_the_optional_steps_passes(self):
        # The budget ran out after the required steps: initcheck was cut and
        # left nothing, timing never started.
        late = ("initcheck", "timing")
        steps = [(n, "ok", 0, 3, 60) for n in STEP_NAMES if n not in late]
        steps += [("initcheck", "timeout", 124, 21, 21, "limit cut to the budget's rest"),
                  ("timing", "skipped", "", 0, 0, "out of budget")]
        data, _, md = self.report(junit=PASSING_JUNIT, steps=steps,
                                  replaced={"timing.json": None})
        self.assertEqual(data["verdict"], "PASS")
        checks = self.checks(data)
        for name in ("compute-sanitizer initcheck", "timing table"):
            self.assertEqual(checks[name], "n/a")
        self.assertEqual(data["optional_findings"], [])
        self.assertIn("Optional steps not run to their end: initcheck (timeout, limit cut to the "
                      "budget's rest), timing (skipped, out of budget).", md)

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
        # host build and prints the real tool's summary line.
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

    def test_two_chunk_cases_in_each_rank_and_reduced_dtype(self):
        # Each rank has calls that the core sorts and sums in two chunks
        # (records past its 2^19 per chunk), in float32 and in float16, whose
        # sums wait in the float scratch between chunks; the shapes alone
        # decide the chunks, so the counts come from meta tensors.
        for dim in (2, 3):
            found = set()
            for c in workloads.sanitizer_cases("all"):
                if c.dim != dim or "multichunk" not in c.name:
                    continue
                meta = dataclasses.replace(c, **{k: getattr(c, k).to("meta") for k in
                                                 ("grad_output", "input", "grid")})
                self.assertEqual(workloads.work_counters(meta)["chunks"], 2, c.name)
                found.add(c.input.dtype)
            self.assertEqual(found, {torch.float32, torch.float16}, dim)

    def test_host_match_cases_per_rank(self):
        for dim, count in ((2, 24), (3, 24)):
            cases = workloads.host_match_cases(torch.float64, dim=dim)
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
        names = {c.name for c in workloads.host_match_cases(torch.float32, dim=3)}
        self.assertIn("3d_trilinear_border_ac", names)
        self.assertIn("3d_nearest_zeros_zoom", names)
        self.assertIn("3d_tricubic_reflection_special", names)

    def test_non_finite_grad_output_cases_make_nans_in_both_gradients(self):
        # Where NaNs come from arithmetic, the GPU's bits differ from the
        # host's: these cases are what makes the device == host rows test
        # the NaN rule (detgrid.kit.bitwise).
        for dim in (2, 3):
            cases = [c for c in gpucheck.match_cases("float32", dim)
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
        # points per voxel over more than eight of the core's chunks (2^19
        # records: 65,536 trilinear points).
        self.assertEqual([name for name, _ in gpucheck.REPEAT_WORKLOADS],
                         ["tensorf_line", "simplebev_lift_3d"])
        dims = [workloads.BENCH_WORKLOADS[name].dim for name, _ in gpucheck.REPEAT_WORKLOADS]
        self.assertEqual(dims, [2, 3])
        name, relative = gpucheck.REPEAT_WORKLOADS[1]
        workload = workloads.BENCH_WORKLOADS[name]
        in_shape, grid_shape = workload.shapes(relative)
        self.assertGreater(workload.records(relative), 8 * ops.CORE_CHUNK_RECORDS)
        points = math.prod(grid_shape[:-1])
        self.assertGreater(points / in_shape[0] / math.prod(in_shape[2:]), 16)
        cases = gpucheck.repeat_cases("cpu", scale=0.01)
        self.assertEqual([c.dim for c in cases], [2, 3])
        self.assertEqual([c.output_mask for c in cases], [(True, True)] * 2)

    def test_sanitizer_cases_run_on_the_host_build(self):
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

    def test_same_layout_on_keeps_strides_offsets_and_stride_zero(self):
        # The golden corpus's layouts: an expanded grad_output (all strides
        # 0), channels_last, a grid that views every other element.
        storage = torch.arange(24.0).reshape(2, 3, 4)
        for t in (torch.randn(1).expand(2, 3, 4, 5),
                  torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
                  storage[..., 1:3], storage[1]):
            moved = gpucheck.same_layout_on(t, "meta")
            self.assertEqual((moved.shape, moved.stride(), moved.storage_offset()),
                             (t.shape, t.stride(), t.storage_offset()))
            self.assertIs(gpucheck.same_layout_on(t, "cpu"), t)


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
        builds = list(levels.CORE_BUILDS)
        self.assertEqual((result["builds"], result["default_build"]), (builds, levels.TOP))
        self.assertEqual([(r["case"], r["dim"]) for r in result["repeat"]],
                         [("tensorf_line", 2), ("simplebev_lift_3d", 3)])
        for repeat in result["repeat"]:
            runs = [repeat["detgrid"]] + [repeat["builds"][level] for level in builds]
            for run in runs:
                self.assertEqual((run["grad_input_distinct"], run["grad_grid_distinct"]), (1, 1))
            self.assertEqual(len({run["grad_input_sha256"] for run in runs}), 1)
            self.assertEqual(repeat["stock"]["grad_input_distinct"], 1)  # CPU stock is too
            self.assertEqual(len(repeat["input_shape"]), repeat["dim"] + 2)
        # host_match_cases (24 per rank) and their 3 zoom-in cases with a
        # non-finite grad_output, per build.
        self.assertEqual([(r["level"], r["dtype"], r["dim"], r["cases"]) for r in result["core"]],
                         [(level, dtype, dim, 27) for level in builds
                          for dtype in ("float32", "float64") for dim in (2, 3)])
        for key, cases in (("core", 27), ("default_grad_input", 27), ("grid_gradient", 27)):
            for row in result[key]:
                self.assertEqual(row["cases"], cases, (key, row))
                self.assertEqual(row["bitwise_equal"], row["cases"], (key, row))
                self.assertEqual(row["errors"], [], (key, row))
        if result["host_contracts"]:
            self.assertEqual([r["level"] for r in result["golden"]], builds)
            for row in result["golden"]:
                self.assertEqual((row["cases"], row["bitwise_equal"]), (120, 120), row)
                self.assertEqual((row["host_differ_count"], row["errors"]), (0, []), row)
        # The finite cases (the special grids left out), within tolerance of
        # aten's CPU kernel; before torch 2.15 it refuses the tricubic ones.
        self.assertEqual([(r["dtype"], r["dim"], r["cases"] + r["refused"])
                          for r in result["stock"]],
                         [(dtype, dim, 21) for dtype in ("float32", "float64") for dim in (2, 3)])
        for row in result["stock"]:
            self.assertEqual((row["failing"], row["errors"]), ([], []), row)
            self.assertEqual(row["refused"], 0 if row["dim"] == 2 or STOCK_HAS_TRICUBIC else 7)
        # On the host every claim of the step passes but fidelity's, which is
        # informative there (stock's CPU kernel rounds at every operation).
        checks = [c for c in gpucheck_report.verdict_checks({"bitwise": result})
                  if c["step"] == "bitwise"]
        self.assertEqual({c["check"].split(" (")[0] for c in checks if c["result"] != "pass"},
                         {"half/bfloat16 taps as stock's"})
        self.assertFalse([c for c in checks if c["required"] and c["result"] != "pass"])

    def test_core_row_counts_the_device_run_against_the_host_build(self):
        # The reference (the host build at its own launches) runs first.
        case = gpucheck.match_cases("float32", 2)[0]
        reference = gpucheck.core_grad_input(case, levels.CORE)
        calls = []

        def one_bit_off(c, level=levels.TOP, launch=()):
            calls.append((level, tuple(launch)))
            result = reference.clone()
            if launch:
                result.view(torch.int32).view(-1)[0] ^= 1
            return result

        with mock.patch.object(gpucheck, "core_grad_input", side_effect=one_bit_off):
            row = gpucheck.core_row("cpu", levels.CORE, "float32", 2, [case])
        self.assertEqual(calls, [(levels.CORE, ()), (levels.CORE, gpucheck.HOST_STAND_IN_LAUNCH)])
        self.assertEqual((row["cases"], row["bitwise_equal"], row["mismatches"]),
                         (1, 0, [case.name]))
        self.assertGreater(row["max_abs_diff"], 0)

    def test_golden_rows_find_a_build_off_the_golden_bits(self):
        # A stand-in device run that gives one case's grad_input one bit off:
        # that build's row counts it; the reference is the host core build,
        # whose digests are core_digests.json's.
        if not torch.ops.detgrid._core_host_contracts():
            self.skipTest("the golden bits need a host build with FMA contraction")
        core, _ = gpucheck._golden_modules()
        real = core.grad_input
        first = core.CASES[0].name

        def off(case, level="core", *launch):
            result = real(case, level, *launch)
            if launch and level == levels.TOP and case.name == first:
                result.view(_INT_OF[result.dtype]).view(-1)[0] ^= 1
            return result

        with mock.patch.object(core, "grad_input", side_effect=off):
            rows = gpucheck.golden_rows("cpu")
        by_level = {r["level"]: r for r in rows}
        self.assertEqual(by_level[levels.TOP]["mismatches"], [first])
        self.assertEqual(by_level[levels.TOP]["bitwise_equal"], len(core.CASES) - 1)
        for level in levels.CORE_BUILDS[:-1]:
            self.assertEqual(by_level[level]["bitwise_equal"], len(core.CASES))

    def test_golden_rows_without_fma_contraction_are_skipped(self):
        with mock.patch.object(torch.ops.detgrid, "_core_host_contracts", return_value=False):
            (row,) = gpucheck.golden_rows("cpu")
        self.assertIn("no FMA", row["skipped"])
        self.assertEqual(gpucheck_report.golden_checks({"golden": [row]})[0]["result"], "n/a")

    def test_stock_row_catches_a_result_off_stock(self):
        cases = [c for c in workloads.host_match_cases(torch.float32, 0, 2)
                 if gpucheck._finite(c)][:3]
        row = gpucheck.stock_row("cpu", "float32", 2, cases)
        self.assertEqual((row["cases"], row["failing"]), (3, []))
        real = gpucheck.run_detgrid

        def moved_weight(case, **options):
            grad_input, grad_grid = real(case, **options)
            grad_input = grad_input.clone()
            grad_input.view(-1)[0] += 0.5 * grad_input.abs().max()
            return grad_input, grad_grid

        with mock.patch.object(gpucheck, "run_detgrid", side_effect=moved_weight):
            row = gpucheck.stock_row("cpu", "float32", 2, cases)
        self.assertEqual(row["failing"], [c.name for c in cases])

    def test_stock_rows_leave_non_finite_cases_out(self):
        cases = workloads.host_match_cases(torch.float64, 0, 2)
        row = gpucheck.stock_row("cpu", "float64", 2, cases)
        self.assertEqual(row["cases"], sum(map(gpucheck._finite, cases)))
        self.assertLess(row["cases"], len(cases))

    def test_a_case_stock_refuses_is_not_a_failure(self):
        # Tricubic before torch 2.15: counted, not run, the row still passes;
        # detgrid raising where stock runs is an error.
        cases = [c for c in workloads.host_match_cases(torch.float32, 0, 2)
                 if gpucheck._finite(c)][:2]
        refusing = mock.patch.object(gpucheck, "run_stock",
                                     side_effect=RuntimeError("only supports 4D input"))
        with refusing:
            row = gpucheck.stock_row("cpu", "float32", 2, cases)
        self.assertEqual((row["cases"], row["refused"], row["errors"]), (0, 2, []))
        self.assertIn("only supports 4D input", row["refused_first"][0])
        with mock.patch.object(gpucheck, "run_detgrid", side_effect=RuntimeError("boom")):
            row = gpucheck.stock_row("cpu", "float32", 2, cases)
        self.assertEqual((row["cases"], row["refused"], len(row["errors"])), (0, 0, 2))
        (check,) = gpucheck_report.stock_checks([{**row, "device": "cuda"}])
        self.assertEqual(check["result"], "fail")

    def test_repeat_hashes_count_distinct_results(self):
        values = iter(range(10))
        result = gpucheck.repeat_hashes(
            lambda: (torch.tensor([float(next(values) % 2)]), None), 4, "cpu")
        self.assertEqual(result["grad_input_distinct"], 2)
        self.assertEqual(result["grad_input_sha256"], workloads.sha256(torch.tensor([0.0])))
        self.assertIsNone(result["grad_grid_distinct"])

    def test_repeat_hashes_count_a_nan_payload_as_another_result(self):
        # One device's runs must not differ at all: the NaN rule is for
        # device against host, not for run against run.
        nans = iter([0x7FC00000, 0x7FFFFFFF])
        result = gpucheck.repeat_hashes(lambda: (torch.tensor([next(nans)], dtype=torch.int32)
                                                 .view(torch.float32), None), 2, "cpu")
        self.assertEqual(result["grad_input_distinct"], 2)

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
        self.assertEqual((result["builds"], result["default_build"]),
                         (list(levels.CORE_BUILDS), levels.TOP))
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
        for row in result["rows"][:2]:
            self.assertEqual(list(row["builds"]), [levels.TOP, *gpucheck.OTHER_BUILDS])
            self.assertEqual(row["builds"][levels.TOP]["ms"], row["detgrid_ms"])
            for level in gpucheck.OTHER_BUILDS:
                self.assertGreater(row["builds"][level]["ms"], 0)
                self.assertTrue(row["builds"][level]["equals_default"], (row["name"], level))
        grid_only = result["rows"][2]
        self.assertIsNone(grid_only["rel_err_grad_input"])
        self.assertEqual(grid_only["builds"], {})  # the grid gradient alone: no build runs
        self.assertEqual(gpucheck_report.timing_checks(result)[0]["result"], "pass")

    def test_timing_covers_every_benchmark_row_the_gpu_checks_first(self):
        self.assertEqual(sorted(gpucheck.TIMING_WORKLOADS), sorted(workloads.BENCH_WORKLOADS))
        self.assertEqual(gpucheck.TIMING_WORKLOADS[:len(workloads.WORKLOADS)],
                         tuple(workloads.WORKLOADS))

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

    def test_host_run_records_the_required_steps_results(self):
        # The required steps that run on the host, the others left out: their
        # checks pass, and the verdict is INCOMPLETE only for the steps not
        # selected and the claims a host run cannot make.
        required = ("kernels", "bitwise", "routes")
        with tempfile.TemporaryDirectory() as out:
            proc = run_script({
                "OUT": out,
                "DETGRID_GPU_CHECK_DEVICE": "cpu",
                "DETGRID_GPU_CHECK_SCALE": "0.005",
                "DETGRID_GPU_CHECK_REPS": "2",
                "DETGRID_GPU_CHECK_STEPS": ",".join(required),
            }, timeout=300)
            data = strict_json(os.path.join(out, "gpu_check.json"))
            with open(os.path.join(out, "gpu_check.log")) as f:
                log = f.read()
        steps = {s["name"]: s for s in data["steps"]}
        self.assertEqual({k: steps[k]["status"] for k in required}, dict.fromkeys(required, "ok"),
                         proc.stdout)
        self.assertEqual(steps["build"]["note"], "not selected")
        self.assertIn("=================== bitwise", log)
        checks = {c["check"]: c["result"] for c in data["checks"]}
        for level in BUILDS:
            self.assertEqual(checks[f"{level}: device == host build (float64, 3-D)"], "pass")
        self.assertEqual(checks["grad_grid == host grid gradient (bfloat16, 2-D)"], "pass")
        self.assertEqual(checks["repeat runs bitwise identical (3-D)"], "pass")
        self.assertEqual(checks["grid-only calls under enable(): no error"], "pass")
        self.assertEqual(checks["grid-only grad_grid == stock's (half, bfloat16)"], "pass")
        self.assertEqual(checks["cross-device"], "n/a")
        self.assertEqual(data["verdict"], "INCOMPLETE")
        self.assertEqual(data["blockers"]["FAIL"], [])
        not_selected = [f"step {name}: skipped, not selected" for name in
                        gpucheck_report.REQUIRED_STEPS if name not in required]
        self.assertEqual(data["blockers"]["INCOMPLETE"][:len(not_selected)], not_selected)
        self.assertNotEqual(proc.returncode, 0)

    def test_host_run_records_optional_timeouts(self):
        # The optional initcheck outliving what is left of the budget (a
        # stand-in compute-sanitizer that never finishes): it is stopped and
        # recorded, timing after it is skipped, the report still comes, and
        # neither blocks the verdict.
        with tempfile.TemporaryDirectory() as out, stand_in_sanitizer("exec sleep 600\n"):
            proc = run_script({
                "OUT": out,
                "DETGRID_GPU_CHECK_DEVICE": "cpu",
                "DETGRID_GPU_CHECK_BUDGET_S": "20",
                "DETGRID_GPU_CHECK_MIN_S": "8",
                "DETGRID_GPU_CHECK_STEPS": "initcheck,timing",
            })
            data = strict_json(os.path.join(out, "gpu_check.json"))
        steps = {s["name"]: s for s in data["steps"]}
        self.assertEqual((steps["initcheck"]["status"], steps["initcheck"]["note"]),
                         ("timeout", "limit cut to the budget's rest"), proc.stdout)
        self.assertEqual((steps["timing"]["status"], steps["timing"]["note"]),
                         ("skipped", "out of budget"))
        self.assertIn("initcheck: timeout", proc.stdout)
        checks = {c["check"]: c["result"] for c in data["checks"]}
        self.assertEqual((checks["compute-sanitizer initcheck"], checks["timing table"]),
                         ("n/a", "n/a"))
        self.assertEqual((data["verdict"], data["blockers"]["FAIL"]), ("INCOMPLETE", []))
        self.assertEqual(data["optional_findings"], [])
        self.assertFalse([b for b in data["blockers"]["INCOMPLETE"]
                          if "initcheck" in b or "timing" in b])

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
