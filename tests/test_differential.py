# Owner(s): ["module: nn"]
"""Randomized differential test of detgrid's backward on CPU (the host
executor, the CUDA kernels' math), seeded so every run draws the same cases.

Each case draws a rank, mode, padding, align_corners, dtype, shape (empty
ones included), memory layout (channels-last input, sliced grid, expanded
grad_output) and grid kind: inside the image, outside it, on pixel centres
(integer source coordinates), huge (pixel coordinates from 2^31 to 1e30) or
with non-finite values. detgrid's gradients are compared
  - with stock's CPU backward where its formulas and stock's CUDA ones
    agree: float32 and float64, finite grids of moderate size off pixel
    centres (at an integer coordinate stock's CPU kernel takes the other
    one-sided slope of bilinear sampling; beyond 2^31 pixels its int
    conversions are undefined; non-finite grids crash it, upstream #24823);
  - with stock_reference's exact gradients of stock's CUDA taps elsewhere.
Every case's bits must be the same with 1 and 2 threads and on a repeated
call, and no case may raise or crash.

The upstream core (aten_kernels/aten/, its host build) runs the same draw:
its grad_input is compared with the same expectations on finite grids, and
on huge and non-finite ones with a serial run of the existing CUDA kernel's
arithmetic (the same NaN and infinite elements, close finite ones; float32
and float64, where one rounding of the sum does not dominate); its bits must
not move with the launch shape and thread order, and each of its speed
levels (detgrid.levels.CORE_BUILDS) must give them too (bicubic sums of
NaNs of both signs may keep another NaN sign on the host:
golden.core.differ_only_in_nan_signs)."""

import os

import numpy as np
import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import stock_reference as ref
from detgrid import levels
from golden import core as golden_core
from detgrid_testing import (
    ALL_DTYPES,
    REDUCED_DTYPES,
    MODE_NAMES,
    PADDING_NAMES,
    SAMPLERS,
    STOCK_HAS_TRICUBIC,
    assert_bitwise_equal,
    detgrid_backward,
    expanded,
    pixel_to_grid,
    stock_backward,
    strided_like,
    ulp_rtol,
)

SEED = 30
CASES = 400
# Under the sanitizers, a NaN or out-of-range float converted to int is
# undefined behaviour on the host (the GPU saturates): those draws are left out.
UNDER_SANITIZERS = os.environ.get("DETGRID_SANITIZERS") == "1"
GRID_KINDS = ("inside", "outside", "centres", "huge", "nonfinite")
LAYOUTS = ("contiguous", "channels_last", "sliced_grid", "expanded_grad_output")
HUGE = np.array([2.0 ** 31, -2.0 ** 31, 3.3e9, 2.0 ** 40, -2.0 ** 45, 2.0 ** 52 + 2,
                 2.0 ** 60, -2.0 ** 60, 1e12, 1e30, -1e30])
NONFINITE = np.array([np.nan, np.inf, -np.inf])


class Case:
    def __init__(self, rng, number):
        self.number = number
        self.dims, self.mode = SAMPLERS[rng.integers(len(SAMPLERS))]
        self.padding = int(rng.integers(3))
        self.align_corners = bool(rng.integers(2))
        self.dtype = ALL_DTYPES[rng.integers(len(ALL_DTYPES))]
        self.kind = GRID_KINDS[rng.integers(len(GRID_KINDS))]
        self.layout = LAYOUTS[rng.integers(len(LAYOUTS))]
        small = 3 if self.dims == 3 else 6
        self.N = int(rng.choice([0, 1, 2, 3], p=[0.08, 0.4, 0.32, 0.2]))
        self.C = int(rng.choice([0, 1, 2, 4], p=[0.06, 0.34, 0.3, 0.3]))
        self.in_size = tuple(int(rng.integers(1, small + 1)) for _ in range(self.dims))
        self.out_size = tuple(int(rng.choice([0, 1, 2, 3, small], p=[0.04, 0.2, 0.3, 0.3, 0.16]))
                              for _ in range(self.dims))

    def __str__(self):
        return (f"case {self.number}: {self.dims}-D {MODE_NAMES[self.mode]} "
                f"{PADDING_NAMES[self.padding]} align_corners={self.align_corners} "
                f"{self.dtype} {self.kind} grid, {self.layout}, N={self.N} C={self.C} "
                f"in {self.in_size} out {self.out_size}")

    def compares_with_stock_cpu(self):
        if self.dims == 3 and self.mode == ref.BICUBIC and not STOCK_HAS_TRICUBIC:
            return False
        return self.dtype in (torch.float32, torch.float64) and self.kind in ("inside", "outside")


