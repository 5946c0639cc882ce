# Owner(s): ["module: nn"]
"""detgrid.enable()/disable()/enabled(): while enabled on a device,
grid_sample's backward there (aten::grid_sampler_2d_backward for 4-D input,
aten::grid_sampler_3d_backward for 5-D) runs detgrid under deterministic mode
and stock otherwise. Subtests with a "3d" suffix sample a volume.

The CPU switch (devices=("cpu",)) exists so that all of this can be tested
without a GPU: detgrid's bits differ from stock CPU's on the inputs used
here (asserted), so the tests can tell which backward ran. The CUDA tests
need a GPU and detgrid's CUDA kernels."""

import unittest
import warnings
from unittest import mock

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import (
    DeterministicGuard,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import detgrid
import detgrid_testing
from detgrid import ops
from detgrid_testing import (
    BICUBIC,
    BILINEAR,
    HAS_DETGRID_CUDA,
    MODE_NAMES,
    SAMPLERS,
    STOCK_HAS_TRICUBIC,
    ZEROS,
    DetgridTestCase,
    assert_bitwise_equal,
    depth_sizes,
    detgrid_backward,
    make_problem,
    make_zoom_problem,
    same_bits,
    sampler_name,
    skip_unless_stock_has_double_backward,
    skip_unless_stock_samples,
    stock_backward,
)

# Spatial dims of the problems; in these plain (not device-generic) classes
# the subtests are named "2d" and "3d".
DIMS = (2, 3)


def _device_form_name(device):
    """A subtest name for a device argument: "cpu_0" for "cpu:0", and
    "torch_device_cpu_0" for torch.device("cpu", 0)."""
    if isinstance(device, torch.device):
        return "torch_device_" + str(device).replace(":", "_")
    return str(device).replace(":", "_")


def _grid_sample_grads(grad_output, inp, grid, mode, *, padding_mode="zeros",
                       align_corners=False, input_grad=True, grid_grad=True):
    """(input.grad, grid.grad) of F.grid_sample through autograd (skipped
    where this torch's forward has no 5-D bicubic)."""
    skip_unless_stock_samples(inp.dim() - 2, mode)
    inp = inp.detach().clone().requires_grad_(input_grad)
    grid = grid.detach().clone().requires_grad_(grid_grad)
    out = F.grid_sample(inp, grid, mode=MODE_NAMES[mode], padding_mode=padding_mode,
                        align_corners=align_corners)
    out.backward(grad_output)
    return inp.grad, grid.grad


class TestSwitchOnCPU(DetgridTestCase):
    def _problem(self, dims=2):
        # float32 and many points per pixel (voxel): stock's sequential sums
        # and the core's order of partials give different bits.
        if dims == 2:
            return make_zoom_problem(1, 2, 6, 7, 40, 40, dtype=torch.float32, seed=3)
        return make_zoom_problem(1, 2, 5, 6, 20, 20, D=4, out_D=4,
                                 dtype=torch.float32, seed=3)

    def _expected(self, args, mode, output_mask=(True, True)):
        """(detgrid's gradients, stock's gradients), whose grad_input must
        differ in its bits or the test could not tell them apart. (grad_grid
        is stock's CUDA arithmetic, which stock's CPU kernel shares in 3-D:
        its bits may coincide; tests of grid-only routes read the profiler.)"""
        ours = detgrid_backward(*args, mode, ZEROS, False, output_mask)
        stock = stock_backward(*args, mode, ZEROS, False, output_mask)
        if ours[0] is not None:
            self.assertFalse(same_bits(ours[0], stock[0]),
                             "precondition: detgrid and stock bits differ")
        return ours, stock

    def _detgrid_ran(self, dims, run):
        """Whether detgrid's profiler range shows in run()'s trace."""
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            run()
        return f"detgrid::grid_sampler_{dims}d_backward" in {e.name for e in profile.events()}

    @parametrize("dims,mode", ((2, BILINEAR), (2, BICUBIC), (3, BILINEAR)),
                 name_fn=sampler_name)
    def test_enabled_deterministic_backward_runs_detgrid(self, dims, mode):
        args = self._problem(dims)
        ours, _ = self._expected(args, mode)
        with detgrid.enabled(("cpu",)), DeterministicGuard(True):
            grads = _grid_sample_grads(*args, mode)
        assert_bitwise_equal(self, grads[0], ours[0], "input.grad")
        assert_bitwise_equal(self, grads[1], ours[1], "grid.grad")

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_backward_for_input_only_runs_detgrid(self, dims):
        # Only the input requires grad: autograd asks for grad_input alone.
        args = self._problem(dims)
        ours, _ = self._expected(args, BILINEAR, (True, False))
        with detgrid.enabled(("cpu",)), DeterministicGuard(True):
            grads = _grid_sample_grads(*args, BILINEAR, grid_grad=False)
        assert_bitwise_equal(self, grads[0], ours[0], "input.grad")
        self.assertIsNone(grads[1])

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_backward_for_grid_only_runs_stock(self, dims):
        # On CPU grad_grid alone is stock's: one writer per element and no
        # alert (backward_route; on CUDA the launcher alerts).
        args = self._problem(dims)
        _, stock = self._expected(args, BILINEAR)
        with detgrid.enabled(("cpu",)), DeterministicGuard(True):
            self.assertFalse(self._detgrid_ran(dims, lambda: _grid_sample_grads(
                *args, BILINEAR, input_grad=False)))
            grads = _grid_sample_grads(*args, BILINEAR, input_grad=False)
        self.assertIsNone(grads[0])
        assert_bitwise_equal(self, grads[1], stock[1], "grid.grad")

    def test_enabled_aten_backward_refuses_5d_bicubic_where_stock_does(self):
        # Before torch 2.15 stock rejects 5-D bicubic input; a routed aten
        # call is refused the same way, while detgrid's own operator samples
        # tricubically on every torch.
        args = make_problem(1, 2, 3, 4, 2, 2, D=3, out_D=2)

        def aten_call():
            return torch.ops.aten.grid_sampler_3d_backward(*args, BICUBIC, ZEROS, False,
                                                           [True, True])

        with detgrid.enabled(("cpu",)), DeterministicGuard(True):
            if STOCK_HAS_TRICUBIC:
                self.assertEqual(aten_call()[0].shape, args[1].shape)
            else:
                with self.assertRaisesRegex(RuntimeError, "bicubic"):
                    aten_call()
        self.assertEqual(detgrid_backward(*args, BICUBIC, ZEROS, False)[0].shape,
                         args[1].shape)

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_backward_without_determinism_runs_stock(self, dims):
        args = self._problem(dims)
        _, stock = self._expected(args, BILINEAR)
        with detgrid.enabled(("cpu",)), DeterministicGuard(False):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], stock[0], "input.grad")
        assert_bitwise_equal(self, grads[1], stock[1], "grid.grad")

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_backward_with_warn_only_determinism_runs_detgrid(self, dims):
        args = self._problem(dims)
        ours, _ = self._expected(args, BILINEAR)
        with detgrid.enabled(("cpu",)), DeterministicGuard(True, warn_only=True):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], ours[0], "input.grad")

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_disable_restores_stock_backward(self, dims):
        args = self._problem(dims)
        _, stock = self._expected(args, BILINEAR)
        detgrid.enable(("cpu",))
        detgrid.disable(("cpu",))
        self.assertFalse(detgrid.is_enabled("cpu"))
        with DeterministicGuard(True):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], stock[0], "input.grad")
        assert_bitwise_equal(self, grads[1], stock[1], "grid.grad")

    def test_disable_without_arguments_disables_every_device(self):
        detgrid.enable(("cpu",))
        detgrid.disable()
        self.assertFalse(detgrid.is_enabled("cpu"))

    def test_enable_twice_then_disable_once_restores_stock(self):
        args = self._problem()
        _, stock = self._expected(args, BILINEAR)
        detgrid.enable(("cpu",))
        detgrid.enable(("cpu",))
        detgrid.disable(("cpu",))
        with DeterministicGuard(True):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], stock[0], "input.grad")

    def test_enabled_context_restores_disabled_state(self):
        args = self._problem()
        _, stock = self._expected(args, BILINEAR)
        with detgrid.enabled(("cpu",)):
            self.assertTrue(detgrid.is_enabled("cpu"))
        self.assertFalse(detgrid.is_enabled("cpu"))
        with DeterministicGuard(True):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], stock[0], "input.grad")

    def test_enabled_context_keeps_an_already_enabled_device_enabled(self):
        args = self._problem()
        ours, _ = self._expected(args, BILINEAR)
        detgrid.enable(("cpu",))
        with detgrid.enabled(("cpu",)):
            pass
        self.assertTrue(detgrid.is_enabled("cpu"))
        with DeterministicGuard(True):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], ours[0], "input.grad")

    def test_enabled_context_restores_state_after_an_exception(self):
        with self.assertRaisesRegex(KeyError, "boom"):
            with detgrid.enabled(("cpu",)):
                raise KeyError("boom")
        self.assertFalse(detgrid.is_enabled("cpu"))

    def test_is_enabled_defaults_to_cuda(self):
        with detgrid.enabled(("cpu",)):
            self.assertTrue(detgrid.is_enabled("cpu"))
            self.assertEqual(detgrid.is_enabled(), detgrid.is_enabled("cuda"))
            self.assertFalse(detgrid.is_enabled("cuda"))

    def test_unknown_device_is_rejected(self):
        with self.assertRaisesRegex(ValueError, "^detgrid: device must be one of"):
            detgrid.enable(("mps",))
        self.assertFalse(detgrid.is_enabled("mps"))

    def test_enable_with_an_unknown_device_changes_nothing(self):
        with self.assertRaisesRegex(ValueError, "got 'bogus'"):
            detgrid.enable(("cpu", "bogus"))
        self.assertFalse(detgrid.is_enabled("cpu"))

    def test_disable_with_an_unknown_device_changes_nothing(self):
        detgrid.enable(("cpu",))
        with self.assertRaisesRegex(ValueError, "got 'bogus'"):
            detgrid.disable(("cpu", "bogus"))
        self.assertTrue(detgrid.is_enabled("cpu"))

    def test_enabled_context_with_an_unknown_device_changes_nothing(self):
        args = self._problem()
        _, stock = self._expected(args, BILINEAR)
        with self.assertRaisesRegex(ValueError, "got 'bogus'"):
            with detgrid.enabled(["cpu", "bogus"]):
                self.fail("the context must not be entered")
        self.assertFalse(detgrid.is_enabled("cpu"))
        with DeterministicGuard(True):
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], stock[0], "input.grad")

    @unittest.skipIf(ops.has_cuda_kernels(), "this build has CUDA kernels")
    def test_enable_that_fails_on_a_later_device_switches_the_earlier_back(self):
        # Pretend this CPU-only build has CUDA kernels: the extension then
        # refuses the CUDA override after the CPU one was already set.
        with mock.patch.object(ops, "has_cuda_kernels", return_value=True):
            with self.assertRaisesRegex(RuntimeError, "no CUDA kernels"):
                detgrid.enable(("cpu", "cuda"))
        self.assertFalse(detgrid.is_enabled("cpu"))
        self.assertFalse(detgrid.is_enabled("cuda"))

    def test_enable_accepts_a_single_device_string(self):
        # enable("cpu") means the device "cpu", not the devices "c", "p", "u".
        detgrid.enable("cpu")
        self.assertTrue(detgrid.is_enabled("cpu"))
        detgrid.disable("cpu")
        self.assertFalse(detgrid.is_enabled("cpu"))

    @parametrize("device", ("cpu", "cpu:0", torch.device("cpu"), torch.device("cpu", 0)),
                 name_fn=lambda d: _device_form_name(d))
    def test_enable_accepts_the_forms_torch_names_a_device_by(self, device):
        args = self._problem()
        ours, _ = self._expected(args, BILINEAR)
        with detgrid.enabled(device), DeterministicGuard(True):
            self.assertTrue(detgrid.is_enabled(device))
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], ours[0], "input.grad")
        self.assertFalse(detgrid.is_enabled("cpu"))
        detgrid.enable([device])
        detgrid.disable(device)
        self.assertFalse(detgrid.is_enabled("cpu"))

    @parametrize("device", ("mps", "cuda:x", torch.device("meta"), 0),
                 name_fn=lambda d: _device_form_name(d))
    def test_enable_names_the_accepted_forms_for_any_other_device(self, device):
        with self.assertRaises(ValueError) as ctx:
            detgrid.enable(device)
        message = str(ctx.exception)
        self.assertEqual(len(message.splitlines()), 1)
        self.assertIn('by name ("cuda", "cuda:0") or as a torch.device', message)
        self.assertTrue(message.endswith(f"got {device!r}"), message)

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_profiler_shows_that_detgrid_ran(self, dims):
        args = self._problem(dims)
        range_name = f"detgrid::grid_sampler_{dims}d_backward"

        def profiled_names(deterministic):
            with detgrid.enabled("cpu"), DeterministicGuard(deterministic):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
                        as profile:
                    _grid_sample_grads(*args, BILINEAR)
            return {event.name for event in profile.events()}

        names = profiled_names(True)
        self.assertIn(range_name, names)
        self.assertIn(f"aten::grid_sampler_{dims}d_backward", names)
        self.assertNotIn(range_name, profiled_names(False))  # stock ran

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_create_graph_backward_runs_detgrid(self, dims):
        grad_output, inp, grid = self._problem(dims)
        ours, _ = self._expected((grad_output, inp, grid), BILINEAR, (True, False))
        x = inp.clone().requires_grad_()
        with detgrid.enabled(("cpu",)), DeterministicGuard(True):
            out = F.grid_sample(x, grid, mode="bilinear", align_corners=False)
            (gx,) = torch.autograd.grad(out, x, grad_output, create_graph=True)
        self.assertIsNotNone(gx.grad_fn)
        assert_bitwise_equal(self, gx, ours[0], "input gradient")

    @parametrize("grid_requires_grad", (False, True),
                 name_fn=lambda r: "grid_grad" if r else "input_grad_only")
    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_double_backward_works_while_enabled(self, dims, grid_requires_grad):
        # StyleGAN2's R1 penalty differentiates the gradient w.r.t. the
        # sampled images once more.
        skip_unless_stock_has_double_backward(dims)
        grad_output, inp, grid = make_problem(2, 3, 5, 6, 4, 4, seed=21,
                                              **depth_sizes(dims, 3, 2))

        def r1_grads():
            x = inp.clone().requires_grad_()
            g = grid.clone().requires_grad_(grid_requires_grad)
            out = F.grid_sample(x, g, mode="bilinear", padding_mode="reflection",
                                align_corners=False)
            logits = (out * grad_output).sum() + out.square().sum()
            (gx,) = torch.autograd.grad(logits, x, create_graph=True)
            gx.square().sum().backward()
            return x.grad, g.grad

        with DeterministicGuard(True):
            expected = r1_grads()
            with detgrid.enabled(("cpu",)):
                got = r1_grads()
        self.assertIsNotNone(got[0])
        self.assertEqual(got[0], expected[0], rtol=1e-12, atol=1e-12)
        if grid_requires_grad:
            self.assertEqual(got[1], expected[1], rtol=1e-12, atol=1e-12)
        else:
            self.assertIsNone(got[1])

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_double_backward_tests_follow_the_probe(self, dims):
        # The double-backward tests (test_enabled_cuda_double_backward_works
        # shares the skip) are skipped exactly where the probe finds no stock
        # derivative, and run where it finds one: faked True on a torch without
        # it, the test reaches the missing derivative rather than skipping.
        test = getattr(self, f"test_double_backward_works_while_enabled_grid_grad_{dims}d")
        has_it = detgrid_testing.stock_has_double_backward(dims)
        with mock.patch.object(detgrid_testing, "stock_has_double_backward", return_value=False), \
                self.assertRaisesRegex(unittest.SkipTest, "no double backward"):
            test()
        with mock.patch.object(detgrid_testing, "stock_has_double_backward", return_value=True):
            if has_it:
                test()
            else:
                with self.assertRaisesRegex(RuntimeError, "derivative for .* is not implemented"):
                    test()

    @unittest.skipIf(ops.has_cuda_kernels(), "this build has CUDA kernels")
    def test_enable_cuda_without_kernels_warns_and_does_nothing(self):
        with self.assertWarnsRegex(UserWarning, "built without CUDA kernels"):
            detgrid.enable(("cuda",))
        self.assertFalse(detgrid.is_enabled("cuda"))

    @unittest.skipIf(ops.has_cuda_kernels(), "this build has CUDA kernels")
    def test_no_cuda_kernels_warning_points_at_the_caller_and_says_what_to_do(self):
        with self.assertWarnsRegex(UserWarning, "reinstall detgrid .*--no-build-isolation") \
                as direct:
            detgrid.enable("cuda")
        with self.assertWarnsRegex(UserWarning, "built without CUDA kernels") as context:
            with detgrid.enabled(torch.device("cuda")):
                pass
        for caught in (direct, context):
            self.assertEqual(caught.filename, __file__)

    @unittest.skipIf(ops.has_cuda_kernels(), "this build has CUDA kernels")
    def test_enable_by_default_targets_cuda(self):
        with self.assertWarnsRegex(UserWarning, "built without CUDA kernels"):
            detgrid.enable()
        self.assertFalse(detgrid.is_enabled("cuda"))
        self.assertFalse(detgrid.is_enabled("cpu"))

    @unittest.skipIf(ops.has_cuda_kernels(), "this build has CUDA kernels")
    def test_enabled_context_without_cuda_kernels_warns_and_does_nothing(self):
        with self.assertWarnsRegex(UserWarning, "built without CUDA kernels"):
            with detgrid.enabled():
                self.assertFalse(detgrid.is_enabled("cuda"))
        self.assertFalse(detgrid.is_enabled("cuda"))

    @unittest.skipIf(ops.has_cuda_kernels(), "this build has CUDA kernels")
    def test_enable_cuda_without_kernels_leaves_cpu_alone(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            detgrid.enable(("cuda", "cpu"))
        self.assertTrue(detgrid.is_enabled("cpu"))
        self.assertFalse(detgrid.is_enabled("cuda"))


@unittest.skipUnless(HAS_DETGRID_CUDA, "needs a GPU and detgrid's CUDA kernels")
class TestSwitchOnCUDA(DetgridTestCase):
    def _problem(self, dtype=torch.float32, dims=2):
        if dims == 2:
            return make_zoom_problem(2, 3, 16, 20, 64, 64, dtype=dtype, device="cuda",
                                     seed=4)
        return make_zoom_problem(2, 3, 8, 10, 16, 16, D=6, out_D=16, dtype=dtype,
                                 device="cuda", seed=4)

    def _backward_records_no_warning(self, fn, *, warn_only):
        with detgrid.enabled(), DeterministicGuard(True, warn_only=warn_only):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = fn()
        self.assertEqual([str(w.message) for w in caught], [])
        return result

    @parametrize("warn_only", (False, True))
    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_cuda_backward_raises_no_error_and_no_warning(self, dims, warn_only):
        args = self._problem(dims=dims)
        grads = self._backward_records_no_warning(
            lambda: _grid_sample_grads(*args, BILINEAR), warn_only=warn_only)
        self.assertTrue(all(g is not None for g in grads))

    @parametrize("warn_only", (False, True))
    @parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32),
                 name_fn=lambda d: str(d).split(".")[1])
    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_cuda_grid_only_backward_is_stocks_without_error(self, dims, dtype,
                                                                       warn_only):
        # A spatial transformer: only the grid requires grad. Stock's launcher
        # alerts on it; detgrid's grid-gradient pass serves it with stock's
        # arithmetic (in half and bfloat16, stock's bits).
        args = self._problem(dtype, dims)
        grads = self._backward_records_no_warning(
            lambda: _grid_sample_grads(*args, BILINEAR, input_grad=False), warn_only=warn_only)
        self.assertIsNone(grads[0])
        expected = detgrid.ops.grid_gradient(*args, BILINEAR, ZEROS, False)
        assert_bitwise_equal(self, grads[1], expected, "grid.grad")
        if dtype != torch.float32:  # stock's fp32 build may fuse a multiply-add
            stock = stock_backward(*args, BILINEAR, ZEROS, False, (False, True))[1]
            assert_bitwise_equal(self, grads[1], stock, "grid.grad vs stock")

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_enabled_cuda_backward_runs_detgrid(self, dims, mode):
        args = self._problem(dims=dims)
        expected = detgrid_backward(*args, mode, ZEROS, False)
        with detgrid.enabled(), DeterministicGuard(True):
            grads = _grid_sample_grads(*args, mode)
        assert_bitwise_equal(self, grads[0], expected[0], "input.grad")
        assert_bitwise_equal(self, grads[1], expected[1], "grid.grad")

    @parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64),
                 name_fn=lambda d: str(d).split(".")[1])
    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_cuda_backward_is_bitwise_reproducible(self, dims, dtype):
        args = self._problem(dtype, dims)
        with detgrid.enabled(), DeterministicGuard(True):
            first = _grid_sample_grads(*args, BILINEAR, padding_mode="border")
            for _ in range(3):
                again = _grid_sample_grads(*args, BILINEAR, padding_mode="border")
                assert_bitwise_equal(self, again[0], first[0], "input.grad")
                assert_bitwise_equal(self, again[1], first[1], "grid.grad")

    @parametrize("warn_only", (False, True))
    def test_enabled_cudnn_route_is_deterministic(self, warn_only):
        # bilinear, zeros, align_corners=True, float32 4-D: grid_sample takes
        # cuDNN, whose backward detgrid replaces in deterministic mode.
        args = self._problem()
        expected = detgrid_backward(*args, BILINEAR, ZEROS, True)
        with torch.backends.cudnn.flags(enabled=True):
            runs = [self._backward_records_no_warning(
                lambda: _grid_sample_grads(*args, BILINEAR, align_corners=True),
                warn_only=warn_only) for _ in range(3)]
        for grads in runs:
            assert_bitwise_equal(self, grads[0], expected[0], "input.grad")
            assert_bitwise_equal(self, grads[1], expected[1], "grid.grad")

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_cuda_double_backward_works(self, dims):
        skip_unless_stock_has_double_backward(dims)
        grad_output, inp, grid = make_problem(2, 3, 5, 6, 4, 4, device="cuda", seed=21,
                                              **depth_sizes(dims, 3, 2))
        with detgrid.enabled(), DeterministicGuard(True):
            x = inp.clone().requires_grad_()
            out = F.grid_sample(x, grid, align_corners=False)
            (gx,) = torch.autograd.grad((out * grad_output).sum() + out.square().sum(),
                                        x, create_graph=True)
            gx.square().sum().backward()
        self.assertTrue(x.grad.isfinite().all())

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_disabled_cuda_backward_raises_the_stock_determinism_error(self, dims):
        args = self._problem(dims=dims)
        detgrid.enable()
        detgrid.disable()
        with DeterministicGuard(True):
            with self.assertRaisesRegex(
                    RuntimeError,
                    f"grid_sampler_{dims}d_backward_cuda does not have a deterministic "
                    "implementation"):
                _grid_sample_grads(*args, BILINEAR)

    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_enabled_cuda_leaves_cpu_stock(self, dims):
        args = tuple(t.cpu() for t in self._problem(dims=dims))
        stock = stock_backward(*args, BILINEAR, ZEROS, False)
        with detgrid.enabled(), DeterministicGuard(True):
            self.assertFalse(detgrid.is_enabled("cpu"))
            grads = _grid_sample_grads(*args, BILINEAR)
        assert_bitwise_equal(self, grads[0], stock[0], "input.grad")


instantiate_parametrized_tests(TestSwitchOnCPU)
instantiate_parametrized_tests(TestSwitchOnCUDA)

if __name__ == "__main__":
    run_tests()
