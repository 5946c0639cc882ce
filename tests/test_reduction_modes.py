# Owner(s): ["module: nn"]
"""The two ways grad_input is reduced (GridSamplerDeterministic.cuh,
use_dense_reduction): dense, one writer per element of grad_input, when
grad_input has no more destinations (N * H_in * W_in) than a chunk has
records; sparse, a zero fill and one writer per touched destination,
otherwise. Both must give the canonical sums, so the choice never shows in
the bits."""

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests

from detgrid_testing import (
    BICUBIC,
    BILINEAR,
    MODES,
    NEAREST,
    PADDINGS,
    REDUCED_DTYPES,
    TAPS_PER_POINT,
    TILE_POINTS,
    ZEROS,
    DetgridTestCase,
    assert_pair_bitwise_equal,
    detgrid_backward,
    make_problem,
    make_zoom_problem,
    mode_name,
    padding_name,
    stock_backward,
)

DEFAULT_CHUNK_RECORDS = 1 << 21


def is_dense(inp, grid, mode, chunk_points=0):
    """The launcher's rule, restated: dense iff destinations <= records per
    chunk."""
    N, _, H, W = inp.shape
    points = N * grid.shape[1] * grid.shape[2]
    taps = TAPS_PER_POINT[mode]
    if chunk_points == 0:
        chunk_points = max(1, DEFAULT_CHUNK_RECORDS // (taps * TILE_POINTS)) * TILE_POINTS
    return N * H * W <= min(points, chunk_points) * taps


class TestReductionModes(DetgridTestCase):
    # 10,000 points on a 100 x 200 input: 20,000 destinations lie between the
    # records of a 4096-point chunk (16,384) and of the default one (40,000),
    # so the chunk size alone switches between the two reductions.
    SWITCHING = dict(N=1, C=3, H=100, W=200, out_H=100, out_W=100)

    def _switching_problem(self, dtype, device):
        problem = make_zoom_problem(**self.SWITCHING, dtype=dtype, device=device,
                                    seed=3)
        grad_output, inp, grid = problem
        self.assertTrue(is_dense(inp, grid, BILINEAR))
        self.assertFalse(is_dense(inp, grid, BILINEAR, chunk_points=TILE_POINTS))
        return problem

    @parametrize("dtype", (torch.float32, torch.float64) + REDUCED_DTYPES)
    def test_dense_and_sparse_reductions_give_the_same_bits(self, device, dtype):
        problem = self._switching_problem(dtype, device)
        dense = detgrid_backward(*problem, BILINEAR, ZEROS, False)
        sparse = detgrid_backward(*problem, BILINEAR, ZEROS, False,
                                  chunk_points=TILE_POINTS)
        assert_pair_bitwise_equal(self, sparse, dense, "sparse vs dense")

    @parametrize("mode", MODES, name_fn=mode_name)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("align_corners", (False, True))
    def test_sparse_reduction_agrees_with_stock(self, device, mode, padding,
                                                align_corners):
        # A 4 x 5 grid on a 40 x 50 input: most pixels receive nothing.
        grad_output, inp, grid = make_problem(2, 3, 40, 50, 4, 5, device=device,
                                              seed=11)
        self.assertFalse(is_dense(inp, grid, mode))
        got = detgrid_backward(grad_output, inp, grid, mode, padding, align_corners)
        expected = stock_backward(grad_output.cpu(), inp.cpu(), grid.cpu(), mode,
                                  padding, align_corners)
        self.assertEqual(got[0].cpu(), expected[0], atol=1e-12, rtol=1e-12)
        self.assertEqual(got[1].cpu(), expected[1], atol=1e-12, rtol=1e-12)

    @parametrize("dtype", REDUCED_DTYPES)
    def test_sparse_reduction_rounds_reduced_precision_once(self, device, dtype):
        # Several chunks of a sparse problem: the float carry is rounded to
        # the output dtype once, at the end, so the result is the float32
        # result rounded.
        grad_output, inp, grid = make_problem(1, 2, 300, 300, 96, 96,
                                              dtype=torch.float32, device=device,
                                              seed=5)
        self.assertFalse(is_dense(inp, grid, BICUBIC, chunk_points=TILE_POINTS))
        reduced = detgrid_backward(grad_output.to(dtype), inp.to(dtype),
                                   grid.to(dtype), BICUBIC, ZEROS, False,
                                   chunk_points=TILE_POINTS)
        # The same values in float32 (the reduced-precision inputs upcast).
        full = detgrid_backward(grad_output.to(dtype).float(), inp.to(dtype).float(),
                                grid.to(dtype).float(), BICUBIC, ZEROS, False)
        self.assertTrue(torch.equal(reduced[0], full[0].to(dtype)))

    def test_untouched_destinations_are_zero_in_sparse_reduction(self, device):
        grad_output, inp, grid = make_problem(1, 2, 64, 64, 2, 2, device=device,
                                              seed=2, grid_range=0.5)
        self.assertFalse(is_dense(inp, grid, NEAREST))
        grad_input, _ = detgrid_backward(grad_output, inp, grid, NEAREST, ZEROS,
                                         False)
        touched = (grad_input != 0).any(dim=1)
        # Nearest: exactly one pixel per point, the rest are +0.0.
        self.assertLessEqual(int(touched.sum()), 4)
        untouched = grad_input.permute(0, 2, 3, 1)[~touched]
        self.assertTrue(torch.equal(untouched, torch.zeros_like(untouched)))
        self.assertFalse(torch.signbit(untouched).any())


instantiate_device_type_tests(TestReductionModes, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
