# Owner(s): ["module: nn"]
"""The backward has stock's CUDA backward's taps: grad_input of one output
point per image is that point's tap weights at its taps' positions, equal to
an independent reference written from upstream's CUDA source
(stock_reference.py), for every mode, padding, align_corners and rank,
hostile coordinates included: huge ones (bicubic taps padded onto the image)
and non-finite ones (2-D bicubic: NaN terms on an edge pixel, as stock's). In
half and bfloat16 that means scalar_t rounding wherever stock's scalar_t
arithmetic rounds, and these dtypes are compared bit for bit: where the host
build contracts a multiply and an add into an FMA, as nvcc does, it moves no
rounded half or bfloat16 coordinate here (TestFmaContractionOfStockUnnormalize)."""

import itertools
import os

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

# Spatial sizes, outermost first, with a width beyond the run of consecutive
# integers of bfloat16 (256), where stock's scalar_t arithmetic rounds tap
# positions and int conversions too.
SIZES = {2: (6, 300), 3: (2, 3, 300)}

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

# Stock's reflection helpers convert the flip count, about |x| / 2, to int:
# past int's range the GPU saturates (stock_reference's rule), where on the
# host the conversion is undefined and the taps are the compiler's. On CPU
# those points are left out of the comparisons (tricubic taps convert no
# float), and under .ci/sanitize.sh (UBSan's float-cast-overflow) the
# non-finite ones too, whose flip count converts NaN.
FLIP_COUNT_LIMIT = 2.0 ** 30
# Where the padding leaves a coordinate unclipped (zeros), bilinear, nearest
# and 2-D bicubic convert it to int as the existing kernel does: past int's
# range, or not finite, that is undefined on the host too (the GPU
# saturates; either way the taps fall out of bounds). Under .ci/sanitize.sh
# those points are left out.
UNCLIPPED_LIMIT = 2.0 ** 20
# A Half coordinate past about 2 * 65504 / size unnormalizes to infinity, whose
# flip count reflection converts to int: under .ci/sanitize.sh Half keeps
# coordinates below this.
HALF_REFLECTION_LIMIT = 2.0 ** 8
UNDER_SANITIZERS = os.environ.get("DETGRID_SANITIZERS") == "1"


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


def defined_on_the_host(grid, mode, padding):
    """The points of `grid` ((P, dims)) whose taps the host build forms as the
    GPU does: see FLIP_COUNT_LIMIT and UNCLIPPED_LIMIT."""
    dims = grid.shape[1]
    if dims == 3 and mode == ref.BICUBIC:
        return grid
    values = grid.double().abs()
    if padding == ref.REFLECTION:
        keep = values < FLIP_COUNT_LIMIT
        if not UNDER_SANITIZERS:
            keep |= ~values.isfinite()  # NaN flips: a NaN position, whatever their parity
        elif grid.dtype == torch.float16:
            keep &= values < HALF_REFLECTION_LIMIT
    elif padding == ref.ZEROS and UNDER_SANITIZERS:
        keep = values < UNCLIPPED_LIMIT  # False for NaN and infinities
    else:
        return grid
    return grid[keep.all(dim=1)]


def tap_weights_per_image(grid, size, mode, padding, align_corners):
    """The grad_input that one point per image with grad_output 1 makes, by
    stock_reference: each tap's weight (formed as the backward forms its term,
    in scalar_t) added where its tap lands, in the existing kernel's tap order
    in float, then rounded to the dtype; (P, 1, *size)."""
    positions, in_bounds, weights = ref.point_taps(grid, size, mode, padding, align_corners)
    dims = len(size)
    order = list(range(in_bounds.shape[1]))  # row-major, x fastest: nw, ne, sw, se
    if mode == ref.BICUBIC:
        # The term is (gOut * wx) * wy (* wz) in scalar_t: the product rounded
        # at every step, where the reference's weight is the plain product;
        # the taps go x offset outermost.
        weights = term_weights(grid, size, padding, align_corners)
        order.sort(key=lambda t: np.unravel_index(t, (4,) * dims)[::-1])
    want = np.zeros((len(grid), int(np.prod(size))), dtype=np.float32)
    flat = np.ravel_multi_index(tuple(np.moveaxis(np.where(in_bounds[..., None], positions, 0),
                                                  -1, 0)), size)
    for p in range(len(grid)):
        for t in order:
            if in_bounds[p, t]:
                want[p, flat[p, t]] = np.float32(want[p, flat[p, t]] + np.float32(weights[p, t]))
    return torch.from_numpy(want).to(grid.dtype).view(len(grid), 1, *size)


def term_weights(grid, size, padding, align_corners):
    """Bicubic tap weights as the backward's terms form them for grad_output 1:
    ((x coefficient * y coefficient) * z coefficient), rounded to scalar_t
    after each multiply; (P, taps), taps numbered as point_taps numbers them."""
    arith = ref._Arith(grid.dtype)
    dims = len(size)
    coords = grid.to(torch.float64).numpy()
    coefficients = [ref.axis_taps(arith, coords[:, dims - 1 - a].astype(arith.opmath),
                                  size[a], ref.BICUBIC, padding, align_corners,
                                  sized=dims == 3)[2] for a in range(dims)]
    weights = []
    for digits in np.ndindex(*(4,) * dims):
        weight = coefficients[dims - 1][:, digits[dims - 1]]
        for a in range(dims - 2, -1, -1):
            weight = arith.mul(weight, coefficients[a][:, digits[a]])
        weights.append(weight)
    return np.stack(weights, axis=1)


