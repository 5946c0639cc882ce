# Owner(s): ["module: nn"]
"""Hostile inputs: non-finite and huge grid coordinates, degenerate and empty
shapes, and invalid arguments. detgrid never crashes; it gives the
documented result or a clear error.

grad_input follows stock's CUDA kernel on a bad coordinate (the core calls
its coordinate helpers, GridSamplerDeterministic.cu): a NaN, infinite or
out-of-range coordinate is dropped by bilinear and nearest sampling
(safe_downgrade_to_int_range), save that border padding clamps an infinite or
huge one to the edge and reflection folds a huge finite one back; 2-D bicubic
pads each tap, so under border or reflection padding a point with a
non-finite coordinate puts NaN terms on an edge pixel, as stock does; a
tricubic (5-D bicubic) point with a non-finite coordinate has no tap. The
grid gradient of a point with a non-finite bicubic coordinate is 0
(GridGradient.cu).

Stock CPU grid_sampler crashes on NaN grids with border/reflection padding
(upstream #24823), so nothing here hands a NaN grid to stock.

Tests parametrized over SAMPLERS (or dims) cover grid_sampler_2d and
grid_sampler_3d; the 3-D subtests carry a "3d" suffix. The 3-D twins of the
shape and argument checks are in test_3d.py."""

import math
import os

import numpy as np
import torch
from torch.testing._internal.common_device_type import (
    dtypes,
    instantiate_device_type_tests,
    onlyCUDA,
)
from torch.testing._internal.common_utils import (
    parametrize,
    run_tests,
)

import stock_reference as ref
from detgrid import ops
from detgrid_testing import (
    DetgridTestCase,
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    BORDER,
    MODES,
    NEAREST,
    PADDINGS,
    REFLECTION,
    SAMPLERS,
    ZEROS,
    assert_bitwise_equal,
    bits,
    depth_sizes,
    detgrid_backward,
    dims_name,
    make_problem,
    make_zoom_problem,
    mode_name,
    padding_name,
    sampler_name,
    stock_backward,
)

INF = math.inf
NAN = math.nan
BAD_VALUES = (NAN, INF, -INF, 1e38, -1e38, 1e30, -1e30)
# Points (n, h, w) or (n, d, h, w) that get a bad coordinate, and which of
# x (0) / y (1) / z (2).
BAD_POINTS = {
    2: (((0, 1, 2), (0,)), ((1, 0, 3), (1,)), ((1, 2, 0), (0, 1))),
    3: (((0, 1, 0, 2), (0,)), ((1, 0, 1, 3), (1,)), ((1, 1, 2, 0), (2,)),
        ((0, 0, 2, 1), (0, 1, 2))),
}
# Launch shapes of the host build, (block_size, max_blocks): its own, and
# small blocks on a small grid.
LAUNCHES = ((0, 0), (32, 3))

# Under .ci/sanitize.sh (UBSan's float-cast-overflow), what converts a NaN, an
# infinite or an out-of-range float to int on the host is left out: stock's
# reflection helpers do so with the flip count of a non-finite or huge
# coordinate (reflect_coordinates; the GPU saturates), except in tricubic
# sampling, whose taps convert none.
UNDER_SANITIZERS = os.environ.get("DETGRID_SANITIZERS") == "1"


def _converts_out_of_range(dims, mode, padding, value):
    return (padding == REFLECTION and not (dims == 3 and mode == BICUBIC)
            and not (math.isfinite(value) and abs(value) < 2 ** 20))


def _value_name(value):
    return {NAN: "nan", INF: "inf", -INF: "neg_inf"}.get(
        value, ("neg_" if value < 0 else "") + f"{abs(value):.0e}".replace("+", ""))


def _unnormalized(value, size, align_corners, dtype):
    """The pixel coordinate of a grid value as stock's unnormalize forms it, in
    opmath (float32 for Half/BFloat16), one rounding per operation."""
    opmath = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.tensor(value, dtype=dtype).to(opmath)
    one, half = torch.tensor(1.0, dtype=opmath), torch.tensor(0.5, dtype=opmath)
    if align_corners:
        return (((g + one) * half) * (size - 1)).item()
    return (((g + one) * size - one) * half).item()


