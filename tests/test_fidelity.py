# Owner(s): ["module: nn"]
"""The backward has stock's CUDA backward's taps: every tap's position and
weight, read from the shared math through the test-only
`detgrid::_point_taps`, equals an independent reference written from
upstream's CUDA source (stock_reference.py), for every mode, padding,
align_corners, dtype and rank, hostile coordinates included: huge ones
(bicubic taps padded onto the image, reflection's saturated flip count) and
non-finite ones. For half and bfloat16 that means scalar_t rounding wherever
stock's scalar_t arithmetic rounds."""

import itertools

import numpy as np
import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import (
    DeterministicGuard,
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import detgrid
import stock_reference as ref
from detgrid_testing import (
    ALL_DTYPES,
    MODE_NAMES,
    MODES,
    PADDING_NAMES,
    PADDINGS,
    SAMPLERS,
    STOCK_HAS_TRICUBIC,
    assert_bitwise_equal,
    depth_sizes,
    detgrid_backward,
    make_problem,
    stock_backward,
)

# Spatial sizes, outermost first: small ones, one with a single pixel, and
# widths beyond the run of consecutive integers of bfloat16 (256) and half
# (2048), where stock's scalar_t arithmetic rounds tap positions and int
# conversions too.
SIZES = {2: [(5, 7), (1, 300), (3, 2500)], 3: [(3, 4, 5), (1, 2, 300), (2, 2500, 3)]}

# Normalized coordinates that make trouble: the borders and just beyond,
# values whose pixel coordinate is an integer or half-integer, far outside
# the image (reflections), huge values (pixel coordinates from 2^31 to
# 2^60 and beyond: tap positions and reflection flip counts past int's
# range), infinities, NaN, zeros and subnormals.
HOSTILE = [0.0, -0.0, 1.0, -1.0, 1.0009765625, -1.0009765625, 0.5, -0.5, 1 / 3, 2.0, -2.0, 3.5,
           -7.25, 10.0, -99.0, 1000.0, -3000.0, 6e4, -6e4, 1e-7, -1e-7, 6e-8,
           2.0 ** 22 + 1, 3e6, -2.0 ** 24 - 3, 2.0 ** 31, -2.0 ** 31 + 5, 3.3e9, 2.0 ** 40 / 3,
           -2.0 ** 48, 2.0 ** 52 + 2, -2.0 ** 53 - 6, 2.0 ** 60, -2.0 ** 60, 1e17, 1e30, -1e30,
           float("inf"), float("-inf"), float("nan")]


def _dtype_name(dtype):
    return str(dtype).split(".")[1]


def sample_grid(dims, size, dtype, points=3000, seed=0):
    """Uniform coordinates over [-1.3, 1.3], coordinates landing on pixel
    centres and half-pixels of `size`, and the hostile values, each in
    combination with ordinary coordinates on the other axes; in `dtype`."""
    rng = np.random.default_rng(seed)
    uniform = rng.uniform(-1.3, 1.3, size=(points, dims))
    ticks = []
    for a in range(dims):
        extent = size[dims - 1 - a]
        pixel = np.arange(-2, extent + 2, 0.5)[:400]
        for align_extent, offset in ((extent - 1, 0.0), (extent, 0.5)):
            column = (pixel + offset) / max(align_extent, 1) * 2 - 1
            block = rng.uniform(-1, 1, size=(column.size, dims))
            block[:, a] = column
            ticks.append(block)
    hostile = []
    for a in range(dims):
        block = rng.uniform(-1, 1, size=(len(HOSTILE), dims))
        block[:, a] = HOSTILE
        hostile.append(block)
    every = np.concatenate([uniform] + ticks + hostile)
    return torch.from_numpy(every).to(dtype)


def detgrid_point_taps(grid, size, mode, padding, align_corners):
    positions, in_bounds, weights = torch.ops.detgrid._point_taps(
        grid, list(size), mode, padding, align_corners)
    return positions.numpy(), in_bounds.numpy(), weights.double().numpy()


class TestTapsAndWeightsMatchStockForward(TestCase):
    @parametrize("dtype", ALL_DTYPES, name_fn=_dtype_name)
    @parametrize("dims", [2, 3])
    def test_taps_and_weights_equal_reference(self, dims, dtype):
        for size, mode, padding, align_corners in itertools.product(
                SIZES[dims], MODES, PADDINGS, (False, True)):
            what = (f"{dims}-D {MODE_NAMES[mode]} {PADDING_NAMES[padding]} "
                    f"align_corners={align_corners} size {size}")
            grid = sample_grid(dims, size, dtype, points=300 if mode == ref.BICUBIC else 1500)
            positions, in_bounds, weights = detgrid_point_taps(
                grid, size, mode, padding, align_corners)
            want_positions, want_in_bounds, want_weights = ref.point_taps(
                grid, size, mode, padding, align_corners)
            np.testing.assert_array_equal(in_bounds, want_in_bounds, err_msg=what)
            mask = want_in_bounds
            np.testing.assert_array_equal(positions[mask], want_positions[mask], err_msg=what)
            np.testing.assert_array_equal(weights[mask], want_weights[mask].astype(np.float64),
                                          err_msg=what)

    @parametrize("dtype", [torch.float16, torch.bfloat16], name_fn=_dtype_name)
    def test_reduced_precision_taps_differ_from_float_ones(self, dtype):
        # The rounding is visible: computed in float throughout, many of the
        # same grid's taps or weights would differ. Guards the reference
        # against degenerating into the float computation.
        size = (64, 1024)
        grid = sample_grid(2, size, dtype)
        _, _, weights = detgrid_point_taps(grid, size, ref.BILINEAR, ref.ZEROS, False)
        float_positions, _, float_weights = ref.point_taps(
            grid.float(), size, ref.BILINEAR, ref.ZEROS, False)
        self.assertGreater(int((weights != float_weights).sum()), len(grid) // 10)


class TestGradientsFollowTheTaps(TestCase):
    @parametrize("dtype", [torch.float16, torch.bfloat16], name_fn=_dtype_name)
    def test_grad_input_of_one_point_per_image_is_its_tap_weights(self, dtype):
        # One output point per image and grad_output = 1: grad_input holds
        # the point's weights, summed where taps coincide (bicubic with
        # padding), in ascending tap order in float, then rounded to dtype.
        for mode, padding, align_corners in itertools.product(MODES, PADDINGS, (False, True)):
            H, W = 6, 300
            grid = sample_grid(2, (H, W), dtype, points=200)
            n = len(grid)
            _, in_bounds, weights = ref.point_taps(grid, (H, W), mode, padding, align_corners)
            positions, _, _ = ref.point_taps(grid, (H, W), mode, padding, align_corners)
            want = np.zeros((n, H * W), dtype=np.float32)
            for p in range(n):
                for t in np.flatnonzero(in_bounds[p]):
                    y, x = positions[p, t]
                    want[p, y * W + x] = np.float32(want[p, y * W + x] + np.float32(weights[p, t]))
            inp = torch.ones(n, 1, H, W, dtype=dtype)
            grad_output = torch.ones(n, 1, 1, 1, dtype=dtype)
            grad_input, _ = detgrid_backward(grad_output, inp, grid.view(n, 1, 1, 2), mode,
                                             padding, align_corners, output_mask=(True, False))
            want = torch.from_numpy(want).to(dtype).view(n, 1, H, W)
            self.assertEqual(grad_input, want, atol=0, rtol=0,
                             msg=f"{MODE_NAMES[mode]} {PADDING_NAMES[padding]} {align_corners}")


class TestHugeBicubicCoordinates(TestCase):
    """Issue 30: stock's bicubic pads every tap, so at any finite coordinate
    border padding samples the edge column and its backward puts the
    gradient there, with a non-zero grid gradient along the other axis."""

    @parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64],
                 name_fn=_dtype_name)
    def test_border_puts_huge_coordinates_gradient_on_the_edge(self, dtype):
        H, W = 5, 7
        x = torch.tensor([1e12, 1e30, -2.0 ** 60, 2.0 ** 31, -1e30], dtype=torch.float64)
        y = torch.tensor([0.1, -0.3, 0.45, 0.7, -0.85], dtype=torch.float64)
        n = len(x)
        grid = torch.stack([x, y], dim=1).to(dtype).view(n, 1, 1, 2)
        gen = torch.Generator().manual_seed(3)
        inp = torch.randn(n, 2, H, W, generator=gen, dtype=torch.float64).to(dtype)
        grad_output = torch.randn(n, 2, 1, 1, generator=gen, dtype=torch.float64).to(dtype)
        grad_input, grad_grid = detgrid_backward(grad_output, inp, grid, ref.BICUBIC,
                                                 ref.BORDER, False)
        want_input, want_grid = ref.backward(grad_output, inp, grid, ref.BICUBIC, ref.BORDER,
                                             False)
        edge = torch.where(x > 0, W - 1, 0)
        for p in range(n):
            columns = grad_input[p].abs().sum(dim=(0, 1))
            self.assertTrue(bool(columns[edge[p]] > 0), f"point {p}")
            self.assertEqual(int((columns != 0).sum()), 1, msg=f"point {p}")
        self.assertTrue(bool((grad_grid[..., 1] != 0).all()))
        rtol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        self.assertEqual(grad_input.double(), want_input, rtol=rtol, atol=rtol)
        if dtype != torch.bfloat16:  # bfloat16 sums round at every step, as stock's do
            self.assertEqual(grad_grid.double(), want_grid, rtol=rtol, atol=rtol)
        # grad_grid is stock's arithmetic in the dtype, exactly.
        stock_grid = ref.grid_gradient(grad_output, inp, grid, ref.BICUBIC, ref.BORDER, False)
        self.assertEqual(grad_grid.double(), stock_grid, rtol=0, atol=0)


