# Owner(s): ["module: nn"]
"""Calls for grad_grid alone, and the route every backward call takes.

Under detgrid.enable() on CUDA, deterministic mode must not hand a call for
grad_grid alone to stock's kernel: every released torch alerts in its
launcher before it looks at output_mask. detgrid runs its grid-gradient
pass instead, with stock's arithmetic (scalar_t sums over channels, stock's
tap order, scalar_t multiplier), the same grad_grid its full backward gives.
The route is one function (aten_kernels/extension/routing.h), so the CUDA
decisions are tested here, without a GPU.
"""

import itertools
import pathlib
import re

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import DeterministicGuard, parametrize, run_tests

import stock_reference as ref
from detgrid import ops
from detgrid_testing import (ALL_DTYPES, BICUBIC, BILINEAR, NEAREST, PADDINGS, SAMPLERS,
                             DetgridTestCase, assert_bitwise_equal, depth_sizes, detgrid_backward,
                             hard_grid, make_problem, padding_name, sampler_name)

EXTENSION = pathlib.Path(__file__).resolve().parents[1] / "aten_kernels" / "extension"
MASKS = [list(mask) for mask in itertools.product((False, True), repeat=2)]


def expected_route(device_type, deterministic, output_mask):
    """The routing rule, stated independently of routing.h."""
    if not deterministic:
        return "stock"
    if output_mask[0]:
        return "detgrid"  # stock scatters grad_input with atomicAdd
    return "detgrid" if device_type == "cuda" else "stock"  # CUDA's launcher alerts


class TestBackwardRoute(DetgridTestCase):
    def test_route_of_every_combination(self):
        for device_type, deterministic, warn_only, mask in itertools.product(
                ("cpu", "cuda"), (False, True), (False, True), MASKS):
            with self.subTest(device=device_type, deterministic=deterministic,
                              warn_only=warn_only, mask=mask):
                self.assertEqual(ops.backward_route(device_type, deterministic, warn_only, mask),
                                 expected_route(device_type, deterministic, mask))

    def test_grid_only_cuda_call_in_deterministic_mode_takes_detgrid(self):
        self.assertEqual(ops.backward_route("cuda", True, False, [False, True]), "detgrid")
        self.assertEqual(ops.backward_route("cuda", True, True, [False, True]), "detgrid")

    def test_cuda_override_never_reaches_alerting_stock_in_deterministic_mode(self):
        # Stock's CUDA entry points alert in deterministic mode whatever the
        # mask; the overrides call them only on the "stock" route.
        for warn_only, mask in itertools.product((False, True), MASKS):
            self.assertEqual(ops.backward_route("cuda", True, warn_only, mask), "detgrid")

    def test_cuda_sources_call_stock_only_on_the_stock_route(self):
        # Every use of an alerting stock entry point in the CUDA glue is the
        # `stock` argument of a routed helper or sits under an explicit
        # Stock route: no other path can reach one.
        source = (EXTENSION / "cuda_ops.cpp").read_text()
        lines = source.splitlines()
        stock_entry = re.compile(r"at::native::(grid_sampler_[23]d_backward_cuda|"
                                 r"cudnn_grid_sampler_backward)\b")
        guards = ("routed_backward<", "constexpr AtenBackwardFn stock",
                  "route == BackwardRoute::Stock")
        uses = [i for i, line in enumerate(lines) if stock_entry.search(line)]
        self.assertGreaterEqual(len(uses), 5)
        for i in uses:
            context = "\n".join(lines[max(0, i - 4):i + 1])
            self.assertTrue(any(guard in context for guard in guards),
                            f"cuda_ops.cpp:{i + 1} reaches stock off the route: {lines[i]}")

    def test_unknown_device_is_a_one_line_error(self):
        with self.assertRaisesRegex(RuntimeError, "device_type must be 'cpu' or 'cuda'"):
            ops.backward_route("mps", True, False, [False, True])


def _problem(dims, dtype, align_corners, device="cpu"):
    grad_output, inp, _ = make_problem(2, 3, 8, 8, 5, 4, **depth_sizes(dims, 4, 3),
                                       dtype=dtype, device=device, seed=7)
    grid = hard_grid(2, 5, 4, 8, 8, align_corners, **depth_sizes(dims, 4, 3), seed=3)
    return grad_output, inp, grid.to(device=device, dtype=dtype)