def _classify_axis(value, size, dims, mode, padding, align_corners, dtype):
    """What one bad coordinate makes of its point: "void" (the point adds
    nothing to grad_input and gets a zero grad_grid), "edge" (border padding
    clamps it to the image edge), "folded" (the point is kept as it is:
    reflection folds a huge finite coordinate back into the image, and bicubic
    sampling pads each tap of one, so that border puts its taps on the edge
    and reflection folds them) or "nan" (2-D bicubic, border or reflection: NaN
    coefficients on taps padded onto the image, as stock's; a zero grad_grid)."""
    coord = _unnormalized(value, size, align_corners, dtype)
    if mode == BICUBIC:
        if padding == ZEROS:
            return "void"  # every tap downgraded out of bounds, or beyond the image
        if not math.isfinite(coord):
            return "nan" if dims == 2 else "void"
        return "folded"
    if math.isnan(coord):
        return "void"
    if padding == BORDER:
        return "edge"
    if padding == REFLECTION and math.isfinite(coord):
        return "folded"
    return "void"


class TestNonFiniteCoordinates(DetgridTestCase):
    D, H, W = 4, 5, 6

    def _classify(self, value, axes, dims, mode, padding, align_corners, dtype):
        kinds = {_classify_axis(value, (self.W, self.H, self.D)[axis], dims, mode, padding,
                                align_corners, dtype) for axis in axes}
        for kind in ("void", "nan", "folded"):
            if kind in kinds:
                return kind
        return "edge"

    @dtypes(*ALL_DTYPES)
    @parametrize("value", BAD_VALUES, name_fn=_value_name)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_bad_coordinate_gives_documented_gradient(self, device, dtype, dims, mode,
                                                      padding, value):
        if UNDER_SANITIZERS and _converts_out_of_range(dims, mode, padding, value):
            self.skipTest("a reflection flip count past int's range")
        depth = depth_sizes(dims, self.D, 3)
        for align_corners in (False, True):
            grad_output, inp, grid = make_problem(
                2, 2, self.H, self.W, 3, 4, seed=13 + align_corners, **depth)
            bad_grid = grid.clone()
            # The expected result is that of a finite problem: void and nan
            # points carry no gradient there, edge points sit beyond the edge,
            # folded points are kept as they are.
            expected_grad_output = grad_output.clone()
            expected_grid = grid.clone()
            void_points, nan_points, kinds = [], [], []
            for point, axes in BAD_POINTS[dims]:
                # grad_output[n, :, h, w] (or [n, :, d, h, w]) of the point.
                channels = (point[0], slice(None), *point[1:])
                # Bad points carry a sizable gradient, so losing or keeping
                # them shows.
                grad_output[channels] = torch.tensor([1.5, -2.0])
                expected_grad_output[channels] = grad_output[channels]
                kind = self._classify(value, axes, dims, mode, padding, align_corners, dtype)
                kinds.append(kind)
                for axis in axes:
                    bad_grid[(*point, axis)] = value
                    if kind in ("edge", "folded"):
                        expected_grid[(*point, axis)] = (
                            value if kind == "folded" else math.copysign(2.0, value))
                if kind in ("void", "nan"):
                    expected_grad_output[channels] = 0
                    void_points.append(point)
                if kind == "nan":
                    nan_points.append(point)
            grad_output, inp, bad_grid, expected_grad_output, expected_grid = (
                t.to(device=device, dtype=dtype) for t in (
                    grad_output, inp, bad_grid, expected_grad_output, expected_grid))
            msg = f"align_corners={align_corners} points: {kinds}"

            grad_input, grad_grid = detgrid_backward(
                grad_output, inp, bad_grid, mode, padding, align_corners)
            self.assertTrue(grad_grid.isfinite().all(), msg)
            for point in void_points:
                self.assertTrue((grad_grid[point] == 0).all(),
                                f"{msg}: grad_grid at {point}: "
                                f"{grad_grid[point].tolist()}")
            # NaN exactly on the nan points' taps, which stock's helpers pad
            # onto the image (stock_reference models them).
            nan_taps = torch.zeros((2, *inp.shape[2:]), dtype=torch.bool)
            for point in nan_points:
                positions, in_bounds, weights = ref.point_taps(
                    bad_grid[point].cpu().view(1, dims), inp.shape[2:], mode, padding,
                    align_corners)
                self.assertTrue(in_bounds.all() and np.isnan(weights).all(), msg)
                for position in positions[0]:
                    nan_taps[(point[0], *position)] = True
            want_nan = nan_taps.unsqueeze(1).expand(inp.shape)
            self.assertTrue(torch.equal(grad_input.isnan().cpu(), want_nan), msg)
            if not nan_points:
                self.assertTrue(grad_input.isfinite().all(), msg)
            expected_input, expected_grid_grad = detgrid_backward(
                expected_grad_output, inp, expected_grid, mode, padding,
                align_corners)
            # Same bits as the finite problem but for the NaN taps: void
            # points add nothing to grad_input (their records would add +-0 to
            # a partial sum, and this problem has far fewer than 256 records per
            # pixel, so the partition cannot change either), edge points act as
            # if beyond the edge, other points' grid gradients are untouched.
            assert_bitwise_equal(self, grad_input.masked_fill(want_nan.to(device), 0),
                                 expected_input.masked_fill(want_nan.to(device), 0),
                                 f"{msg} grad_input")
            for point in void_points:
                expected_grid_grad[point] = grad_grid[point]
            assert_bitwise_equal(self, grad_grid, expected_grid_grad, f"{msg} grad_grid")
            if padding == REFLECTION and mode != BICUBIC:
                # Every non-void point is folded into the image, where its
                # weights sum to one: grad_input's total per channel is the
                # total gradient of the non-void points.
                tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
                spatial = tuple(range(2, 2 + dims))
                self.assertEqual(grad_input.double().sum(spatial),
                                 expected_grad_output.double().sum(spatial),
                                 rtol=tol, atol=tol, msg=msg)

    @dtypes(torch.float32, torch.bfloat16)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_void_points_leave_the_summation_order_alone(self, device, dtype, dims,
                                                         mode):
        # In a high-collision problem (runs longer than a partial), points
        # with non-finite coordinates must act exactly like points far outside
        # the image under zeros padding: neither has a record on any pixel, so
        # every pixel's order of terms is the same.
        if dims == 2:
            problem = make_zoom_problem(2, 2, 6, 7, 48, 48, dtype=dtype,
                                        device=device, seed=17)
        else:  # 2 * 4 * 24 * 24 points on a 4 x 5 x 6 volume
            problem = make_zoom_problem(2, 2, 5, 6, 24, 24, D=4, out_D=4,
                                        dtype=dtype, device=device, seed=17)
        grad_output, inp, grid = problem
        points_shape = grid.shape[:-1]
        gen = torch.Generator().manual_seed(0)
        chosen = torch.rand(points_shape, generator=gen) < 0.2
        values = torch.tensor([NAN, INF, -INF, 1e30])[
            torch.randint(0, 4, points_shape, generator=gen)]
        # The coordinate that goes bad: x in 2-D, any of x, y, z in 3-D.
        bad_axis = torch.randint(0, 1 if dims == 2 else dims, points_shape,
                                 generator=gen)
        bad = grid.clone()
        far = grid.clone()
        for axis in range(dims):
            on_axis = chosen & (bad_axis == axis)
            bad[..., axis][on_axis.to(device)] = values[on_axis].to(device=device,
                                                                    dtype=dtype)
            far[..., axis][on_axis.to(device)] = -5.0
        launches = LAUNCHES if device == "cpu" else ((0, 0),)
        for block_size, max_blocks in launches:
            shape = dict(block_size=block_size, max_blocks=max_blocks)
            assert_bitwise_equal(
                self,
                detgrid_backward(grad_output, inp, bad, mode, ZEROS, False, **shape)[0],
                detgrid_backward(grad_output, inp, far, mode, ZEROS, False, **shape)[0],
                f"grad_input {shape}")

    @dtypes(torch.float32, torch.float64)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_all_nan_grid_gives_zero_gradients_but_2d_bicubics_edge(self, device, dtype,
                                                                    dims, mode, padding):
        # Every point void; but 2-D bicubic under border or reflection padding
        # puts every point's 16 taps on pixel (0, 0), as stock does: NaN there.
        if UNDER_SANITIZERS and _converts_out_of_range(dims, mode, padding, NAN):
            self.skipTest("a reflection flip count of NaN")
        depth = depth_sizes(dims, 3, 2)
        grad_output, inp, grid = make_problem(2, 3, 4, 5, 6, 7, dtype=dtype,
                                              device=device, **depth)
        grid = torch.full_like(grid, NAN)
        grad_input, grad_grid = detgrid_backward(grad_output, inp, grid, mode, padding,
                                                 False)
        expected = torch.zeros_like(inp)
        if (dims, mode) == (2, BICUBIC) and padding != ZEROS:
            expected[..., 0, 0] = NAN
        self.assertTrue(torch.equal(bits(grad_input.nan_to_num(nan=7.0)),
                                    bits(expected.nan_to_num(nan=7.0))))
        self.assertTrue(torch.equal(grad_input.isnan(), expected.isnan()))
        self.assertTrue((grad_grid == 0).all())

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_non_finite_grad_output_reaches_grad_input_like_stock(self, device, dims,
                                                                  mode):
        # Not a coordinate problem: an Inf/NaN gradient flows through the
        # weights into grad_input as in stock (finite grid: stock is safe).
        depth = depth_sizes(dims, 3, 2)
        grad_output, inp, grid = make_problem(1, 2, 4, 5, 3, 3, device=device, **depth)
        grad_output[0, 0, ..., 1, 1] = INF
        grad_output[0, 1, ..., 2, 2] = NAN
        grad_input, _ = detgrid_backward(grad_output, inp, grid, mode, ZEROS, False)
        expected, _ = stock_backward(grad_output, inp, grid, mode, ZEROS, False)
        self.assertEqual(grad_input.isnan(), expected.isnan())
        self.assertEqual(grad_input.isinf(), expected.isinf())
        self.assertEqual(grad_input, expected, rtol=1e-12, atol=1e-12, equal_nan=True)

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_nearest_grad_grid_is_zero_even_for_non_finite_grad_output(self, device,
                                                                       dims):
        # Nearest sampling is piecewise constant in the grid: stock returns
        # an all-zero grid gradient, whatever grad_output holds.
        depth = depth_sizes(dims, 3, 2)
        grad_output, inp, grid = make_problem(1, 2, 4, 5, 3, 3, device=device, **depth)
        grad_output[0, 0, ..., 1, 1] = INF
        grad_output[0, 1, ..., 2, 2] = NAN
        _, expected = stock_backward(grad_output, inp, grid, NEAREST, ZEROS, False)
        self.assertEqual(expected, torch.zeros_like(grid), atol=0, rtol=0)
        _, grad_grid = detgrid_backward(grad_output, inp, grid, NEAREST, ZEROS, False)
        self.assertEqual(grad_grid, torch.zeros_like(grid), atol=0, rtol=0)


