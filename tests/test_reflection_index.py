# Owner(s): ["module: nn"]
"""Bicubic reflection padding folds each tap's integer position by the
reflection period (reflect_index in GridSamplerDeterministic.cuh). The fold
avoids a 64-bit division, which is a subroutine call on the GPU: its
quotient comes from a product with a precomputed reciprocal and is then
corrected, so these tests pin it where such a quotient is off by one: at
huge coordinates (up to the 2^40 safe range) right around multiples of the
period, on both sides of zero.

Reflection is periodic, so a point at (multiple of the period) + r samples
exactly the pixels, with exactly the weights, of a point at r: grad_input
must be bitwise equal."""

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops

BICUBIC, REFLECTION = 2, 2
SAFE_RANGE = 2.0 ** 40


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


class TestBicubicReflectionIndex(TestCase):

    @parametrize("align_corners", (True, False))
    @parametrize("sign", (1, -1))
    def test_huge_coordinates_fold_like_their_remainder(self, align_corners, sign):
        width = 5 if align_corners else 4
        period = 2 * (width - 1) if align_corners else 2 * width
        multiple = period * int(SAFE_RANGE // period - 2)
        for offset in range(-3, 4):
            for fraction in (0.25, 0.75):
                remainder = offset + fraction
                huge = sign * multiple + remainder
                self.assertLess(abs(huge), SAFE_RANGE)
                self.assertEqual(huge - sign * multiple, remainder)  # exact in float64
                self.assertEqual(
                    _grad_input_at(huge, width, align_corners),
                    _grad_input_at(remainder, width, align_corners),
                    atol=0, rtol=0,
                    msg=f"pixel {huge} vs {remainder}")

    def test_huge_coordinates_touch_several_pixels(self):
        # Guards the test above: a fold that sent every tap to one pixel
        # would make both sides equal too.
        grad_input = _grad_input_at(2.0 ** 39 + 1.25, 5, True)
        self.assertGreaterEqual(int((grad_input != 0).sum()), 3 * 3)


instantiate_parametrized_tests(TestBicubicReflectionIndex)

if __name__ == "__main__":
    run_tests()