def _grid_values(rng, case):
    """(N, out..., dims) float64 grid coordinates of the case's kind."""
    shape = (case.N, *case.out_size, case.dims)
    if case.kind == "inside":
        return rng.uniform(-1, 1, shape)
    if case.kind == "outside":
        return rng.uniform(-3.5, 3.5, shape)
    grid = rng.uniform(-1.2, 1.2, shape)
    if case.kind == "centres":
        for k in range(case.dims):
            size = case.in_size[case.dims - 1 - k]
            if size == 1 and case.align_corners:
                continue  # every coordinate is pixel 0's centre
            pixels = rng.integers(-2, size + 2, shape[:-1]).astype(np.float64)
            grid[..., k] = pixel_to_grid(pixels, size, case.align_corners)
        return grid
    special = HUGE if case.kind == "huge" else np.concatenate([NONFINITE, HUGE[:3]])
    mask = rng.random(shape) < 0.5
    return np.where(mask, rng.choice(special, shape), grid)


def _problem(rng, case):
    gout = torch.from_numpy(rng.standard_normal((case.N, case.C, *case.out_size)))
    inp = torch.from_numpy(rng.standard_normal((case.N, case.C, *case.in_size)))
    grid = torch.from_numpy(_grid_values(rng, case))
    gout, inp, grid = (t.to(case.dtype) for t in (gout, inp, grid))
    if case.layout == "channels_last":
        inp = strided_like(inp, "channels_last")
        gout = strided_like(gout, "channels_last")
    elif case.layout == "sliced_grid":
        wide = torch.zeros(*grid.shape[:-1], 2 * case.dims + 1, dtype=case.dtype)
        wide[..., 1::2] = grid
        grid = wide[..., 1::2]
    elif case.layout == "expanded_grad_output":
        gout = expanded(0.75, gout.shape, case.dtype)
    return gout, inp, grid


def _tolerances(dtype, reference):
    scale = max(1.0, reference.abs().max().item()) if reference.numel() else 1.0
    if dtype == torch.float64:
        return 1e-12, 1e-12 * scale
    if dtype == torch.float32:
        return 1e-5, 1e-5 * scale
    return ulp_rtol(dtype), (1e-4 if dtype == torch.float16 else 1e-3) * scale


def _with_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


class TestRandomizedAgainstStock(TestCase):

    def _assert_close(self, actual, expected, dtype, what):
        rtol, atol = _tolerances(dtype, expected)
        self.assertEqual(actual.double(), expected.double(), rtol=rtol, atol=atol, msg=what)

    def _expected(self, case, gout, inp, grid):
        if case.compares_with_stock_cpu():
            return stock_backward(gout, inp, grid, case.mode, case.padding,
                                  case.align_corners)
        return ref.backward(gout.contiguous(), inp.contiguous(), grid.contiguous(),
                            case.mode, case.padding, case.align_corners)

    def test_random_problems_match_stock_and_keep_their_bits(self):
        rng = np.random.default_rng(SEED)
        kinds = set()
        for number in range(CASES):
            case = Case(rng, number)
            gout, inp, grid = _problem(rng, case)
            args = (gout, inp, grid, case.mode, case.padding, case.align_corners)
            one = _with_threads(1, lambda: detgrid_backward(*args))
            two = _with_threads(2, lambda: detgrid_backward(*args))
            again = _with_threads(2, lambda: detgrid_backward(*args))
            for name, got, other in zip(("grad_input", "grad_grid"), one, two):
                assert_bitwise_equal(self, other, got, f"{case}: {name}, 2 threads vs 1")
            for name, got, other in zip(("grad_input", "grad_grid"), one, again):
                assert_bitwise_equal(self, other, got, f"{case}: {name}, repeated call")
            expected = self._expected(case, *args[:3])
            for name, got, want in zip(("grad_input", "grad_grid"), one, expected):
                self.assertEqual(tuple(got.shape), tuple(want.shape), msg=f"{case}: {name}")
                if name == "grad_input" or case.dtype not in REDUCED_DTYPES:
                    self._assert_close(got, want, case.dtype, f"{case}: {name}")
            if case.dtype in REDUCED_DTYPES:
                # grad_grid is stock's CUDA arithmetic in the dtype, exactly.
                stock_grid = ref.grid_gradient(*(t.contiguous() for t in args[:3]), *args[3:])
                assert_bitwise_equal(self, one[1], stock_grid.to(case.dtype),
                                     f"{case}: grad_grid")
            kinds.add((case.kind, case.compares_with_stock_cpu()))
        # The draw covers every grid kind, and both comparisons.
        self.assertEqual({kind for kind, _ in kinds}, set(GRID_KINDS))
        self.assertEqual({stock for _, stock in kinds}, {True, False})


