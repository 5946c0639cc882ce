# Owner(s): ["module: nn"]
"""Reflection padding counts flips as stock's CUDA reflect_coordinates does:
static_cast<int>(floor(in / span)), with in / span a scalar_t quotient. So a
coordinate reflects periodically while the flip count fits an int, and past
2^31 spans the GPU's conversion saturates at INT_MAX (odd): every coordinate
reflects as if its flip count were odd. On the host that conversion is
undefined (the core's host build takes what its compiler makes of it), so
there only counts within int's range are compared. Tricubic taps fold by
compute_coordinates_sized, which takes the parity from fmod and converts no
float: periodic at every size, on the GPU and the host alike. In float64 the
correctly rounded quotient can round up to the next integer, which flips the
parity; the backward takes stock's quotient, so its taps do too.

Bicubic pads each tap's position on its own, so these are bicubic taps, read
from grad_input: one point per image and grad_output 1 put each tap's weight
on its pixel (tests/stock_reference.py gives the reference's)."""

import numpy as np
import torch
from torch.testing._internal.common_device_type import (
    instantiate_device_type_tests,
    onlyCUDA,
)
from torch.testing._internal.common_utils import parametrize, run_tests

import stock_reference as ref
from detgrid_testing import DetgridTestCase, detgrid_backward

BICUBIC, REFLECTION = 2, 2
INT_RANGE = 2.0 ** 31


def _grid_x(pixel, width, align_corners):
    """The grid coordinate whose x pixel coordinate is `pixel`, exactly
    (width is 5 with align_corners, 4 without, so every step is exact)."""
    if align_corners:
        return 2.0 * pixel / (width - 1) - 1.0
    return (2.0 * pixel + 1.0) / width - 1.0


def _problem(grid_x, width, dims, grad_output=None):
    """(grad_output, input, grid) of one point per image at these float64
    grid x coordinates over a 1 x width (1 x 1 x width) input, the other
    coordinates 0; grad_output 1 unless given (one value per point)."""
    n = len(grid_x)
    grid = torch.zeros(n, *(1,) * dims, dims, dtype=torch.float64)
    grid[..., 0] = torch.as_tensor(np.asarray(grid_x), dtype=torch.float64).view(
        n, *(1,) * dims)
    if grad_output is None:
        grad_output = torch.ones(n)
    grad_output = torch.as_tensor(grad_output, dtype=torch.float64).view(n, 1, *(1,) * dims)
    inp = torch.zeros(n, 1, *(1,) * (dims - 1), width, dtype=torch.float64)
    return grad_output, inp, grid


def _grad_input(problem, align_corners, device):
    grad_output, inp, grid = (t.to(device) for t in problem)
    grad_input, _ = detgrid_backward(grad_output, inp, grid, BICUBIC, REFLECTION,
                                     align_corners, (True, False))
    return grad_input.cpu()


def _grad_input_at(pixel_x, width, align_corners, dims, device):
    """grad_input (over x) of one point at pixel coordinate pixel_x."""
    problem = _problem([_grid_x(pixel_x, width, align_corners)], width, dims)
    return _grad_input(problem, align_corners, device).flatten()


