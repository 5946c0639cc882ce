# Owner(s): ["module: nn"]
"""Reflection padding counts flips as stock's CUDA reflect_coordinates does:
static_cast<int>(floor(in / span)), with in / span a scalar_t quotient and the
GPU's float-to-int conversion, which saturates at INT_MAX (odd). So a
coordinate reflects periodically while the flip count fits an int, and past
2^31 spans every coordinate reflects as if its flip count were odd. For
double, detgrid forms the quotient without a division (a reciprocal and
exact-remainder corrections); these tests pin it where the correctly
rounded quotient rounds up to the next integer, which flips the parity.

Bicubic pads each tap's position on its own, so these are bicubic taps."""

import numpy as np
import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import stock_reference as ref
from detgrid import ops

BICUBIC, REFLECTION = 2, 2
INT_RANGE = 2.0 ** 31


def _grid_x(pixel, width, align_corners):
    """The grid coordinate whose x pixel coordinate is `pixel`, exactly
    (width is 5 with align_corners, 4 without, so every step is exact)."""
    if align_corners:
        return 2.0 * pixel / (width - 1) - 1.0
    return (2.0 * pixel + 1.0) / width - 1.0


def _grad_input_at(pixel_x, width, align_corners):
    inp = torch.zeros(1, 1, 3, width, dtype=torch.float64)
    grid = torch.tensor([[[[_grid_x(pixel_x, width, align_corners), 0.1]]]],
                        dtype=torch.float64)
    grad_output = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    grad_input, _ = ops.grid_sampler_2d_backward(
        grad_output, inp, grid, BICUBIC, REFLECTION, align_corners, [True, False])
    return grad_input


def _x_taps(grid_x, width, align_corners):
    """detgrid's and the reference's x taps (positions [P, 4], in bounds
    [P, 4]) of points at these float64 grid x coordinates over a 1 x width
    image: the first four taps, y's first and x's four."""
    grid = torch.from_numpy(np.stack([grid_x, np.zeros_like(grid_x)], axis=1))
    positions, in_bounds, _ = torch.ops.detgrid._point_taps(
        grid, [1, width], BICUBIC, REFLECTION, align_corners)
    want_positions, want_in_bounds, _ = ref.point_taps(
        grid, (1, width), BICUBIC, REFLECTION, align_corners)
    return (positions.numpy()[:, :4, 1], in_bounds.numpy()[:, :4],
            want_positions[:, :4, 1], want_in_bounds[:, :4])


class TestReflectionFlipCount(TestCase):

    @parametrize("align_corners", (True, False))
    @parametrize("sign", (1, -1))
    def test_coordinates_within_int_range_of_spans_fold_like_their_remainder(
            self, align_corners, sign):
        width = 5 if align_corners else 4
        period = 2 * (width - 1) if align_corners else 2 * width
        multiple = period * (2 ** 29 - 2)  # about 2^30 spans
        for offset in range(-3, 4):
            for fraction in (0.25, 0.75):
                remainder = offset + fraction
                huge = sign * multiple + remainder
                self.assertEqual(huge - sign * multiple, remainder)  # exact in float64
                self.assertEqual(
                    _grad_input_at(huge, width, align_corners),
                    _grad_input_at(remainder, width, align_corners),
                    atol=0, rtol=0,
                    msg=f"pixel {huge} vs {remainder}")

    @parametrize("align_corners", (True, False))
    def test_flip_count_saturates_at_int_max_and_mirrors(self, align_corners):
        # Beyond 2^31 spans every flip count converts to INT_MAX, odd: a
        # point at a multiple of the period plus r = 1.25 (taps at pixels
        # 0..3) samples the mirror image of r's taps (x -> width - 1 - x).
        width = 5 if align_corners else 4
        span = width - 1 if align_corners else width
        huge = 2.0 ** 40 + 1.25
        self.assertGreater(huge / span, INT_RANGE)
        near = _grad_input_at(1.25, width, align_corners)
        self.assertNotEqual(near, near.flip(-1))
        self.assertEqual(_grad_input_at(huge, width, align_corners), near.flip(-1),
                         atol=0, rtol=0)

    def test_double_quotient_rounding_up_to_an_integer_flips_the_parity(self):
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
        # Every double grid x from 64 below to 64 above the one whose pixel
        # coordinate is the tap: steps of 2 pixels, where doubles are even.
        centre = 2.0 * tap / (width - 1) - 1.0
        grid_x = centre + np.spacing(centre) * np.arange(-64, 65)
        positions, in_bounds, want_positions, want_in_bounds = _x_taps(
            grid_x, width, True)
        np.testing.assert_array_equal(in_bounds, want_in_bounds)
        np.testing.assert_array_equal(positions, want_positions)
        # Stock's positions (the reference's), formed in float64 as stock
        # forms them, reflected with the exact flip count instead:
        source = ref._Arith(torch.float64).unnormalize(grid_x, width, True)
        base = np.floor(source)
        period = 2 * span
        exact = np.empty_like(want_positions)
        for k in range(4):
            for point, position in enumerate((base - 1) + k):
                folded = abs(int(position)) % period
                exact[point, k] = folded if folded < width else period - folded
        differ = want_positions != exact
        self.assertTrue(differ.any())
        np.testing.assert_array_equal(want_positions[differ] + exact[differ], span)

    @parametrize("align_corners", (True, False))
    def test_taps_equal_reference_around_multiples_of_the_period(self, align_corners):
        # Pixel coordinates m * period + r for m from 2^20 to 2^60 and r
        # around 0, in float64: periodic below 2^31 spans, saturated beyond.
        width = 5 if align_corners else 4
        period = 2 * (width - 1) if align_corners else 2 * width
        pixels = [sign * (2.0 ** e) * period + r
                  for e in range(20, 61, 4) for sign in (1, -1)
                  for r in (-2.5, -1.0, -0.25, 0.0, 0.5, 1.75, 3.0)]
        grid_x = np.array([_grid_x(p, width, align_corners) for p in pixels])
        positions, in_bounds, want_positions, want_in_bounds = _x_taps(
            grid_x, width, align_corners)
        np.testing.assert_array_equal(in_bounds, want_in_bounds)
        np.testing.assert_array_equal(positions[want_in_bounds],
                                      want_positions[want_in_bounds])
        self.assertTrue(want_in_bounds.all())  # reflection lands every tap


instantiate_parametrized_tests(TestReflectionFlipCount)

if __name__ == "__main__":
    run_tests()
