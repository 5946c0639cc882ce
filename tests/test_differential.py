# Owner(s): ["module: nn"]
"""Randomized differential test of detgrid's backward on CPU (the core's
host build, which compiles the CUDA source, and the grid gradient's), seeded
so every run draws the same cases.

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
  - with stock_reference's exact gradients of stock's CUDA taps elsewhere,
    Half and BFloat16 grad_input within the rounding of the core's terms
    and float sums (detgrid_testing.reduced_precision_error_bound), their
    grad_grid bit for bit;
  - on huge and non-finite grids, grad_input with a serial run of the
    existing CUDA kernel's arithmetic on the same helpers
    (_existing_kernel_reference: the host's int conversions, which the
    core's host build shares; the GPU saturates them): the same NaN and
    infinite elements, close finite ones. Tricubic, which that run lacks,
    against stock_reference: a point with a non-finite coordinate gets no
    tap.
Every case's bits must be the same with 1 and 2 threads and on a repeated
call, and no case may raise or crash. Every build of the core
(detgrid.levels.CORE_BUILDS) runs the same draw under other launch shapes
and must give the default backward's grad_input bits (bicubic sums of NaNs
of both signs may keep another NaN sign on the host:
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
    assert_within_rounding_of_exact,
    detgrid_backward,
    expanded,
    pixel_to_grid,
    stock_backward,
    strided_like,
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
    """(rtol, atol) of float32 and float64 against the reference; atol scales
    with its largest element, which bounds the rounding error of an element
    that cancels to ~0."""
    scale = max(1.0, reference.abs().max().item()) if reference.numel() else 1.0
    if dtype == torch.float64:
        return 1e-12, 1e-12 * scale
    assert dtype == torch.float32, "Half/BFloat16 grad_input: assert_within_rounding_of_exact"
    return 1e-5, 1e-5 * scale


def _with_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


class TestRandomizedAgainstStock(TestCase):

    # The existing kernel sums Half and BFloat16 in the dtype, the core in
    # float: relative to the largest element they differ by the existing
    # kernel's roundings of its sums, a few ulps of the dtype each.
    EXISTING_KERNEL_REDUCED_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 1e-1}

    def _assert_close(self, actual, expected, dtype, what):
        rtol, atol = _tolerances(dtype, expected)
        self.assertEqual(actual.double(), expected.double(), rtol=rtol, atol=atol, msg=what)

    def _assert_same_non_finite(self, got, want, what):
        self.assertEqual(got.isnan(), want.isnan(), msg=f"{what}: NaN elements")
        self.assertEqual(got.isinf(), want.isinf(), msg=f"{what}: infinite elements")

    def _check_grad_input(self, case, got, args):
        """grad_input against the expectation of the case's kind and dtype."""
        what = f"{case}: grad_input"
        contiguous = tuple(t.contiguous() for t in args[:3])
        if case.kind not in ("huge", "nonfinite"):
            if case.compares_with_stock_cpu():
                self._assert_close(got, stock_backward(*args)[0], case.dtype, what)
            elif case.dtype in REDUCED_DTYPES:
                exact = ref.backward(*contiguous, *args[3:])[0]
                assert_within_rounding_of_exact(self, got, exact, contiguous, *args[3:], what)
            else:
                self._assert_close(got, ref.backward(*contiguous, *args[3:])[0], case.dtype,
                                   what)
            return
        if case.dims == 3 and case.mode == ref.BICUBIC:
            # Finite values agree but under reflection with align_corners=False,
            # where a huge coordinate moves by the unnormalize's contracted
            # multiply-add, which the reference rounds twice (tests/test_core.py).
            want = ref.backward(*contiguous, *args[3:])[0]
            self._assert_same_non_finite(got, want, what)
            contracted_fold = case.padding == ref.REFLECTION and not case.align_corners
            if not contracted_fold and case.dtype not in REDUCED_DTYPES:
                finite = got.isfinite()
                self._assert_close(got[finite], want[finite], case.dtype, what)
            return
        want = torch.ops.detgrid._existing_kernel_reference(*args)
        what += " against the existing kernel"
        self._assert_same_non_finite(got, want, what)
        finite = got.isfinite() & want.isfinite()
        want = want[finite].double()
        if case.dtype in REDUCED_DTYPES:
            tol = self.EXISTING_KERNEL_REDUCED_TOLERANCE[case.dtype]
            rtol, atol = tol, tol * max(1.0, want.abs().max().item() if want.numel() else 1.0)
        else:
            rtol, atol = _tolerances(case.dtype, want)
        self.assertEqual(got[finite].double(), want, rtol=rtol, atol=atol, msg=what)

    def _check_grad_grid(self, case, got, args):
        what = f"{case}: grad_grid"
        contiguous = tuple(t.contiguous() for t in args[:3])
        if case.dtype in REDUCED_DTYPES:
            # grad_grid is stock's CUDA arithmetic in the dtype, exactly.
            stock_grid = ref.grid_gradient(*contiguous, *args[3:])
            assert_bitwise_equal(self, got, stock_grid.to(case.dtype), what)
        elif case.compares_with_stock_cpu():
            self._assert_close(got, stock_backward(*args)[1], case.dtype, what)
        else:
            self._assert_close(got, ref.backward(*contiguous, *args[3:])[1], case.dtype, what)

    def test_random_problems_match_stock_and_keep_their_bits(self):
        rng = np.random.default_rng(SEED)
        kinds = set()
        for number in range(CASES):
            case = Case(rng, number)
            gout, inp, grid = _problem(rng, case)
            args = (gout, inp, grid, case.mode, case.padding, case.align_corners)
            if UNDER_SANITIZERS and case.kind in ("huge", "nonfinite"):
                continue
            one = _with_threads(1, lambda: detgrid_backward(*args))
            two = _with_threads(2, lambda: detgrid_backward(*args))
            again = _with_threads(2, lambda: detgrid_backward(*args))
            for name, got, other in zip(("grad_input", "grad_grid"), one, two):
                assert_bitwise_equal(self, other, got, f"{case}: {name}, 2 threads vs 1")
            for name, got, other in zip(("grad_input", "grad_grid"), one, again):
                assert_bitwise_equal(self, other, got, f"{case}: {name}, repeated call")
            self.assertEqual(tuple(one[0].shape), tuple(inp.shape), msg=str(case))
            self.assertEqual(tuple(one[1].shape), tuple(grid.shape), msg=str(case))
            self._check_grad_input(case, one[0], args)
            self._check_grad_grid(case, one[1], args)
            kinds.add((case.kind, case.compares_with_stock_cpu()))
        # The draw covers every grid kind, and both comparisons.
        self.assertEqual({kind for kind, _ in kinds},
                         set(GRID_KINDS) if not UNDER_SANITIZERS
                         else {"inside", "outside", "centres"})
        self.assertEqual({stock for _, stock in kinds}, {True, False})


class TestRandomizedCoreBuilds(TestCase):

    def test_every_build_and_launch_shape_gives_the_default_bits(self):
        rng = np.random.default_rng(SEED)
        for number in range(CASES):
            case = Case(rng, number)
            gout, inp, grid = _problem(rng, case)
            args = (gout, inp, grid, case.mode, case.padding, case.align_corners)
            if UNDER_SANITIZERS and case.kind in ("huge", "nonfinite"):
                continue
            default = detgrid_backward(*args, (True, False))[0]
            for level in levels.CORE_BUILDS:
                for launch in ((0, 0, 0), (32, 3, number + 1), (16, 2, number + 7)):
                    got = torch.ops.detgrid._core_grad_input(*args, *launch, level=level)
                    what = f"{case}: {level}, launch {launch}, against the default"
                    if case.mode == ref.BICUBIC and got.isnan().any():
                        self.assertTrue(golden_core.differ_only_in_nan_signs(got, default),
                                        what)
                    else:
                        assert_bitwise_equal(self, got, default, what)


if __name__ == "__main__":
    run_tests()
