# Owner(s): ["module: nn"]
"""What only grid_sampler_3d has: detgrid's 3-D backward (input
(N, C, D, H, W), grid (N, D', H', W', 3) in x, y, z order, trilinear,
nearest or tricubic) on volumes with size-1 and empty axes, on random 3-D problems, and
with the arguments only the 3-D op can get wrong.

Everything 3-D shares with 2-D is tested beside its 2-D twin, by the tests
parametrized over SAMPLERS or dims (subtests with a "3d" suffix):
agreement with stock over mode x padding x align_corners x dtype x layout x
output_mask and gradcheck (test_agreement.py); bitwise reproducibility over
runs, threads, the host build's launch shapes, the core's builds, layouts,
CUDA == host build, and the numpy reference of the core's summation order
(test_bitwise.py); non-finite coordinates (test_bad_input.py); the switch
(test_switch.py)."""

import hypothesis
import hypothesis.strategies as st
import torch
from torch.testing._internal.common_device_type import (
    dtypes,
    instantiate_device_type_tests,
    onlyCPU,
    onlyCUDA,
)
from torch.testing._internal.common_utils import (
    parametrize,
    run_tests,
)

from detgrid import levels
from detgrid_testing import (
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    MODES_3D,
    PADDINGS,
    REFLECTION,
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


def _assert_close_to_stock(test, got, expected, msg=""):
    """float64 agreement; atol scales with the largest element, which
    bounds the rounding error of an element that cancels to ~0."""
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    test.assertEqual(got.cpu(), expected.cpu(), rtol=1e-12, atol=1e-12 * scale, msg=msg)


class TestShapes3d(DetgridTestCase):

    @parametrize("size", ((1, 1, 1), (1, 1, 6), (1, 6, 1), (6, 1, 1)),
                 name_fn=lambda s: "%dx%dx%d" % s)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("mode", MODES_3D, name_fn=mode_name)
    def test_single_voxel_lines_match_stock(self, device, mode, padding, size):
        D, H, W = size
        for align_corners in (False, True):
            args = make_problem(2, 2, H, W, 3, 4, D=D, out_D=2, device=device,
                                seed=D * 49 + H * 7 + W, grid_range=3.0)
            grad_input, grad_grid = detgrid_backward(*args, mode, padding, align_corners)
            ref_input, ref_grid = stock_backward(*args, mode, padding, align_corners)
            msg = f"align_corners={align_corners}"
            _assert_close_to_stock(self, grad_input, ref_input, msg)
            _assert_close_to_stock(self, grad_grid, ref_grid, msg)
            if align_corners and mode == BILINEAR:
                # A size-1 axis maps every grid coordinate to voxel 0: the
                # grid gradient along it is zero; along the others it is not.
                for axis, extent in enumerate((W, H, D)):
                    along = grad_grid[..., axis]
                    self.assertEqual((along == 0).all().item(), extent == 1,
                                     f"{msg} axis {axis}")

    @dtypes(*ALL_DTYPES)
    @parametrize("empty", ("N", "C", "D_out", "H_out", "W_out"))
    @parametrize("mode", MODES_3D, name_fn=mode_name)
    def test_empty_dimension_gives_zero_gradients_of_right_shape(
            self, device, dtype, mode, empty):
        sizes = dict(N=2, C=3, D=2, H=4, W=5, out_D=3, out_H=6, out_W=7)
        sizes[{"N": "N", "C": "C", "D_out": "out_D", "H_out": "out_H",
               "W_out": "out_W"}[empty]] = 0
        grad_output, inp, grid = make_problem(**sizes, dtype=dtype, device=device)
        # The default backward, and each build of the core.
        for options in ({}, *({"level": level} for level in levels.CORE_BUILDS)):
            grad_input, grad_grid = detgrid_backward(
                grad_output, inp, grid, mode, REFLECTION, False, **options)
            self.assertEqual(grad_input.shape, inp.shape)
            self.assertEqual(grad_grid.shape, grid.shape)
            self.assertEqual(grad_input.dtype, dtype)
            self.assertEqual(grad_grid.dtype, dtype)
            self.assertEqual(grad_input, torch.zeros_like(inp), atol=0, rtol=0)
            self.assertEqual(grad_grid, torch.zeros_like(grid), atol=0, rtol=0)

    @parametrize("output_mask", ((True, False), (False, True)),
                 name_fn=lambda m: "input%d_grid%d" % m)
    def test_empty_batch_respects_output_mask(self, device, output_mask):
        args = make_problem(0, 3, 4, 5, 6, 7, D=2, out_D=3, device=device)
        grads = detgrid_backward(*args, BILINEAR, ZEROS, False, output_mask)
        for requested, grad, like in zip(output_mask, grads, args[1:]):
            if requested:
                self.assertEqual(grad.shape, like.shape)
            else:
                self.assertIsNone(grad)

    @parametrize("align_corners", (False, True))
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    def test_tricubic_of_a_depth_constant_volume_is_stock_bicubic(
            self, device, padding, align_corners):
        # Tricubic sampling is separable. On a volume constant along depth,
        # with every depth tap inside it, the depth weights sum to one and
        # their derivatives to zero: summed over depth, grad_input is stock's
        # 2-D bicubic grad_input; grad_grid is stock's in x, y and zero in z.
        # This holds on every torch, with or without a stock 5-D bicubic.
        depth = 7
        grad_output, inp, grid = make_problem(2, 3, 6, 5, 4, 6, device=device, seed=7)
        gen = torch.Generator().manual_seed(8)
        z_pixel = 1.2 + torch.rand(grid.shape[:-1], generator=gen, dtype=torch.float64) * (depth - 4.4)
        z = (z_pixel * 2 / (depth - 1) - 1) if align_corners else ((2 * z_pixel + 1) / depth - 1)
        grid_3d = torch.cat((grid, z.to(grid).unsqueeze(-1)), dim=-1).unsqueeze(1)
        inp_3d = inp.unsqueeze(2).expand(-1, -1, depth, -1, -1).contiguous()
        grad_input, grad_grid = detgrid_backward(
            grad_output.unsqueeze(2), inp_3d, grid_3d, BICUBIC, padding, align_corners)
        expected_input, expected_grid = stock_backward(
            grad_output, inp, grid, BICUBIC, padding, align_corners)
        _assert_close_to_stock(self, grad_input.sum(2), expected_input)
        _assert_close_to_stock(self, grad_grid[:, 0, ..., :2], expected_grid)
        _assert_close_to_stock(self, grad_grid[..., 2], torch.zeros_like(grad_grid[..., 2]))

    def test_trilinear_weights_of_a_point_sum_to_one(self, device):
        # Inside the volume, a point's 8 trilinear weights sum to one: with a
        # unit grad_output, grad_input sums to the number of points per
        # channel. (A 2-D bilinear product over 4 taps would miss half.)
        grad_output, inp, grid = make_problem(2, 2, 5, 6, 3, 4, D=4, out_D=2,
                                              device=device, seed=4, grid_range=0.6)
        ones = torch.ones_like(grad_output)
        grad_input, _ = detgrid_backward(ones, inp, grid, BILINEAR, ZEROS, True)
        points = grid[..., 0].numel() // grid.shape[0]
        self.assertEqual(grad_input.sum((2, 3, 4)),
                         torch.full((2, 2), float(points), dtype=grad_input.dtype,
                                    device=device), rtol=1e-12, atol=1e-12)

    @hypothesis.settings(max_examples=30, deadline=None, derandomize=True)
    @hypothesis.given(
        batch=st.integers(0, 2), channels=st.integers(0, 3),
        in_d=st.integers(1, 5), in_h=st.integers(1, 5), in_w=st.integers(1, 5),
        out_d=st.integers(0, 4), out_h=st.integers(0, 4), out_w=st.integers(0, 4),
        mode=st.sampled_from(MODES_3D), padding=st.sampled_from(PADDINGS),
        align_corners=st.booleans(), grid_range=st.sampled_from((0.5, 1.0, 2.5, 40.0)),
        seed=st.integers(0, 2**16))
    def test_gradients_match_stock_on_random_3d_shapes(
            self, device, batch, channels, in_d, in_h, in_w, out_d, out_h, out_w,
            mode, padding, align_corners, grid_range, seed):
        args = make_problem(batch, channels, in_h, in_w, out_h, out_w, D=in_d,
                            out_D=out_d, device=device, seed=seed,
                            grid_range=grid_range)
        grad_input, grad_grid = detgrid_backward(*args, mode, padding, align_corners)
        ref_input, ref_grid = stock_backward(*args, mode, padding, align_corners)
        _assert_close_to_stock(self, grad_input, ref_input, "grad_input")
        _assert_close_to_stock(self, grad_grid, ref_grid, "grad_grid")

    @onlyCPU
    @hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
    @hypothesis.given(
        batch=st.integers(1, 2), channels=st.integers(1, 3),
        in_d=st.integers(1, 6), in_h=st.integers(1, 6), in_w=st.integers(1, 6),
        out_d=st.integers(1, 8), out_h=st.integers(1, 24), out_w=st.integers(1, 24),
        mode=st.sampled_from(MODES_3D), padding=st.sampled_from(PADDINGS),
        align_corners=st.booleans(), zoom=st.booleans(),
        dtype=st.sampled_from((torch.float32, torch.bfloat16)),
        seed=st.integers(0, 2**16))
    def test_builds_and_launch_shapes_never_change_bits_on_random_3d_problems(
            self, device, batch, channels, in_d, in_h, in_w, out_d, out_h, out_w,
            mode, padding, align_corners, zoom, dtype, seed):
        sizes = dict(D=in_d, out_D=out_d, dtype=dtype, device=device, seed=seed)
        if zoom and min(in_d, in_h, in_w) > 2:
            args = make_zoom_problem(batch, channels, in_h, in_w, out_h, out_w,
                                     align_corners=align_corners, **sizes)
        else:
            args = make_problem(batch, channels, in_h, in_w, out_h, out_w, **sizes)
        default = detgrid_backward(*args, mode, padding, align_corners)
        for options in ({"level": levels.CORE}, {"block_size": 32, "max_blocks": 3},
                        {"level": levels.CORE, "block_size": 1, "max_blocks": 7}):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, padding, align_corners, **options),
                default, str(options))


