# Owner(s): ["module: nn"]
"""The tests the patch adds to upstream's test/test_nn.py (tools/detgrid/kit/upstream_test_nn.py),
run against the extension.

On CPU they run through the extension's default backward there, the upstream core's host
build (which compiles the patch's CUDA source) and the grid gradient's, so they run against
every build of the extension (CI's cuda_build_check.sh too); on a GPU the same tests run
through the core's CUDA build (tools/gpu_check.sh), the grid-only one excepted (names()
says why). The gradgradcheck runs on its own, skipped where torch has no double backward
(before 2.12); so do the non-finite grid test, against the core as the patched build
arranges it (made_as_patched says how), and the 5-D bicubic one. The dispatch test's
profile of the CUDA kernels has a stand-in on CPU (generated() says why)."""

import contextlib
import importlib
import inspect
import os
import re
import subprocess
import tempfile
import unittest
from itertools import product
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import DeterministicGuard, TestCase, run_tests

import detgrid
import detgrid_testing
from detgrid.kit import patch as P
from detgrid_testing import skip_unless_stock_has_double_backward
from test_patch import linter

SUITE = P.upstream_nn_tests()
ROOT = Path(__file__).resolve().parents[1]
# the upstream core, whose kernels the dispatch test looks for in the profile
CORE_SOURCE = ROOT / "aten_kernels" / "aten" / "src" / "ATen" / "native" / "cuda" / "GridSamplerDeterministic.cu"
NON_FINITE = "test_grid_sample_backward_deterministic_non_finite_grid"
TRICUBIC = "test_grid_sample_backward_deterministic_5d_bicubic"
DISPATCH = "test_grid_sample_backward_deterministic_dispatch"
# the dispatch test's profile of the patched build's kernels
KERNELS_HELPER = "_check_grid_sample_backward_kernels"


def core_grad_input():
    """The upstream core's grad_input op (aten_kernels/aten/): a function, so that a test can
    stand a broken core in for it."""
    return torch.ops.detgrid._core_grad_input


def stock_has_tricubic():
    try:
        F.grid_sample(torch.zeros(1, 1, 2, 2, 2), torch.zeros(1, 1, 1, 1, 3), mode="bicubic",
                      align_corners=False)
    except RuntimeError:
        return False
    return True


def _recording_dtypes(*dtypes):
    """@dtypes for the generated tests run here: the test keeps its dtypes for the CUDA run."""
    def record(f):
        f.dtypes = dtypes
        return f
    return record


