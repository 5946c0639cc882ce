# Owner(s): ["module: nn"]
"""Tests of repro/: each script run as a user runs it (a subprocess of this
python), its JSON schema and its exit code, with and without detgrid
importable. The seeds' recipe they use is detgrid's (tests/test_seeding.py).

Without a GPU the scripts must say that the claims about the GPU kernel are
not checkable here and exit 77 when nothing at all could be checked; they
must never report such a claim as passed. Names here avoid the word the
device run selects tests by.
"""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPRO = os.path.join(ROOT, "repro")
sys.path.insert(0, REPRO)
import common  # noqa: E402
import seeding  # noqa: E402

HAS_GPU = torch.cuda.is_available()
RUNS = 3
HIDE_DETGRID = "raise ImportError('detgrid hidden by the test')\n"
# A detgrid whose enable() routes the 2-D backward only, as if the 3-D override were missing:
# the real package's modules, with enable() registering aten::grid_sampler_2d_backward on CPU.
ROUTE_2D_ONLY = """import torch
__path__ = [{real!r}]
from detgrid import ops  # noqa: E402
from detgrid.switch import disable, enabled, is_enabled  # noqa: E402,F401
_lib = torch.library.Library("aten", "IMPL")


def enable(devices=None):
    _lib.impl("grid_sampler_2d_backward", ops.grid_sampler_2d_backward, "CPU")
"""


def run_script(name, *args, hide_detgrid=False, detgrid_init=None):
    """(exit code, parsed JSON) of `python repro/<name> --json args...`; detgrid_init is the
    source of a shim `detgrid/__init__.py` put ahead of the real one (hide_detgrid: one that
    fails to import)."""
    env = dict(os.environ)
    paths = [os.path.join(ROOT, "tools")]
    detgrid_init = HIDE_DETGRID if hide_detgrid else detgrid_init
    with tempfile.TemporaryDirectory() as shim:
        if detgrid_init is not None:
            os.mkdir(os.path.join(shim, "detgrid"))
            with open(os.path.join(shim, "detgrid", "__init__.py"), "w") as f:
                f.write(detgrid_init)
            paths = [shim]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        proc = subprocess.run([sys.executable, os.path.join(REPRO, name), "--json", *args],
                              env=env, capture_output=True, text=True, timeout=120)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"{name}: no JSON on stdout\n{proc.stdout}\n{proc.stderr}") from None
    return proc.returncode, data


def stock_cpu_hash(dims):
    """SHA-256 of stock's CPU grad_input for the repro case (deterministic algorithms off, so
    nothing is routed even if some test left detgrid enabled)."""
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(False)
    try:
        return seeding.sha256(common.grad_input(*common.make_case("cpu", dims)))
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


def max_collisions(grid, size):
    """The most sample points of batch 0 whose (bi/tri)linear corners include one input cell."""
    dims = grid.shape[-1]
    low = (((grid[0].reshape(-1, dims) + 1) * size - 1) / 2).floor().long()  # align_corners=False
    counts = torch.zeros(size ** dims, dtype=torch.long)
    for offset in itertools.product((0, 1), repeat=dims):
        corner = low + torch.tensor(offset)
        inside = ((corner >= 0) & (corner < size)).all(1)
        flat = sum(corner[:, k] * size ** k for k in range(dims))  # x fastest; any order counts
        counts.index_add_(0, flat[inside], torch.ones_like(flat[inside]))
    return counts.max().item()