class TestDegenerateShapes(DetgridTestCase):

    @parametrize("size", ((1, 1), (1, 6), (6, 1)), name_fn=lambda s: "%dx%d" % s)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_single_pixel_rows_and_columns_match_stock(self, device, mode, padding, size):
        H, W = size
        for align_corners in (False, True):
            args = make_problem(2, 2, H, W, 3, 4, device=device, seed=H * 7 + W,
                                grid_range=3.0)
            grad_input, grad_grid = detgrid_backward(*args, mode, padding, align_corners)
            ref_input, ref_grid = stock_backward(*args, mode, padding, align_corners)
            msg = f"align_corners={align_corners}"
            self.assertEqual(grad_input, ref_input, rtol=1e-12, atol=1e-12, msg=msg)
            self.assertEqual(grad_grid, ref_grid, rtol=1e-12, atol=1e-12, msg=msg)
            if align_corners:
                # A size-1 axis maps every grid coordinate to pixel 0: the
                # grid gradient along it is zero (reflection's special case
                # included).
                for axis, extent in ((0, W), (1, H)):
                    if extent == 1:
                        self.assertTrue((grad_grid[..., axis] == 0).all(), msg)

    @dtypes(*ALL_DTYPES)
    @parametrize("empty", ("N", "C", "H_out", "W_out"))
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_empty_dimension_gives_zero_gradients_of_right_shape(self, device, dtype,
                                                               mode, empty):
        sizes = dict(N=2, C=3, H=4, W=5, out_H=6, out_W=7)
        sizes[{"N": "N", "C": "C", "H_out": "out_H", "W_out": "out_W"}[empty]] = 0
        grad_output, inp, grid = make_problem(**sizes, dtype=dtype, device=device)
        grad_input, grad_grid = detgrid_backward(grad_output, inp, grid, mode, REFLECTION,
                                                 False)
        self.assertEqual(grad_input.shape, inp.shape)
        self.assertEqual(grad_grid.shape, grid.shape)
        self.assertEqual(grad_input.dtype, dtype)
        self.assertEqual(grad_grid.dtype, dtype)
        self.assertEqual(grad_input, torch.zeros_like(inp), atol=0, rtol=0)
        self.assertEqual(grad_grid, torch.zeros_like(grid), atol=0, rtol=0)

    @parametrize("output_mask", ((True, False), (False, True)),
                 name_fn=lambda m: "input%d_grid%d" % m)
    def test_empty_batch_respects_output_mask(self, device, output_mask):
        args = make_problem(0, 3, 4, 5, 6, 7, device=device)
        grads = detgrid_backward(*args, BILINEAR, ZEROS, False, output_mask)
        for requested, grad, like in zip(output_mask, grads, args[1:]):
            if requested:
                self.assertEqual(grad.shape, like.shape)
            else:
                self.assertIsNone(grad)