class TestInvalidArguments3d(DetgridTestCase):
    """The 3-D op's checks and their messages. Where stock checks the same
    thing, the message is stock's (asserted)."""

    def _args(self, device, dtype=torch.float32):
        # input (2, 3, 3, 5, 6), grid (2, 2, 4, 7, 3), grad_output (2, 3, 2, 4, 7)
        return list(make_problem(2, 3, 5, 6, 4, 7, D=3, out_D=2, dtype=dtype,
                                 device=device))

    def _first_line(self, error_type, *args, **options):
        with self.assertRaises(error_type) as ctx:
            detgrid_backward(*args, **options)
        return str(ctx.exception).splitlines()[0]

    def _stock_first_line(self, *args, dims=None):
        with self.assertRaises(RuntimeError) as ctx:
            stock_backward(*args, dims=dims)
        return str(ctx.exception).splitlines()[0]

    def _assert_stock_says(self, message, *args, dims=None):
        self.assertEqual(message, self._stock_first_line(*args, dims=dims))

    @parametrize("mode", (3, -1), name_fn=lambda m: f"mode{m}".replace("-", "neg"))
    def test_interpolation_mode_must_be_bilinear_nearest_or_bicubic(self, device, mode):
        # Stock's 3-D CPU kernel takes mode 3 silently; detgrid names the
        # modes the 3-D op has.
        args = self._args(device)
        message = self._first_line(RuntimeError, *args, mode, ZEROS, False)
        self.assertEqual(
            message,
            "grid_sampler_3d_backward(): interpolation_mode must be 0 (bilinear), "
            f"1 (nearest) or 2 (bicubic), but got {mode}")

    def test_interpolation_mode_message(self, device):
        args = self._args(device)
        message = self._first_line(RuntimeError, *args, 3, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 (bicubic), but got 3""")  # noqa: B950

    def test_padding_mode_message(self, device):
        args = self._args(device)
        message = self._first_line(RuntimeError, *args, BILINEAR, 3, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), but got 3""")  # noqa: B950

    def test_4d_input_and_grid_are_rejected_by_the_3d_op(self, device):
        grad_output, inp, grid = self._args(device)
        args = (grad_output[:, :, 0], inp[:, :, 0], grid[:, 0, ..., :2],
                BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args, dims=3)
        self.assertExpectedInline(message, """grid_sampler(): expected 5D input and grid with same number of dimensions, but got input with sizes [2, 3, 5, 6] and grid with sizes [2, 4, 7, 2]""")  # noqa: B950
        self._assert_stock_says(message, *args, dims=3)

    def test_5d_input_and_grid_are_rejected_by_the_2d_op(self, device):
        args = (*self._args(device), BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args, dims=2)
        self.assertExpectedInline(message, """grid_sampler(): expected 4D input and grid with same number of dimensions, but got input with sizes [2, 3, 3, 5, 6] and grid with sizes [2, 2, 4, 7, 3]""")  # noqa: B950
        self._assert_stock_says(message, *args, dims=2)

    def test_4d_input_with_a_3d_grid_is_rejected_by_the_3d_op(self, device):
        grad_output, inp, grid = self._args(device)
        args = (grad_output, inp[:, :, 0], grid, BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args, dims=3)
        self.assertExpectedInline(message, """grid_sampler(): expected grid to have size 2 in last dimension, but got grid with sizes [2, 2, 4, 7, 3]""")  # noqa: B950
        self._assert_stock_says(message, *args, dims=3)

    def test_input_and_grid_must_have_same_number_of_dims(self, device):
        grad_output, inp, grid = self._args(device)
        args = (grad_output, inp, grid[:, 0], BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args)
        self.assertExpectedInline(message, """grid_sampler(): expected 5D input and grid with same number of dimensions, but got input with sizes [2, 3, 3, 5, 6] and grid with sizes [2, 4, 7, 3]""")  # noqa: B950
        self._assert_stock_says(message, *args)

    def test_grid_last_dimension_must_be_3(self, device):
        grad_output, inp, grid = self._args(device)
        args = (grad_output, inp, grid[..., :2], BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args)
        self.assertExpectedInline(message, """grid_sampler(): expected grid to have size 3 in last dimension, but got grid with sizes [2, 2, 4, 7, 2]""")  # noqa: B950
        self._assert_stock_says(message, *args)

    def test_input_spatial_dimensions_must_be_non_empty(self, device):
        grad_output, inp, grid = self._args(device)
        args = (grad_output, inp[:, :, :0], grid, BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args)
        self.assertExpectedInline(message, """grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes [2, 3, 0, 5, 6] with dimension 2 being empty""")  # noqa: B950
        self._assert_stock_says(message, *args)

    def test_batch_sizes_must_match(self, device):
        grad_output, inp, grid = self._args(device)
        args = (grad_output, inp, grid[:1], BILINEAR, ZEROS, False)
        message = self._first_line(RuntimeError, *args)
        self.assertExpectedInline(message, """grid_sampler(): expected grid and input to have same batch size, but got input with sizes [2, 3, 3, 5, 6] and grid with sizes [1, 2, 4, 7, 3]""")  # noqa: B950
        self._assert_stock_says(message, *args)

    def test_grid_dtype_must_match_input(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output, inp, grid.double(),
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): expected input, grid and grad_output to have the same dtype, but got Float, Double and Float""")  # noqa: B950

    def test_grad_output_dtype_must_match_input(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output.half(), inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): expected input, grid and grad_output to have the same dtype, but got Float, Float and Half""")  # noqa: B950

    def test_integer_tensors_are_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output.long(), inp.long(),
                                   grid.long(), BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): expected a floating-point input, but got Long""")  # noqa: B950

    def test_grad_output_must_have_the_output_width(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output[..., :6], inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): expected grad_output to have sizes [2, 3, 2, 4, 7] but got grad_output with sizes [2, 3, 2, 4, 6]""")  # noqa: B950

    def test_grad_output_must_have_the_output_depth(self, device):
        # Stock accepts this and reads past the end of grad_output's depth.
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output[:, :, :1], inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): expected grad_output to have sizes [2, 3, 2, 4, 7] but got grad_output with sizes [2, 3, 1, 4, 7]""")  # noqa: B950

    def test_grad_output_must_be_5d(self, device):
        grad_output, inp, grid = self._args(device)
        message = self._first_line(RuntimeError, grad_output[:, :, 0], inp, grid,
                                   BILINEAR, ZEROS, False)
        self.assertExpectedInline(message, """grid_sampler_3d_backward(): expected grad_output to have sizes [2, 3, 2, 4, 7] but got grad_output with sizes [2, 3, 4, 7]""")  # noqa: B950

    def test_sparse_grad_output_is_rejected(self, device):
        grad_output, inp, grid = self._args(device)
        with self.assertRaises((RuntimeError, NotImplementedError)):
            detgrid_backward(grad_output.to_sparse(), inp, grid, BILINEAR, ZEROS, False)

    @onlyCPU
    def test_negative_launch_shape_message(self, device):
        # The host build's launch shape (block_size, max_blocks) is 0 (its own) or positive.
        args = self._args(device)
        message = self._first_line(RuntimeError, *args, BILINEAR, ZEROS, False,
                                   block_size=-32)
        self.assertExpectedInline(message, """core: block_size, grid_size and shuffle_seed must be 0 or positive, got -32, 0, 0""")  # noqa: B950

    @onlyCUDA
    @parametrize("shape", ({"block_size": 128}, {"max_blocks": 3}),
                 name_fn=lambda shape: next(iter(shape)))
    def test_cuda_launch_shape_is_refused(self, device, shape):
        # The CUDA build launches with the kernels' own shapes.
        args = self._args(device)
        message = self._first_line(RuntimeError, *args, BILINEAR, ZEROS, False, **shape)
        self.assertExpectedInline(message, """core: block_size, grid_size and shuffle_seed shape the host build's launches only""")  # noqa: B950

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
                r"^grid_sampler_3d_backward\(\): expected grad_output and input to be on "
                r"the same device, but grad_output is on cpu and input is on cuda"):
            detgrid_backward(grad_output.cpu(), inp, grid, BILINEAR, ZEROS, False)


instantiate_device_type_tests(TestShapes3d, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestInvalidArguments3d, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