class TestGeneratedNNTests(TestCase):
    """The tests the patch adds to test/test_nn.py, run here on CPU (@onlyCUDA stubbed out) with
    detgrid routing the CPU backward in deterministic mode: their shapes, modes and helpers must
    work, and their claims hold for the core's host build, which compiles the patch's CUDA
    source. (The upstream tests stay @onlyCUDA: the patch carries no CPU-run test.)"""

    def generated(self, name, device):
        ns = dict(torch=torch, F=F, product=product, DeterministicGuard=DeterministicGuard,
                  unittest=unittest, TEST_CUDNN=False, TEST_WITH_ROCM=False, TestCase=TestCase,
                  onlyCUDA=lambda f: f, dtypes=_recording_dtypes,
                  largeTensorTest=lambda *_, **__: (lambda f: f))
        exec("class Generated(TestCase):\n" + SUITE.block(list(SUITE.tests)), ns)
        instance = ns["Generated"](name)
        if device != "cpu":
            return getattr(instance, name)
        # The profile looks for the core's CUDA kernels, which a CPU run never launches (the
        # host build runs their code as host functions): the stand-in makes the profiled calls
        # and records them; test_dispatch_test_profiles_the_cores_kernels checks the names
        # against the core. On a GPU the extension launches the core's kernels under their
        # own names, and the helper profiles them.
        instance.profiled = []

        def profile_stand_in(dims, grads, masks):
            for deterministic, mask in product((False, True), masks):
                with DeterministicGuard(deterministic):
                    grads(mask)
                instance.profiled.append((dims, deterministic, mask))

        setattr(instance, KERNELS_HELPER, profile_stand_in)
        return getattr(instance, name)

    # CUDA-only: cuDNN, streams and graphs; and 8.6 GB tensors
    CUDA_ONLY = ("test_grid_sample_2d_backward_deterministic_cudnn",
                 "test_grid_sample_backward_deterministic_side_stream_and_graph",
                 "test_grid_sample_backward_deterministic_large_index")

    def names(self, device, double_backward):
        """The generated tests to run on `device`: those that differentiate the backward
        (gradgradcheck) or those that do not, so that the former can be skipped on their own
        where torch has no double backward."""
        # In-tree only on CUDA (the file's in_tree_only_on_cuda: the grid-only test): its claim,
        # the default backward's float32 bits for a grid-only call, holds in the patched build,
        # where stock's kernel makes both sides. Through the extension the deterministic side is
        # detgrid's grid-gradient pass, and stock's float32 build may fuse a multiply and add,
        # which README gives as "about an ulp" per term: no bound a tolerance could take once the
        # sums over channels and taps carry it. So skipping is cleaner than loosening the
        # generated test's atol=0 from outside; test_switch.py tests the extension's grid-only
        # route instead (no alert, warn-only included; detgrid's grid_gradient bit for bit;
        # stock's bits in half and bfloat16). On CPU both sides are stock's kernel: it runs.
        left_out = (self.CUDA_ONLY if device == "cpu"
                    else [t.name for t in SUITE.tests if t.in_tree_only_on_cuda])
        # Run on their own, below: the non-finite grid test against the core as the patched
        # build arranges it (its default side the existing kernel's function, which stock's CPU
        # kernel does not give: it crashes on NaN with border padding), the 5-D bicubic one
        # where its skip shows (it compares with stock's 5-D bicubic, torch 2.15 on).
        left_out = [*left_out, NON_FINITE, TRICUBIC]
        return [t.name for t in SUITE.tests
                if t.needs_double_backward == double_backward and t.name not in left_out]

    def run_generated(self, names, device):
        # the tests' claims are about the deterministic backward: on CPU the core's host build
        # (detgrid.enable("cpu")), against stock's CPU backward where a test compares with the
        # default one; on CUDA the extension's build of the same ATen sources
        # (detgrid.enable("cuda") in place of the patched dispatch), each test with its own
        # dtypes
        for name in names:
            test = self.generated(name, device)
            for dtype in self.dtypes(test, device):
                with self.subTest(name=name, dtype=dtype), detgrid.enabled(device):
                    test(device, *([dtype] if dtype else []))

    @staticmethod
    def dtypes(test, device):
        if device == "cuda":
            return getattr(test.__func__, "dtypes", (None,))
        return (torch.float, torch.double) if "dtype" in test.__code__.co_varnames else (None,)

    def run_double_backward(self, device):
        # the generated gradgradcheck is 2-D; before torch 2.12 stock cannot differentiate
        # grid_sampler_2d_backward, a limit of torch, not of detgrid (the patch adds the test
        # only to a checkout that can)
        skip_unless_stock_has_double_backward(2)
        names = self.names(device, double_backward=True)
        self.assertEqual(names, ["test_grid_sample_backward_deterministic_gradgradcheck"])
        self.run_generated(names, device)

    def test_generated_tests_run_on_cpu(self):
        names = self.names("cpu", double_backward=False)
        self.assertEqual(len(names), 13)
        self.run_generated(names, "cpu")

    def test_generated_double_backward_tests_run_on_cpu(self):
        self.run_double_backward("cpu")

    @unittest.skipUnless(torch.cuda.is_available() and detgrid.ops.has_cuda_kernels(),
                         "needs a GPU and detgrid's CUDA kernels")
    def test_generated_tests_run_on_cuda(self):
        # what the GPU check (tools/gpu_check.sh, pytest -k cuda) runs of the upstream tests
        names = self.names("cuda", double_backward=False)
        self.assertEqual(len(names), 15)
        self.run_generated(names, "cuda")

    @unittest.skipUnless(torch.cuda.is_available() and detgrid.ops.has_cuda_kernels(),
                         "needs a GPU and detgrid's CUDA kernels")
    def test_generated_double_backward_tests_run_on_cuda(self):
        self.run_double_backward("cuda")

    @contextlib.contextmanager
    def made_as_patched(self):
        """aten's grid_sampler_{2,3}d_backward made as the patched build makes them: in
        deterministic mode grad_input is the upstream core's (its host build on CPU, its CUDA
        build on a GPU), by default the existing CUDA kernel's, on CPU its serial host reference
        (stock's CPU kernel is no reference on NaN grids: it crashes with border padding).
        grad_grid is the existing CUDA kernel's both ways on a GPU; on CPU nothing gives it, so
        both sides give zeros and only grad_input is checked there."""
        core = core_grad_input()
        stock = {dims: getattr(torch.ops.aten, f"grid_sampler_{dims}d_backward") for dims in (2, 3)}

        def stand_in(dims):
            def backward(grad_output, input, grid, mode, padding_mode, align_corners, output_mask):
                args = (grad_output, input, grid, mode, padding_mode, align_corners)
                deterministic = torch.are_deterministic_algorithms_enabled()
                with DeterministicGuard(False):  # stock alerts on a grid-only call too
                    if input.is_cuda:
                        grad_input, grad_grid = stock[dims](*args, [not deterministic, True])
                    else:
                        grad_input = torch.ops.detgrid._existing_kernel_reference(*args)
                        grad_grid = torch.zeros_like(grid)
                return (core(*args) if deterministic else grad_input), grad_grid
            return backward

        with mock.patch.object(torch.ops.aten, "grid_sampler_2d_backward", stand_in(2)), \
                mock.patch.object(torch.ops.aten, "grid_sampler_3d_backward", stand_in(3)):
            yield

    def run_against_the_core(self, name, device):
        test = self.generated(name, device)
        with self.made_as_patched():
            for dtype in self.dtypes(test, device):
                with self.subTest(name=name, dtype=dtype):
                    test(device, dtype)

    @unittest.skipIf(os.environ.get("DETGRID_SANITIZERS") == "1",
                     "NaN coordinates convert to int (undefined on the host with g++)")
    def test_generated_non_finite_grid_test_holds_for_the_core_on_cpu(self):
        self.run_against_the_core(NON_FINITE, "cpu")

    @unittest.skipUnless(torch.cuda.is_available() and detgrid.ops.has_cuda_kernels(),
                         "needs a GPU and detgrid's CUDA kernels")
    def test_generated_non_finite_grid_test_holds_for_the_core_on_cuda(self):
        self.run_against_the_core(NON_FINITE, "cuda")

    def test_the_non_finite_grid_test_can_fail(self):
        # a core that loses a NaN term, or one off by a tap's worth, fails it
        for harm in (lambda g: torch.nan_to_num(g, nan=0.0), lambda g: g + 1):
            def broken(*args, harm=harm):
                return harm(torch.ops.detgrid._existing_kernel_reference(*args))

            with mock.patch(f"{__name__}.core_grad_input", return_value=broken), self.made_as_patched():
                with self.assertRaises(AssertionError):
                    self.generated(NON_FINITE, "cpu")("cpu", torch.double)

    def test_generated_5d_bicubic_test_skips_where_torch_has_no_tricubic(self):
        # the core samples 5-D input bicubically; the generated test compares it with the
        # default backward, which torch has only where it samples 5-D input so
        grad_output, input, grid = torch.randn(1, 1, 2, 2, 2, dtype=torch.double), \
            torch.randn(1, 1, 3, 3, 3, dtype=torch.double), \
            torch.rand(1, 2, 2, 2, 3, dtype=torch.double) * 2 - 1
        self.assertEqual(core_grad_input()(grad_output, input, grid, 2, 0, False).shape,
                         input.shape)
        if stock_has_tricubic():
            self.skipTest("torch samples 5-D input bicubically: the test runs on the GPU")
        with self.assertRaisesRegex(unittest.SkipTest, "no bicubic interpolation of 5-D input"):
            self.generated(TRICUBIC, "cpu")("cpu", torch.double)

    def test_dispatch_test_profiles_the_cores_kernels(self):
        # the kernels the profile looks for are the core's, and the generated dispatch test
        # profiles every mask both ways in 2-D and 3-D (here with the stand-in, which runs them)
        helper = SUITE.helpers[KERNELS_HELPER].source
        kernels = re.findall(r"'(?:grid_sampler_\{dims\}d_records_kernel|\w+_kernel)'", helper)
        self.assertEqual(len(kernels), 2, helper)
        core = CORE_SOURCE.read_text()
        for dims in (2, 3):
            for kernel in kernels:
                kernel = kernel.strip("'").replace("{dims}", str(dims))
                self.assertRegex(core, rf"__global__ void {kernel}\(")
        self.assertIn(KERNELS_HELPER, SUITE.needs([t for t in SUITE.tests if t.name == DISPATCH]))
        test = self.generated(DISPATCH, "cpu")
        with detgrid.enabled("cpu"):
            test("cpu")
        masks = ((True, True), (True, False), (False, True))
        self.assertEqual(sorted(test.__self__.profiled),
                         sorted(product((2, 3), (False, True), masks)))

    def test_double_backward_tests_follow_the_probe(self):
        # faked answers of the probe: skipped where torch has no double backward, run (here
        # with a stand-in for the generated test, so this holds on any torch) where it has one
        ran = []

        def stand_in(name, device):
            return lambda device, *args: ran.append((name, device))

        with mock.patch.object(self, "generated", side_effect=stand_in):
            with mock.patch.object(detgrid_testing, "stock_has_double_backward", return_value=False):
                with self.assertRaisesRegex(unittest.SkipTest, "no double backward"):
                    self.test_generated_double_backward_tests_run_on_cpu()
                self.assertEqual(ran, [])
            with mock.patch.object(detgrid_testing, "stock_has_double_backward", return_value=True):
                self.test_generated_double_backward_tests_run_on_cpu()
        self.assertEqual(ran, [("test_grid_sample_backward_deterministic_gradgradcheck", "cpu")])

    def test_grid_only_test_runs_in_tree_only_on_cuda(self):
        name = "test_grid_sample_backward_deterministic_grid_only"
        self.assertIn(name, self.names("cpu", double_backward=False))
        self.assertNotIn(name, self.names("cuda", double_backward=False))

    def test_generated_tests_can_fail(self):
        # a backward that differs from run to run must fail the reproducibility check
        calls = []

        def noisy(self, input, grid, grad_output, **kwargs):
            calls.append(1)
            return torch.full_like(input, len(calls)), torch.zeros_like(grid)

        test = self.generated("test_grid_sample_3d_backward_deterministic", "cpu")
        test.__self__._grid_sample_grads = noisy.__get__(test.__self__)
        with self.assertRaises(AssertionError):
            test("cpu", torch.float)

    def test_added_tests_reach_every_path_of_the_kernel(self):
        # what each path needs, found in the generated source (the GPU check runs them)
        source = {t.name: t.source for t in SUITE.tests}
        sparse = source["test_grid_sample_backward_deterministic_sparse_reduction"]
        self.assertIn("torch.randn(1, 3, 300, 200", sparse)  # 60,000 pixels, 30 points
        chunks = source["test_grid_sample_backward_deterministic_several_chunks"]
        self.assertIn("@dtypes(torch.half, torch.bfloat16", chunks)
        # > 1.5M and > 143K points, and the test says they span chunks, from the core's constant
        self.assertIn("('bilinear', 1300, 4), ('bicubic', 450, 16)", chunks)
        self.assertIn("kMaxChunkRecords = 2^19", chunks)
        self.assertIn("self.assertGreater(size * size * taps, 2 * max_chunk_records)", chunks)
        self.assertIn("constexpr int64_t kMaxChunkRecords = int64_t{1} << 19;", CORE_SOURCE.read_text())
        hot = source["test_grid_sample_backward_deterministic_hot_run_across_chunks"]
        self.assertIn("torch.full((1, 768, 768, 2), 0.1", hot)  # 589,824 > 2^19 records per pixel
        self.assertIn("self.assertGreater(768 * 768, max_chunk_records)", hot)
        channels = source["test_grid_sample_backward_deterministic_many_channels"]
        self.assertIn("for channels in (15, 16, 40)", channels)
        self.assertIn("memory_format=torch.channels_last", channels)
        large = source["test_grid_sample_backward_deterministic_large_index"]
        self.assertIn("32769, 65536", large)  # 2^31 + 2^16 elements: 64-bit keys and indices
        self.assertIn(".expand(", source["test_grid_sample_backward_deterministic_expanded_and_strided"])
        graph = source["test_grid_sample_backward_deterministic_side_stream_and_graph"]
        for needed in ("torch.cuda.Stream()", "torch.cuda.graph(graph)", "graph.replay()"):
            self.assertIn(needed, graph)
        for name, check in (("gradcheck", "torch.autograd.gradcheck("),
                            ("gradgradcheck", "torch.autograd.gradgradcheck(")):
            grads = source[f"test_grid_sample_backward_deterministic_{name}"]
            self.assertIn(check, grads)
            self.assertIn("dtype=torch.double", grads)
        # the dispatch is checked by behaviour, and by the kernel names in the profile (one
        # helper, which the kit stands in for: test_dispatch_test_profiles_the_cores_kernels)
        dispatch = source[DISPATCH]
        for needed in ("warn_only", "(True, False)", "(False, True)", "assertNotWarn(", KERNELS_HELPER):
            self.assertIn(needed, dispatch)
        for t in SUITE.tests:
            self.assertNotIn("profile", t.source, t.name)
        self.assertIn("torch.profiler.profile(", SUITE.helpers[KERNELS_HELPER].source)
        # NaN and +-Inf in 2-D, NaN alone in 3-D (#24823), against the default op
        non_finite = source[NON_FINITE]
        for needed in ("float('nan')", "float('inf')", "-float('inf')", "#24823",
                       "if dims == 2 else (float('nan'),)", "DeterministicGuard(True)"):
            self.assertIn(needed, non_finite)
        self.assertIn("raise unittest.SkipTest(", source[TRICUBIC])
        input_only = source["test_grid_sample_backward_deterministic_input_only"]
        self.assertIn("[True, False]", input_only)
        self.assertIn("self.assertIsNone(actual_autograd[1]", input_only)
        grid_only = source["test_grid_sample_backward_deterministic_grid_only"]
        self.assertIn("assertNotWarn(", grid_only)
        self.assertIn("self.assertEqual(actual, expected, atol=0, rtol=0)", grid_only)
        self.assertLess(grid_only.index("expected = grad_grid()"), grid_only.index("DeterministicGuard"))
        for dims in (2, 3):  # half and bfloat16 against the float64 oracle too
            self.assertIn("@dtypes(torch.half, torch.bfloat16, torch.float, torch.double)",
                          source[f"test_grid_sample_{dims}d_backward_deterministic_matches_default"])
        self.assertIn("@largeTensorTest('18GB', device='cuda')", large)
        self.assertNotIn("skipTest", source["test_grid_sample_backward_deterministic_gradgradcheck"])
        # with the cuDNN patch a direct cudnn_grid_sampler backward alerts in deterministic mode
        self.assertNotIn("torch.cudnn_grid_sampler(",
                         source["test_grid_sample_2d_backward_deterministic_cudnn"])
        for t in SUITE.tests:
            self.assertTrue(t.source.startswith("    @onlyCUDA\n"), t.name)

    def lint_the_file(self, name, *args):
        # the file itself, as it is: the patch inserts its methods byte for byte (upstream's line
        # length, 120; tests/test_patch.py lints the patched test_nn.py with the checkout's own
        # configuration)
        cmd = linter(name)
        if cmd is None:
            raise unittest.SkipTest(f"{name} is not installed")
        r = subprocess.run([*cmd, *args, str(P.NN_TESTS_FILE)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_the_file_passes_flake8(self):
        self.lint_the_file("flake8", "--max-line-length=120")

    def test_the_file_passes_ruff(self):
        self.lint_the_file("ruff", "check", "--isolated", "--no-cache", "--line-length=120", "--select=E,F,W")

    def test_the_file_is_code_the_kit_reads_as_python_does(self):
        # importable (with torch, decorators applied), and the kit's reading of it finds the
        # methods Python finds in its class
        cls = importlib.import_module("detgrid.kit.upstream_test_nn").TestNNDeviceType
        methods = [name for name, v in vars(cls).items() if inspect.isfunction(v)]
        self.assertEqual(methods, [*SUITE.helpers, *SUITE.names])

    def test_a_test_brings_only_the_helpers_and_imports_it_uses(self):
        by_name = {t.name: t for t in SUITE.tests}
        grid_only = [by_name["test_grid_sample_backward_deterministic_grid_only"]]
        self.assertNotIn("    def _", SUITE.block(grid_only))
        matches = [by_name["test_grid_sample_2d_backward_deterministic_matches_default"]]
        helpers = ["_grid_sample_grads", "_check_grid_sample_backward_matches_default"]  # calls the first
        self.assertEqual(re.findall(r"^    def (_\w+)", SUITE.block(matches), re.M), helpers)
        self.assertNotIn("    def _grid_sample_grads(", SUITE.block(matches, frozenset(helpers[:1])))
        self.assertEqual(sorted(n for n in SUITE.needs(matches) if n in SUITE.imports),
                         ["DeterministicGuard", "F", "dtypes", "onlyCUDA", "product", "torch"])

    def load(self, table):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "tests.py"
            path.write_text("class TestNNDeviceType:\n    def test_a(self, device):\n        pass\n\n\n"
                            f"ADDED = {table!r}\n")
            return P.load_nn_tests(path)

    def test_every_test_has_its_row_and_every_row_its_test(self):
        row = {"checks": "a", "covered_if": None}
        self.assertEqual(self.load({"test_a": row}).names, ("test_a",))
        with self.assertRaisesRegex(P.NotUsable, "test_a has no row in ADDED"):
            self.load({})
        with self.assertRaisesRegex(P.NotUsable, "ADDED has rows for no test: test_b"):
            self.load({"test_a": row, "test_b": row})

    def test_every_test_says_what_upstream_test_would_cover_it(self):
        # each added test is skipped where an upstream test checks the same; on a tree without
        # deterministic tests none is
        for t in SUITE.tests:
            self.assertFalse(t.covered(""), t.name)
            self.assertTrue(t.checks)


if __name__ == "__main__":
    run_tests()