class TestReproScripts(TestCase):
    def check_schema(self, data, script, code):
        for key in ("script", "torch", "cuda_available", "device", "claims", "exit_code"):
            self.assertIn(key, data)
        self.assertEqual(data["script"], script)
        self.assertEqual(data["exit_code"], code)
        for c in data["claims"]:
            self.assertEqual(set(c), {"claim", "status", "detail"})
            self.assertIn(c["status"], (common.PASS, common.FAIL, common.NOT_CHECKABLE))
        self.assertEqual(code, common.exit_code(data["claims"]))

    def test_show_error_captures_the_alert_or_says_it_is_not_checkable(self):
        code, data = run_script("show_error.py")
        self.check_schema(data, "show_error", code)
        self.assertEqual((data["dims"], data["alert"]), (2, common.ALERT))
        if HAS_GPU:
            self.assertEqual(code, 0)
            self.assertIn(common.ALERT, data["error_message"])
            self.assertTrue(any(common.ALERT in w for w in data["warning_messages"]))
        else:
            self.assertEqual(code, common.EXIT_NOT_CHECKABLE)
            self.assertIsNone(data["error_message"])
            self.assertEqual(data["warning_messages"], [])
            self.assertTrue(all(c["status"] == common.NOT_CHECKABLE for c in data["claims"]))
            self.assertIn("no CUDA", data["claims"][0]["detail"])
            self.assertIsNone(data["cpu_observation"]["error_message"])

    def test_show_nondeterminism_hashes_every_run_and_checks_what_it_can(self):
        code, data = run_script("show_nondeterminism.py", "--runs", str(RUNS))
        self.check_schema(data, "show_nondeterminism", code)
        self.assertEqual(code, 0)
        for path in ("stock", "deterministic"):
            self.assertEqual(len(data[path]["hashes"]), RUNS)
            self.assertTrue(all(len(h) == 64 for h in data[path]["hashes"]))
        self.assertEqual(data["deterministic"]["distinct"], 1)
        self.assertLessEqual(data["max_abs_diff"], 1e-3)
        stock_claim = data["claims"][0]
        self.assertEqual(stock_claim["status"], common.PASS if HAS_GPU else common.NOT_CHECKABLE)
        if not HAS_GPU:
            self.assertEqual(data["deterministic_path"], "detgrid CPU host build (detgrid.ops)")

    def test_show_fix_routes_the_backward_to_detgrid_with_one_hash(self):
        code, data = run_script("show_fix.py", "--runs", str(RUNS))
        self.check_schema(data, "show_fix", code)
        self.assertEqual(code, 0)
        self.assertIsNone(data["error_message"])
        self.assertEqual(data["warning_messages"], [])
        self.assertEqual(data["distinct"], 1)
        if not HAS_GPU:
            self.assertEqual(data["fix"], "detgrid.enable('cpu')")
            self.assertEqual(data["detgrid_ops_hash"], data["hashes"][0])

    def test_without_detgrid_on_cpu_nothing_is_checkable_and_exit_is_77(self):
        if HAS_GPU:
            self.skipTest("on a GPU machine the stock claims are checkable")
        for script, dims in itertools.product(("show_nondeterminism.py", "show_fix.py"), "23"):
            code, data = run_script(script, "--runs", "2", "--dims", dims, hide_detgrid=True)
            self.check_schema(data, script[:-3], code)
            self.assertEqual(code, common.EXIT_NOT_CHECKABLE)
            self.assertEqual(data["dims"], int(dims))
            self.assertTrue(all(c["status"] == common.NOT_CHECKABLE for c in data["claims"]))

    def test_dims_3_case_is_a_5d_high_collision_zoom_in(self):
        x, grid, grad_out = common.make_case("cpu", 3)
        self.assertEqual((x.shape, grid.shape, grad_out.shape),
                         ((2, 4, 8, 8, 8), (2, 16, 16, 16, 3), (2, 4, 16, 16, 16)))
        self.assertEqual(common.make_case("cpu")[0].shape, (2, 8, 32, 32))
        self.assertEqual((common.points_per_cell(), common.points_per_cell(3)), (256, 512))
        for dims, size in ((2, 32), (3, 8)):
            self.assertGreaterEqual(max_collisions(common.make_case("cpu", dims)[1], size),
                                    common.points_per_cell(dims))
        self.assertEqual(common.ALERT, common.ALERTS[2])
        self.assertEqual(common.ALERTS[3], "grid_sampler_3d_backward_cuda does not have a "
                                           "deterministic implementation")

    def test_show_error_dims_3_looks_for_the_3d_alert(self):
        code, data = run_script("show_error.py", "--dims", "3")
        self.check_schema(data, "show_error", code)
        self.assertEqual((data["dims"], data["alert"]), (3, common.ALERTS[3]))
        for c in data["claims"]:
            self.assertIn("grid_sampler_3d_backward_cuda", c["claim"])
            self.assertNotIn("grid_sampler_2d", c["claim"])
        if HAS_GPU:
            self.assertEqual(code, 0)
            self.assertIn(common.ALERTS[3], data["error_message"])
            self.assertTrue(any(common.ALERTS[3] in w for w in data["warning_messages"]))
        else:
            self.assertEqual(code, common.EXIT_NOT_CHECKABLE)
            self.assertIsNone(data["error_message"])
            self.assertTrue(all(c["status"] == common.NOT_CHECKABLE for c in data["claims"]))
            self.assertIsNone(data["cpu_observation"]["error_message"])

    def test_show_nondeterminism_dims_3_runs_the_3d_backward(self):
        code, data = run_script("show_nondeterminism.py", "--dims", "3", "--runs", str(RUNS))
        self.check_schema(data, "show_nondeterminism", code)
        self.assertEqual(code, 0)
        self.assertEqual((data["dims"], data["points_per_cell"]), (3, 512))
        self.assertEqual(data["deterministic"]["distinct"], 1)
        self.assertLessEqual(data["max_abs_diff"], 1e-3)
        if not HAS_GPU:
            self.assertEqual(data["deterministic_path"], "detgrid CPU host build (detgrid.ops)")
            self.assertEqual(data["claims"][0]["status"], common.NOT_CHECKABLE)
            # the core's summation order is not stock's: other bits, so not stock rerun
            self.assertEqual(data["stock"]["hashes"][0], stock_cpu_hash(3))
            self.assertNotEqual(data["deterministic"]["hashes"][0], data["stock"]["hashes"][0])

    def test_show_fix_dims_3_routes_the_3d_backward_to_detgrid(self):
        code, data = run_script("show_fix.py", "--dims", "3", "--runs", str(RUNS))
        self.check_schema(data, "show_fix", code)
        self.assertEqual(code, 0)
        self.assertEqual(data["dims"], 3)
        self.assertIsNone(data["error_message"])
        self.assertEqual(data["warning_messages"], [])
        self.assertEqual(data["distinct"], 1)
        if not HAS_GPU:
            self.assertEqual(data["fix"], "detgrid.enable('cpu')")
            routed = [c for c in data["claims"] if "ran detgrid's host build" in c["claim"]]
            self.assertEqual([c["status"] for c in routed], [common.PASS])
            self.assertEqual(data["detgrid_ops_hash"], data["hashes"][0])
            # stock's CPU backward gives other bits: unrouted, the claim above would fail
            self.assertNotEqual(stock_cpu_hash(3), data["hashes"][0])

    def test_show_fix_fails_when_the_3d_backward_is_not_routed(self):
        if HAS_GPU:
            self.skipTest("the shim routes the CPU backward only")
        spec = importlib.util.find_spec("detgrid")
        if spec is None:
            self.skipTest("detgrid not installed")
        shim = ROUTE_2D_ONLY.format(real=spec.submodule_search_locations[0])
        for dims, expected in (("2", common.PASS), ("3", common.FAIL)):
            code, data = run_script("show_fix.py", "--dims", dims, "--runs", "2", detgrid_init=shim)
            self.check_schema(data, "show_fix", code)
            statuses = {c["claim"]: c["status"] for c in data["claims"]}
            routed = statuses.pop("the CPU backward ran detgrid's host build (same hash as detgrid.ops)")
            self.assertEqual((routed, code), (expected, 0 if expected == common.PASS else 1), dims)
            self.assertNotIn(common.FAIL, statuses.values())

    def test_exit_code_is_nonzero_exactly_when_a_claim_fails(self):
        ok, bad, na = (common.claim("x", s) for s in (common.PASS, common.FAIL, common.NOT_CHECKABLE))
        self.assertEqual(common.exit_code([ok, na]), 0)
        self.assertEqual(common.exit_code([ok, bad, na]), 1)
        self.assertEqual(common.exit_code([na, na]), 77)

    def test_scripts_stay_under_100_lines(self):
        for name in os.listdir(REPRO):
            if name.endswith(".py"):
                with open(os.path.join(REPRO, name)) as f:
                    self.assertLess(len(f.readlines()), 100, name)


if __name__ == "__main__":
    run_tests()