class TestFmaContractionOfStockUnnormalize(TestCase):
    """nvcc may contract stock's `(coord + 1.f) * size - 1` into one FMA
    (align_corners=False only; the align_corners form has no product feeding
    an addition), and detgrid's explicitly rounded unnormalize does not
    contract. The float coordinate then differs by at most one float ulp
    before it is rounded to half or bfloat16, and for half and bfloat16 grid
    values the product is exact unless |coord| is small, so the rounded
    coordinate almost never moves. Measured over every value of the dtype in
    [-1.1, 1.1] at widths 1..128 and 200 random widths up to 8192 (about 10^7
    pairs each): the float coordinate moved in 15,029 (half) and 4,402
    (bfloat16) pairs, the rounded coordinate in 1 (half: one bilinear cell,
    no nearest tap) and 0 (bfloat16)."""

    WIDTHS = tuple(range(1, 65)) + (224, 1000, 1023, 1024, 2500, 4097, 8191)

    @staticmethod
    def _every_value(dtype):
        values = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
        values = values.float().numpy()
        return values[np.isfinite(values) & (np.abs(values) <= 1.1)]

    def _unnormalized(self, dtype, size, coords, fused):
        return ref._Arith(dtype, fma_unnormalize=fused).unnormalize(coords, size, False)

    @parametrize("dtype", [torch.float16, torch.bfloat16], name_fn=_dtype_name)
    def test_contraction_moves_the_float_coordinate_by_at_most_one_ulp(self, dtype):
        coords = self._every_value(dtype)
        for size in self.WIDTHS:
            plain = self._unnormalized(torch.float32, size, coords, False)
            fused = self._unnormalized(torch.float32, size, coords, True)
            ulps = np.abs(plain - fused) / np.spacing(np.abs(plain))
            self.assertLessEqual(float(ulps.max()), 1.0, f"width {size}")

    @parametrize("dtype", [torch.float16, torch.bfloat16], name_fn=_dtype_name)
    def test_contraction_almost_never_moves_the_rounded_coordinate(self, dtype):
        coords = self._every_value(dtype)
        moved = pairs = 0
        for size in self.WIDTHS:
            plain = self._unnormalized(dtype, size, coords, False)
            fused = self._unnormalized(dtype, size, coords, True)
            moved += int((plain != fused).sum())
            pairs += coords.size
        self.assertLessEqual(moved, pairs // 100_000)


class TestGridOnlyCallsAreStocks(TestCase):
    """Deterministic mode replaces only what alerts. A call for grad_grid
    alone has one writer per element and never alerted, so it keeps stock's
    kernel and stock's bits, through detgrid.ops and under enable() alike."""

    @parametrize("dtype", ALL_DTYPES, name_fn=_dtype_name)
    def test_grad_grid_alone_has_stocks_bits(self, dtype):
        for (dims, mode), padding in itertools.product(SAMPLERS, PADDINGS):
            if dims == 3 and mode == ref.BICUBIC and not STOCK_HAS_TRICUBIC:
                continue  # stock refuses 5-D bicubic input
            depth = depth_sizes(dims, 5, 3)
            args = make_problem(2, 3, 6, 7, 5, 4, dtype=dtype, seed=13, grid_range=1.2,
                                **depth)
            ours = detgrid_backward(*args, mode, padding, False, (False, True))
            stock = stock_backward(*args, mode, padding, False, (False, True))
            self.assertIsNone(ours[0])
            assert_bitwise_equal(self, ours[1], stock[1], f"{dims}-D {MODE_NAMES[mode]}")

    @parametrize("dtype", ALL_DTYPES, name_fn=_dtype_name)
    def test_enabled_grid_sample_grid_grad_alone_has_stocks_bits(self, dtype):
        for dims, mode in SAMPLERS:
            if dims == 3 and mode == ref.BICUBIC and not STOCK_HAS_TRICUBIC:
                continue  # no 5-D bicubic forward to differentiate
            depth = depth_sizes(dims, 5, 3)
            grad_output, inp, grid = make_problem(1, 2, 6, 7, 5, 4, dtype=dtype, seed=14,
                                                  **depth)
            grads = []
            for enabled in (True, False):
                with detgrid.enabled(("cpu",) if enabled else ()), \
                        DeterministicGuard(enabled):
                    g = grid.clone().requires_grad_()
                    out = F.grid_sample(inp, g, mode=MODE_NAMES[mode], align_corners=False)
                    out.backward(grad_output)
                    grads.append(g.grad)
            assert_bitwise_equal(self, grads[0], grads[1], f"{dims}-D {MODE_NAMES[mode]}")


instantiate_parametrized_tests(TestTapsAndWeightsMatchStockForward)
instantiate_parametrized_tests(TestGridOnlyCallsAreStocks)
instantiate_parametrized_tests(TestGradientsFollowTheTaps)
instantiate_parametrized_tests(TestFmaContractionOfStockUnnormalize)
instantiate_parametrized_tests(TestHugeBicubicCoordinates)

if __name__ == "__main__":
    run_tests()