class TestGridGradient(DetgridTestCase):
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    def test_grid_gradient_is_stock_arithmetic_in_every_dtype(self, device, dims, mode,
                                                               padding):
        for dtype, align_corners in itertools.product(ALL_DTYPES, (False, True)):
            with self.subTest(dtype=dtype, align_corners=align_corners):
                args = _problem(dims, dtype, align_corners, device)
                ours = ops.grid_gradient(*args, mode, padding, align_corners)
                cpu_args = [t.cpu() for t in args]
                expected = ref.grid_gradient(*cpu_args, mode, padding, align_corners)
                assert_bitwise_equal(self, ours.cpu(), expected.to(dtype), "grad_grid")

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_grad_grid_bits_do_not_depend_on_grad_input_requested(self, device, dims, mode):
        for dtype, padding in itertools.product(ALL_DTYPES, PADDINGS):
            with self.subTest(dtype=dtype, padding=padding):
                args = _problem(dims, dtype, False, device)
                _, full = detgrid_backward(*args, mode, padding, False, (True, True))
                alone = ops.grid_gradient(*args, mode, padding, False)
                assert_bitwise_equal(self, alone, full, "grad_grid")

    def test_grid_only_detgrid_op_on_cpu_returns_stock_result(self, device):
        if device != "cpu":
            self.skipTest("the CPU route")
        args = _problem(2, torch.float32, False)
        grad_input, grad_grid = detgrid_backward(*args, BILINEAR, 0, False, (False, True))
        _, stock = torch.ops.aten.grid_sampler_2d_backward(*args, BILINEAR, 0, False,
                                                           [False, True])
        self.assertIsNone(grad_input)
        assert_bitwise_equal(self, grad_grid, stock, "grad_grid")

    def test_nearest_grid_gradient_is_zero(self, device):
        args = _problem(2, torch.float32, False, device)
        args[0][0, 0, 0, 0] = float("inf")
        grad_grid = ops.grid_gradient(*args, NEAREST, 0, False)
        self.assertTrue(torch.equal(grad_grid, torch.zeros_like(grad_grid)))

    # The two cases where a float sum and a float multiplier gave bits stock
    # never gives: three channels whose north-east taps are (a, b, b) with
    # grad_output 1, where a + b rounds back to a in scalar_t.
    def _one_point(self, dtype, width, x, ne_index, ne_values, device):
        inp = torch.zeros(1, 3, 1, width, dtype=dtype, device=device)
        inp[0, :, 0, ne_index] = torch.tensor(ne_values, dtype=dtype)
        grid = torch.tensor([[[[x, 0.0]]]], dtype=dtype, device=device)
        grad_output = torch.ones(1, 3, 1, 1, dtype=dtype, device=device)
        alone = ops.grid_gradient(grad_output, inp, grid, BILINEAR, 0, False)
        _, full = detgrid_backward(grad_output, inp, grid, BILINEAR, 0, False, (True, True))
        return alone[0, 0, 0, 0].item(), full[0, 0, 0, 0].item()

    def test_bfloat16_sums_channels_and_scales_in_bfloat16(self, device):
        # W = 257: bfloat16 holds 257 as 256, so stock's multiplier is 128;
        # 256 + 1 rounds to 256. A float sum and multiplier gave 33280.
        alone, full = self._one_point(torch.bfloat16, 257, -1 + 2 ** -8, 1, (256, 1, 1), device)
        self.assertEqual((alone, full), (32768.0, 32768.0))

    def test_half_sums_channels_in_half(self, device):
        # 1024 + 0.5 rounds to 1024 in half; a float sum gave 2562.
        alone, full = self._one_point(torch.float16, 5, -1 + 2 ** -8, 0, (1024, 0.5, 0.5), device)
        self.assertEqual((alone, full), (2560.0, 2560.0))

    def test_grid_gradient_of_an_empty_grid_is_empty(self, device):
        grad_output, inp, grid = _problem(2, torch.float32, False, device)
        grid, grad_output = grid[:, :0], grad_output[:, :, :0]
        self.assertEqual(ops.grid_gradient(grad_output, inp, grid, BICUBIC, 0, False).shape,
                         grid.shape)


class TestOutputsWithoutDeterministicFill(DetgridTestCase):
    # In deterministic mode at::empty (empty_like, empty_strided) fills new
    # memory with NaN, a write of every element that detgrid's outputs do not
    # need: grad_grid is written in full by the grid gradient, and grad_input
    # takes the one zero fill the core sums onto (GridSampler.cpp's zeros), a
    # zero_ that may run as a fill_ (on CUDA, or a large CPU tensor), no more.
    DETERMINISTIC_FILLS = {"aten::empty", "aten::empty_like", "aten::empty_strided"}

    def test_deterministic_backward_allocates_without_fill(self, device):
        args = _problem(2, torch.float32, False, device)
        calls = {
            "full": (lambda: detgrid_backward(*args, BILINEAR, 0, False), 1),
            "grid gradient": (lambda: ops.grid_gradient(*args, BILINEAR, 0, False), 0),
        }
        for name, (call, zero_fills) in calls.items():
            with self.subTest(call=name), DeterministicGuard(True):
                self.assertTrue(torch.utils.deterministic.fill_uninitialized_memory)
                with torch.profiler.profile() as profile:
                    call()
                ran = [event.name for event in profile.events()]
                self.assertFalse(set(ran) & self.DETERMINISTIC_FILLS, ran)
                self.assertEqual(ran.count("aten::zero_"), zero_fills, ran)
                self.assertLessEqual(ran.count("aten::fill_"), zero_fills, ran)


instantiate_device_type_tests(TestGridGradient, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestOutputsWithoutDeterministicFill, globals(),
                              only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