class TestGradientsFollowTheTaps(TestCase):
    @parametrize("dtype", [torch.float16, torch.bfloat16], name_fn=_dtype_name)
    @parametrize("dims", [2, 3])
    def test_grad_input_of_one_point_per_image_is_its_tap_weights(self, dims, dtype):
        # One output point per image and grad_output = 1: grad_input holds
        # the point's weights, summed where taps coincide (bicubic with
        # padding), in ascending tap order in float, then rounded to dtype.
        size = SIZES[dims]
        for mode, padding, align_corners in itertools.product(MODES, PADDINGS, (False, True)):
            what = f"{dims}-D {MODE_NAMES[mode]} {PADDING_NAMES[padding]} {align_corners}"
            grid = sample_grid(dims, size, dtype, points=100 if mode == ref.BICUBIC else 200)
            grid = defined_on_the_host(grid, mode, padding)
            n = len(grid)
            want = tap_weights_per_image(grid, size, mode, padding, align_corners)
            inp = torch.ones(n, 1, *size, dtype=dtype)
            grad_output = torch.ones(n, 1, *(1,) * dims, dtype=dtype)
            grad_input, _ = detgrid_backward(grad_output, inp, grid.view(n, *(1,) * dims, dims),
                                             mode, padding, align_corners,
                                             output_mask=(True, False))
            self.assertEqual(grad_input, want, atol=0, rtol=0, msg=what)

    @parametrize("dtype", [torch.float16, torch.bfloat16], name_fn=_dtype_name)
    def test_reduced_precision_taps_differ_from_float_ones(self, dtype):
        # The rounding is visible: computed in float throughout, many of the
        # same grid's taps or weights would differ. Guards the test above
        # against degenerating into the float computation.
        size = (8, 1024)
        grid = defined_on_the_host(sample_grid(2, size, dtype, points=600), ref.BILINEAR,
                                   ref.ZEROS)
        n = len(grid)
        grad_input, _ = detgrid_backward(torch.ones(n, 1, 1, 1, dtype=dtype),
                                         torch.ones(n, 1, *size, dtype=dtype),
                                         grid.view(n, 1, 1, 2), ref.BILINEAR, ref.ZEROS, False,
                                         output_mask=(True, False))
        in_float = tap_weights_per_image(grid.float(), size, ref.BILINEAR, ref.ZEROS, False)
        differ = (grad_input.float() != in_float).flatten(1).any(dim=1)
        self.assertGreater(int(differ.sum()), n // 10)

    def test_2d_bicubic_puts_a_non_finite_points_nan_terms_on_the_edge(self):
        # Stock pads a NaN tap position with ::max, which takes it to 0, and
        # +-Inf to the border: border puts the point's NaN terms on the first
        # or last column, reflection on the first (a NaN fold).
        H, W = 5, 7
        for padding, x, column in ((ref.BORDER, float("nan"), 0),
                                   (ref.BORDER, float("inf"), W - 1),
                                   (ref.BORDER, float("-inf"), 0),
                                   (ref.REFLECTION, float("nan"), 0),
                                   (ref.REFLECTION, float("inf"), 0)):
            if UNDER_SANITIZERS and padding == ref.REFLECTION:
                continue  # reflection converts a NaN flip count to int
            grid = torch.tensor([[[[x, 0.1]]]], dtype=torch.float64)
            grad_input, grad_grid = detgrid_backward(
                torch.ones(1, 1, 1, 1, dtype=torch.float64),
                torch.ones(1, 1, H, W, dtype=torch.float64), grid, ref.BICUBIC, padding, False)
            nan = grad_input[0, 0].isnan()
            what = f"{PADDING_NAMES[padding]} x={x}"
            self.assertEqual(nan.nonzero()[:, 1].unique().tolist(), [column], msg=what)
            self.assertEqual(int(nan.sum()), 4, msg=what)  # the four rows of y's taps
            self.assertEqual(int(grad_input[0, 0].nan_to_num().count_nonzero()), 0, msg=what)
            self.assertEqual(grad_grid.tolist(), [[[[0.0, 0.0]]]], msg=what)


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
    an addition), and so may the core's host build, which contracts as nvcc
    does; stock_reference's unnormalize does not contract. The float
    coordinate then differs by at most one float ulp before it is rounded to
    half or bfloat16, and for half and bfloat16 grid values the product is
    exact unless |coord| is small, so the rounded coordinate almost never
    moves: TestGradientsFollowTheTaps compares those dtypes bit for bit.
    Measured over every value of the dtype in [-1.1, 1.1] at widths 1..128
    and 200 random widths up to 8192 (about 10^7 pairs each): the float
    coordinate moved in 15,029 (half) and 4,402 (bfloat16) pairs, the rounded
    coordinate in 1 (half: one bilinear cell, no nearest tap) and 0
    (bfloat16)."""

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


instantiate_parametrized_tests(TestGridOnlyCallsAreStocks)
instantiate_parametrized_tests(TestGradientsFollowTheTaps)
instantiate_parametrized_tests(TestFmaContractionOfStockUnnormalize)
instantiate_parametrized_tests(TestHugeBicubicCoordinates)

if __name__ == "__main__":
    run_tests()