class TestInvalidArguments(DetgridTestCase):

    def _args(self, device, dtype=torch.float32):
        return list(make_problem(2, 3, 5, 6, 4, 7, dtype=dtype, device=device))

    def _first_line(self, error_type, *args, **options):
        with self.assertRaises(error_type) as ctx:
            detgrid_backward(*args, **options)
        return str(ctx.exception).splitlines()[0]

    def test_input_and_grid_must_be_4d(self, device):
        grad_output, inp, grid = self._args(device)
        # 5-D input and grid that pass the common checks (a 3-D grid).
        grid = torch.zeros(2, 1, 4, 7, 3, dtype=grid.dtype, device=device)
        message = self._first_line(
            RuntimeError, grad_output, inp.unsqueeze(2), grid, BILINEAR, ZEROS, False,
            dims=2)
        self.assertExpectedInline(message, """grid_sampler(): expected 4D input and grid with same number of dimensions, but got input with sizes [2, 3, 1, 5, 6] and grid with sizes [2, 1, 4, 7, 3]""")  # noqa: B950

    def test_input_and_grid_must_have_same_number_of_dims(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid.unsqueeze(1),
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler(): expected 4D input and grid with same number of dimensions, but got input with sizes [2, 3, 5, 6] and grid with sizes [2, 1, 4, 7, 2]""")  # noqa: B950

    def test_grid_last_dimension_must_be_2(self, device):
        grad_output, inp, grid = self._args(device)
        grid = torch.cat((grid, grid[..., :1]), dim=-1)
        message = self._first_line(RuntimeError, grad_output, inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler(): expected grid to have size 2 in last dimension, but got grid with sizes [2, 4, 7, 3]""")  # noqa: B950

    def test_input_spatial_dimensions_must_be_non_empty(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp[:, :, :0], grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes [2, 3, 0, 6] with dimension 2 being empty""")  # noqa: B950

    def test_batch_sizes_must_match(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid[:1],
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler(): expected grid and input to have same batch size, but got input with sizes [2, 3, 5, 6] and grid with sizes [1, 4, 7, 2]""")  # noqa: B950

    def test_integer_grid_is_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid.int(),
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): expected input, grid and grad_output to have the same dtype, but got Float, Int and Float""")  # noqa: B950

    def test_grid_dtype_must_match_input(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid.double(),
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): expected input, grid and grad_output to have the same dtype, but got Float, Double and Float""")  # noqa: B950

    def test_grad_output_dtype_must_match_input(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output.half(), inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): expected input, grid and grad_output to have the same dtype, but got Float, Float and Half""")  # noqa: B950

    def test_integer_tensors_are_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output.long(), inp.long(),
                                   grid.long(), BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): expected a floating-point input, but got Long""")  # noqa: B950

    def test_grad_output_must_have_the_output_shape(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output[..., :6], inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): expected grad_output to have sizes [2, 3, 4, 7] but got grad_output with sizes [2, 3, 4, 6]""")  # noqa: B950

    def test_grad_output_must_be_4d(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output[0], inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): expected grad_output to have sizes [2, 3, 4, 7] but got grad_output with sizes [3, 4, 7]""")  # noqa: B950

    @parametrize("mode", (3, -1, 1 << 40))
    def test_interpolation_mode_must_be_known(self, device, mode):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid, mode,
                                   ZEROS, False)
        self.assertEqual(
            message,
            "grid_sampler_2d_backward(): interpolation_mode must be 0 (bilinear), "
            f"1 (nearest) or 2 (bicubic), but got {mode}")

    def test_interpolation_mode_message(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid, 3, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), but got 3""")  # noqa: B950

    @parametrize("padding", (3, -1))
    def test_padding_mode_must_be_known(self, device, padding):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid, BILINEAR,
                                   padding, False)
        self.assertEqual(
            message,
            "grid_sampler_2d_backward(): padding_mode must be 0 (zeros), 1 (border) "
            f"or 2 (reflection), but got {padding}")

    def test_padding_mode_message(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid, BILINEAR, 3, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), but got 3""")  # noqa: B950

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_modes_by_name_give_the_bits_of_their_numbers(self, device, dims):
        args = make_problem(2, 3, 5, 6, 4, 7, device=device, seed=5,
                            **depth_sizes(dims, 3, 2))
        by_number = detgrid_backward(*args, BICUBIC, REFLECTION, False)
        by_name = detgrid_backward(*args, "bicubic", "reflection", False)
        assert_bitwise_equal(self, by_name[0], by_number[0], "grad_input")
        assert_bitwise_equal(self, by_name[1], by_number[1], "grad_grid")

    def test_unknown_interpolation_mode_name_message(self, device):
        message = self._first_line(RuntimeError, *self._args(device), "linear", ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): interpolation_mode must be a number or a name in detgrid.ops.INTERPOLATION_MODES (bilinear, nearest, bicubic), but got 'linear'""")  # noqa: B950

    def test_unknown_padding_mode_name_message(self, device):
        message = self._first_line(RuntimeError, *self._args(device), BILINEAR, "zero", False)
        self.assertExpectedInline(message, """grid_sampler_2d_backward(): padding_mode must be a number or a name in detgrid.ops.PADDING_MODES (zeros, border, reflection), but got 'zero'""")  # noqa: B950

    @parametrize("output_mask", ((True, True, True), (True,), (1, 0), "tt", None),
                 name_fn=lambda m: f"{type(m).__name__}{len(m) if m else ''}")
    def test_malformed_output_mask_is_refused_in_one_line(self, device, output_mask):
        with self.assertRaises(RuntimeError) as ctx:
            ops.grid_sampler_2d_backward(*self._args(device), BILINEAR, ZEROS, False,
                                         output_mask)
        self.assertEqual(
            str(ctx.exception),
            "grid_sampler_2d_backward(): output_mask must be two bools (grad_input, "
            f"grad_grid), but got {output_mask!r}")

    def test_sparse_grad_output_is_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        with self.assertRaises((RuntimeError, NotImplementedError)):
            detgrid_backward(grad_output.to_sparse(), inp, grid, BILINEAR, ZEROS, False)

    @parametrize("option", ("block_size", "max_blocks"))
    def test_negative_launch_shape_is_refused(self, device, option):
        if device != "cpu":
            self.skipTest("a launch shape is the host build's")
        message = self._first_line(RuntimeError, *self._args(device), BILINEAR, ZEROS, False,
                                   **{option: -1})
        got = {"block_size": "-1, 0, 0", "max_blocks": "0, -1, 0"}[option]
        self.assertEqual(message, "core: block_size, grid_size and shuffle_seed must be 0 "
                                  f"or positive, got {got}")

    def test_unknown_level_is_refused(self, device):
        message = self._first_line(ValueError, *self._args(device), BILINEAR, ZEROS, False,
                                   level="fast")
        self.assertExpectedInline(message, """grid_sampler_2d_backward_with_options(): unknown level 'fast'; the levels are core, grouped-channels""")  # noqa: B950

    @onlyCUDA
    @parametrize("option", ("block_size", "max_blocks"))
    def test_cuda_launch_shape_is_refused(self, device, option):
        message = self._first_line(RuntimeError, *self._args(device), BILINEAR, ZEROS, False,
                                   **{option: 64})
        self.assertEqual(message, "core: block_size, grid_size and shuffle_seed shape the "
                                  "host build's launches only")

    @onlyCUDA
    def test_cuda_grid_on_another_device_is_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        with self.assertRaisesRegex(RuntimeError, "grid_sampler.*device"):
            detgrid_backward(grad_output, inp, grid.cpu(), BILINEAR, ZEROS, False)

    @onlyCUDA
    def test_cuda_grad_output_on_another_device_is_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        with self.assertRaisesRegex(
                RuntimeError,
                r"^grid_sampler_2d_backward\(\): expected grad_output and input to be on "
                r"the same device, but grad_output is on cpu and input is on cuda"):
            detgrid_backward(grad_output.cpu(), inp, grid, BILINEAR, ZEROS, False)


instantiate_device_type_tests(TestNonFiniteCoordinates, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestDegenerateShapes, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestInvalidArguments, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