class TestReflectionFlipCount(DetgridTestCase):

    @parametrize("dims", (2, 3))
    @parametrize("align_corners", (True, False))
    @parametrize("sign", (1, -1))
    def test_coordinates_within_int_range_of_spans_fold_like_their_remainder(
            self, device, sign, align_corners, dims):
        width = 5 if align_corners else 4
        period = 2 * (width - 1) if align_corners else 2 * width
        multiple = period * (2 ** 29 - 2)  # about 2^30 spans
        for offset in range(-3, 4):
            for fraction in (0.25, 0.75):
                remainder = offset + fraction
                huge = sign * multiple + remainder
                self.assertEqual(huge - sign * multiple, remainder)  # exact in float64
                self.assertEqual(
                    _grad_input_at(huge, width, align_corners, dims, device),
                    _grad_input_at(remainder, width, align_corners, dims, device),
                    atol=0, rtol=0, msg=f"pixel {huge} vs {remainder}")

    @onlyCUDA
    @parametrize("align_corners", (True, False))
    def test_flip_count_saturates_at_int_max_and_mirrors(self, device, align_corners):
        # Beyond 2^31 spans every flip count converts to INT_MAX, odd: a
        # point at a multiple of the period plus r = 1.25 (taps at pixels
        # 0..3) samples the mirror image of r's taps (x -> width - 1 - x).
        width = 5 if align_corners else 4
        span = width - 1 if align_corners else width
        huge = 2.0 ** 40 + 1.25
        self.assertGreater(huge / span, INT_RANGE)
        near = _grad_input_at(1.25, width, align_corners, 2, device)
        self.assertNotEqual(near, near.flip(-1))
        self.assertEqual(_grad_input_at(huge, width, align_corners, 2, device), near.flip(-1),
                         atol=0, rtol=0)

    @parametrize("align_corners", (True, False))
    def test_tricubic_flip_parity_is_exact_past_int_range(self, device, align_corners):
        # 2^40 is an even number of spans, 2^40 + span an odd one: the first
        # samples as r = 1.25 does, the second r's mirror image.
        width = 5 if align_corners else 4
        span = width - 1 if align_corners else width
        self.assertGreater(2.0 ** 40 / span, INT_RANGE)
        near = _grad_input_at(1.25, width, align_corners, 3, device)
        self.assertNotEqual(near, near.flip(-1))
        for pixel, want in ((2.0 ** 40 + 1.25, near), (2.0 ** 40 + span + 1.25, near.flip(-1))):
            self.assertEqual(_grad_input_at(pixel, width, align_corners, 3, device), want,
                             atol=0, rtol=0, msg=f"pixel {pixel}")

    @parametrize("dims", (2, 3))
    def test_double_quotient_rounding_up_to_an_integer_flips_the_parity(self, device, dims):
        # align_corners=True, span s = 2^23 + 1 (width s + 1), low 0: a tap at
        # d = m * s - 1 with m = 2^30 + 1 (so d = 2^53 + 2^30 + 2^23, even,
        # exact) is 1 short of m spans, and in float64 m - 1 / s rounds to m
        # (1 / s is below half an ulp of m). Stock counts m flips, odd, where
        # the exact count m - 1 is even: the tap goes to pixel 1, not s - 1.
        span = 2 ** 23 + 1
        width = span + 1
        m = 2 ** 30 + 1
        tap = float(m * span - 1)
        self.assertTrue(float(int(tap)) == tap and tap / span == m)  # the rounding up
        # Every double grid x from 32 below to 32 above the one whose pixel
        # coordinate is the tap: steps of 2 pixels, where doubles are even. A
        # whole pixel coordinate puts all of a point's weight on its second x
        # tap; point k's grad_output is 2^k, so grad_input holds every point's
        # pixel, its sums exact.
        centre = 2.0 * tap / (width - 1) - 1.0
        grid_x = centre + np.spacing(centre) * np.arange(-32, 33)
        ones = (1,) * (dims - 1)
        grid = torch.zeros(1, *ones, len(grid_x), dims, dtype=torch.float64)
        grid[..., 0] = torch.from_numpy(grid_x)
        problem = (torch.from_numpy(2.0 ** np.arange(len(grid_x))).view(1, 1, *ones, -1),
                   torch.zeros(1, 1, *ones, width, dtype=torch.float64), grid)
        got = _grad_input(problem, True, device)
        want = ref.backward(*problem, BICUBIC, REFLECTION, True)[0]
        self.assertEqual(got, want, atol=0, rtol=0)
        # Stock's positions (the reference's), formed in float64 as stock
        # forms them, reflected with the exact flip count instead: they differ.
        positions, _, _ = ref.point_taps(grid.view(-1, dims), ones + (width,), BICUBIC,
                                         REFLECTION, True)
        x_taps = positions[:, :4, -1]  # the four x taps (x fastest)
        source = ref._Arith(torch.float64).unnormalize(grid_x, width, True)
        base = np.floor(source)
        period = 2 * span
        exact = np.empty_like(x_taps)
        for k in range(4):
            for point, position in enumerate((base - 1) + k):
                folded = abs(int(position)) % period
                exact[point, k] = folded if folded < width else period - folded
        differ = x_taps != exact
        self.assertTrue(differ.any())
        np.testing.assert_array_equal(x_taps[differ] + exact[differ], span)

    @parametrize("dims", (2, 3))
    @parametrize("align_corners", (True, False))
    def test_taps_equal_reference_around_multiples_of_the_period(self, device, align_corners,
                                                                 dims):
        # Pixel coordinates m * period + r for m from 2^20 to 2^60 and r
        # around 0, in float64: periodic below 2^31 spans, saturated beyond
        # (2-D on the GPU; see the module comment), periodic throughout in
        # tricubic sampling.
        width = 5 if align_corners else 4
        period = 2 * (width - 1) if align_corners else 2 * width
        span = period // 2
        pixels = [sign * (2.0 ** e) * period + r
                  for e in range(20, 61, 4) for sign in (1, -1)
                  for r in (-2.5, -1.0, -0.25, 0.0, 0.5, 1.75, 3.0)]
        if dims == 2 and device == "cpu":
            pixels = [p for p in pixels if abs(p) / span < INT_RANGE / 2]
        self.assertGreaterEqual(len(pixels), 42)  # m from 2^20 to 2^28 at least
        problem = _problem([_grid_x(p, width, align_corners) for p in pixels], width, dims)
        got = _grad_input(problem, align_corners, device)
        want = ref.backward(*problem, BICUBIC, REFLECTION, align_corners)[0]
        self.assertEqual(got, want, atol=1e-12, rtol=1e-12)
        # Reflection lands every tap: each point's weights sum to one.
        self.assertEqual(got.sum(dim=-1), torch.ones_like(got.sum(dim=-1)), atol=1e-12,
                         rtol=0)


instantiate_device_type_tests(TestReflectionFlipCount, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
