# Owner(s): ["module: nn"]
"""The two ways grad_input is reduced (GridSamplerDeterministicPipeline.cuh,
plan_chunks): dense, one writer per element of grad_input, when the table
of sort keys (destinations, or for bilinear and trilinear sampling the
cells) has no more entries than a chunk has records; sparse, a zero fill
and one writer per touched destination, otherwise. Both must give the canonical sums, so the choice
never shows in the bits, in 2-D and in 3-D (subtests with a "3d" suffix)."""

import math

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests

from detgrid_testing import (
    BICUBIC,
    BILINEAR,
    NEAREST,
    PADDINGS,
    REDUCED_DTYPES,
    SAMPLERS,
    TILE_POINTS,
    ZEROS,
    DetgridTestCase,
    assert_pair_bitwise_equal,
    depth_sizes,
    detgrid_backward,
    dims_name,
    half_pixel_grid,
    make_problem,
    make_zoom_problem,
    padding_name,
    sampler_name,
    stock_backward,
    taps_per_point,
)

def is_dense(inp, grid, mode, chunk_points=0):
    """The planner's rule (plan_chunks), restated for problems that fit one
    default chunk: dense iff the keys' table has no more entries than a
    chunk has records; bilinear and trilinear keys are cells (one more than
    the pixels along every axis) where that holds, else destinations."""
    N = inp.shape[0]
    points = N * math.prod(grid.shape[1:-1])
    taps = taps_per_point(mode, inp.dim() - 2)
    assert chunk_points or points <= 100_000, "beyond one default chunk: restate the budget"
    records = min(points, chunk_points or points) * taps
    cells = N * math.prod(size + 1 for size in inp.shape[2:])
    if mode == BILINEAR and cells <= records:
        return True
    return N * math.prod(inp.shape[2:]) <= records


class TestReductionModes(DetgridTestCase):
    SWITCHING = {
        # 10,000 points on a 100 x 200 input: 20,000 destinations lie between
        # the records of a 4096-point chunk (16,384) and of the default one
        # (40,000), so the chunk size alone switches between the two
        # reductions.
        2: dict(N=1, C=3, H=100, W=200, out_H=100, out_W=100),
        # Trilinear, 8 taps: 10,000 points on a 10 x 40 x 100 input: 40,000
        # destinations between 32,768 records (4096 points) and 80,000.
        3: dict(N=1, C=3, D=10, H=40, W=100, out_D=4, out_H=50, out_W=50),
    }

    def _switching_problem(self, dtype, device, dims=2):
        problem = make_zoom_problem(**self.SWITCHING[dims], dtype=dtype,
                                    device=device, seed=3)
        grad_output, inp, grid = problem
        self.assertTrue(is_dense(inp, grid, BILINEAR))
        self.assertFalse(is_dense(inp, grid, BILINEAR, chunk_points=TILE_POINTS))
        return problem

    @parametrize("dtype", (torch.float32, torch.float64) + REDUCED_DTYPES)
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_dense_and_sparse_reductions_give_the_same_bits(self, device, dims, dtype):
        problem = self._switching_problem(dtype, device, dims)
        dense = detgrid_backward(*problem, BILINEAR, ZEROS, False)
        sparse = detgrid_backward(*problem, BILINEAR, ZEROS, False,
                                  chunk_points=TILE_POINTS)
        assert_pair_bitwise_equal(self, sparse, dense, "sparse vs dense")

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("align_corners", (False, True))
    def test_sparse_reduction_agrees_with_stock(self, device, dims, mode, padding,
                                                align_corners):
        # A 4 x 5 grid on a 40 x 50 input (2 x 4 x 5 on 3 x 40 x 50 in
        # 3-D): most pixels receive nothing.
        depth = depth_sizes(dims, 3, 2)
        grad_output, inp, grid = make_problem(2, 3, 40, 50, 4, 5, device=device,
                                              seed=11, **depth)
        self.assertFalse(is_dense(inp, grid, mode))
        got = detgrid_backward(grad_output, inp, grid, mode, padding, align_corners)
        expected = stock_backward(grad_output.cpu(), inp.cpu(), grid.cpu(), mode,
                                  padding, align_corners)
        self.assertEqual(got[0].cpu(), expected[0], atol=1e-12, rtol=1e-12)
        self.assertEqual(got[1].cpu(), expected[1], atol=1e-12, rtol=1e-12)

    @parametrize("dtype", REDUCED_DTYPES)
    @parametrize("dims,mode", ((2, BICUBIC), (3, BILINEAR)),
                 name_fn=lambda dims, mode: dims_name(dims))
    def test_sparse_reduction_rounds_reduced_precision_once(
            self, device, dims, mode, dtype):
        # Several chunks of a sparse problem: the float carry is rounded to
        # the output dtype once, at the end, so the result is the float32
        # result rounded. On half pixels of power-of-two sizes the dtype's
        # taps and weights are float32's (see half_pixel_grid).
        if dims == 2:
            problem = make_problem(32, 2, 64, 64, 24, 24, device=device, seed=5)
        else:
            problem = make_problem(1, 2, 32, 64, 24, 24, D=32, out_D=16,
                                   device=device, seed=5)
        grad_output, inp, grid = problem
        grid = half_pixel_grid(grid, inp.shape[2:])
        grad_output, inp, grid = (t.float() for t in (grad_output, inp, grid))
        self.assertFalse(is_dense(inp, grid, mode, chunk_points=TILE_POINTS))
        self.assertGreater(grid[..., 0].numel(), TILE_POINTS)
        reduced = detgrid_backward(grad_output.to(dtype), inp.to(dtype),
                                   grid.to(dtype), mode, ZEROS, False,
                                   chunk_points=TILE_POINTS)
        # The same values in float32 (the reduced-precision inputs upcast).
        full = detgrid_backward(grad_output.to(dtype).float(), inp.to(dtype).float(),
                                grid.to(dtype).float(), mode, ZEROS, False)
        self.assertTrue(torch.equal(reduced[0], full[0].to(dtype)))

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_untouched_destinations_are_zero_in_sparse_reduction(self, device, dims):
        depth = depth_sizes(dims, 16, 1)
        grad_output, inp, grid = make_problem(1, 2, 64, 64, 2, 2, device=device,
                                              seed=2, grid_range=0.5, **depth)
        self.assertFalse(is_dense(inp, grid, NEAREST))
        grad_input, _ = detgrid_backward(grad_output, inp, grid, NEAREST, ZEROS,
                                         False)
        touched = (grad_input != 0).any(dim=1)
        # Nearest: exactly one pixel per point, the rest are +0.0.
        self.assertLessEqual(int(touched.sum()), 4)
        untouched = grad_input.movedim(1, -1)[~touched]
        self.assertTrue(torch.equal(untouched, torch.zeros_like(untouched)))
        self.assertFalse(torch.signbit(untouched).any())


instantiate_device_type_tests(TestReductionModes, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