class TestRandomizedCore(TestCase):

    # Half and BFloat16: the existing kernel forms each term in the dtype
    # (bicubic's (gOut * wx) * wy included) and sums in it; the core forms the
    # same terms and sums in float, so they differ by the existing kernel's
    # roundings of its sums.
    REDUCED_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 1e-1}

    def _assert_existing_kernels(self, case, got, args):
        existing = torch.ops.detgrid._existing_kernel_reference(*args)
        what = f"{case}: core grad_input against the existing kernel"
        self.assertEqual(got.isnan(), existing.isnan(), msg=what)
        self.assertEqual(got.isinf(), existing.isinf(), msg=what)
        finite = got.isfinite() & existing.isfinite()
        want = existing[finite].double()
        if case.dtype in self.REDUCED_TOLERANCE:
            tol = self.REDUCED_TOLERANCE[case.dtype]
            rtol, atol = tol, tol * max(1.0, want.abs().max().item() if want.numel() else 1.0)
        else:
            rtol, atol = _tolerances(case.dtype, want)
        self.assertEqual(got[finite].double(), want, rtol=rtol, atol=atol, msg=what)

    def test_random_problems_on_the_core_match_and_keep_their_bits(self):
        rng = np.random.default_rng(SEED)
        compared = set()
        for number in range(CASES):
            case = Case(rng, number)
            gout, inp, grid = _problem(rng, case)
            args = (gout, inp, grid, case.mode, case.padding, case.align_corners)
            if case.dims == 3 and case.mode == ref.BICUBIC:
                continue  # refused in one line (tests/test_core.py)
            hostile = case.kind in ("huge", "nonfinite")
            if hostile and UNDER_SANITIZERS:
                continue
            core = torch.ops.detgrid._core_grad_input(*args)
            shuffled = torch.ops.detgrid._core_grad_input(*args, 32, 3, number + 1)
            assert_bitwise_equal(self, shuffled, core, f"{case}: core, another launch shape")
            for level in levels.CORE_BUILDS[1:]:
                for launch in ((0, 0, 0), (16, 2, number + 7)):
                    got = torch.ops.detgrid._core_grad_input(*args, *launch, level=level)
                    what = f"{case}: {level}, launch {launch}, against the core"
                    if case.mode == ref.BICUBIC and got.isnan().any():
                        self.assertTrue(golden_core.differ_only_in_nan_signs(got, core), what)
                    else:
                        assert_bitwise_equal(self, got, core, what)
            if not hostile and case.dtype in REDUCED_DTYPES:
                self._assert_existing_kernels(case, core, args)
            elif not hostile:
                want = self._expected_grad_input(case, gout, inp, grid)
                self.assertEqual(tuple(core.shape), tuple(want.shape), msg=str(case))
                rtol, atol = _tolerances(case.dtype, want)
                self.assertEqual(core.double(), want.double(), rtol=rtol, atol=atol,
                                 msg=f"{case}: core grad_input")
            elif case.dtype in (torch.float32, torch.float64):
                self._assert_existing_kernels(case, core, args)
            compared.add(case.kind)
        self.assertEqual(compared, set(GRID_KINDS) if not UNDER_SANITIZERS
                         else {"inside", "outside", "centres"})

    def _expected_grad_input(self, case, gout, inp, grid):
        if case.compares_with_stock_cpu():
            return stock_backward(gout, inp, grid, case.mode, case.padding,
                                  case.align_corners)[0]
        return ref.backward(gout.contiguous(), inp.contiguous(), grid.contiguous(),
                            case.mode, case.padding, case.align_corners)[0]


if __name__ == "__main__":
    run_tests()
