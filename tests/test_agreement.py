# Owner(s): ["module: nn"]
"""detgrid's backward computes the same gradients as stock
aten::grid_sampler_2d_backward and aten::grid_sampler_3d_backward (up to
rounding), over every mode, padding, align_corners, dtype, memory layout and
output mask, and its gradients are the true derivatives of grid_sample
(gradcheck).

Tests parametrized over SAMPLERS run for every (spatial dims, mode) pair
grid_sample supports; the 3-D subtests carry a "_3d" suffix.

On CPU this exercises the core's host build, on CUDA its nvcc build."""

import itertools

import hypothesis
import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from torch.testing._internal.common_device_type import (
    dtypes,
    instantiate_device_type_tests,
    onlyCPU,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import (
    DeterministicGuard,
    parametrize,
    run_tests,
)
from torch.testing._internal.opinfo.core import SampleInput

import detgrid
import stock_reference
from detgrid_testing import (
    DetgridTestCase,
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    MODES,
    NEAREST,
    PADDINGS,
    REDUCED_DTYPES,
    REFLECTION,
    SAMPLERS,
    STOCK_HAS_TRICUBIC,
    ZEROS,
    DetGridSample,
    assert_bitwise_equal,
    depth_sizes,
    detgrid_backward,
    dims_name,
    expanded,
    hard_grid,
    make_problem,
    padding_name,
    sampler_name,
    smooth_grid,
    stock_backward,
    assert_within_rounding_of_exact,
    stock_cpu_backward_is_reliable,
    strided_like,
)

LAYOUTS = (
    "contiguous",
    "channels_last_input",
    "noncontiguous_grid",
    "expanded_grad_output",
    "all_strided",
)
MASKS = ((True, True), (True, False), (False, True))


def _tolerances(dtype, reference):
    """(rtol, atol) of detgrid against the reference. atol scales with the
    largest reference element: an element that cancels to ~0 carries the
    rounding error of its largest terms."""
    scale = max(1.0, reference.abs().max().item()) if reference.numel() else 1.0
    if dtype == torch.float64:
        return 1e-12, 1e-12 * scale
    assert dtype == torch.float32, "Half/BFloat16 grad_input: reduced_precision_error_bound"
    return 1e-5, 1e-5 * scale


def _apply_layout(layout, grad_output, inp, grid):
    if layout in ("channels_last_input", "all_strided"):
        inp = strided_like(inp, "channels_last")
    if layout in ("noncontiguous_grid", "all_strided"):
        grid = strided_like(grid, "transposed")
    if layout == "expanded_grad_output":
        grad_output = expanded(0.75, grad_output.shape, grad_output.dtype,
                               grad_output.device)
    if layout == "all_strided":
        grad_output = strided_like(grad_output, "channels_last")
    return grad_output, inp, grid


def _hard_problem(mode, align_corners, dtype, device, seed=0, dims=2):
    # Sizes that make the normalization exact (see hard_grid).
    H, W = (5, 9) if align_corners else (4, 8)
    depth = depth_sizes(dims, H, 3)
    grad_output, inp, _ = make_problem(2, 3, H, W, 5, 6, seed=seed, **depth)
    grid = hard_grid(2, 5, 6, H, W, align_corners, seed=seed, **depth)
    return tuple(t.to(device=device, dtype=dtype) for t in (grad_output, inp, grid))


def _random_problem(dims, dtype, device, seed, grid_range):
    depth = depth_sizes(dims, 4, 3)
    return make_problem(3, 2, 6, 7, 9, 5, dtype=dtype, device=device, seed=seed,
                        grid_range=grid_range, **depth)


def _reference(grad_output, inp, grid, mode, padding, align_corners,
               output_mask=(True, True)):
    """Stock's answer: on the same device for float32/float64. For
    Half/BFloat16, grad_input is the exact gradient, in float64, of the
    function stock's CUDA forward computes (its taps and weights are
    scalar_t arithmetic, stock_reference.backward), which the core's terms
    and float sums approach within reduced_precision_error_bound; grad_grid
    is stock's CUDA arithmetic itself (stock_reference.grid_gradient),
    scalar_t sums that detgrid reproduces bit for bit."""
    if grad_output.dtype in REDUCED_DTYPES:
        cpu_args = [t.detach().cpu() for t in (grad_output, inp, grid)]
        grad_input = stock_reference.backward(*cpu_args, mode, padding, align_corners)[0]
        grad_grid = stock_reference.grid_gradient(*cpu_args, mode, padding, align_corners)
        return tuple(g if wanted else None
                     for g, wanted in zip((grad_input, grad_grid), output_mask))
    return stock_backward(grad_output, inp, grid, mode, padding, align_corners,
                          output_mask)


class TestAgreementWithStock(DetgridTestCase):

    def _assert_close(self, actual, expected, dtype, what):
        rtol, atol = _tolerances(dtype, expected)
        self.assertEqual(actual.dtype, dtype, msg=f"{what}: dtype")
        self.assertEqual(actual.device.type, self.device_type, msg=f"{what}: device")
        self.assertEqual(actual.to(expected.dtype).cpu(), expected.cpu(),
                         rtol=rtol, atol=atol, msg=what)

    @dtypes(*ALL_DTYPES)
    @parametrize("layout", LAYOUTS)
    @parametrize("align_corners", (False, True))
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_gradients_match_stock(self, device, dtype, dims, mode, padding,
                                   align_corners, layout):
        args = _apply_layout(layout, *_hard_problem(mode, align_corners, dtype,
                                                    device, dims=dims))
        grad_input, grad_grid = detgrid_backward(*args, mode, padding, align_corners)
        ref_input, ref_grid = _reference(*args, mode, padding, align_corners)
        self.assertEqual(grad_input.dtype, dtype, msg="grad_input: dtype")
        self.assertEqual(grad_input.device.type, self.device_type, msg="grad_input: device")
        if dtype in REDUCED_DTYPES:
            assert_within_rounding_of_exact(self, grad_input, ref_input, args, mode, padding,
                                            align_corners)
            assert_bitwise_equal(self, grad_grid.cpu(), ref_grid.to(dtype), "grad_grid")
        else:
            self._assert_close(grad_input, ref_input, dtype, "grad_input")
            self._assert_close(grad_grid, ref_grid, dtype, "grad_grid")
        # Like stock, fresh contiguous outputs whatever the input strides.
        self.assertTrue(grad_input.is_contiguous())
        self.assertTrue(grad_grid.is_contiguous())

    @dtypes(torch.float32, torch.float64)
    @parametrize("align_corners", (False, True))
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_gradients_match_stock_on_random_grids(self, device, dtype, dims, mode,
                                                   padding, align_corners):
        args = _random_problem(dims, dtype, device, seed=7, grid_range=1.5)
        grad_input, grad_grid = detgrid_backward(*args, mode, padding, align_corners)
        ref_input, ref_grid = _reference(*args, mode, padding, align_corners)
        self._assert_close(grad_input, ref_input, dtype, "grad_input")
        self._assert_close(grad_grid, ref_grid, dtype, "grad_grid")

    @dtypes(torch.float32, torch.float64)
    @parametrize("output_mask", MASKS, name_fn=lambda m: "input%d_grid%d" % m)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_output_mask_returns_only_requested_gradients(self, device, dtype,
                                                          dims, mode, output_mask):
        args = _hard_problem(mode, False, dtype, device, seed=3, dims=dims)
        # Asking for less changes nothing that is computed, but a call for
        # grad_grid alone is stock's where backward_route says so (on CPU:
        # one writer per element and no alert, nothing to make
        # deterministic); on CUDA it is detgrid's grid-gradient pass.
        grid_to_stock = detgrid.ops.backward_route(
            self.device_type, True, False, list(output_mask)) == "stock"
        full = (stock_backward(*args, mode, REFLECTION, False, output_mask)
                if grid_to_stock
                else detgrid_backward(*args, mode, REFLECTION, False))
        partial = detgrid_backward(*args, mode, REFLECTION, False, output_mask)
        for requested, got, everything, name in zip(
                output_mask, partial, full, ("grad_input", "grad_grid")):
            if requested:
                assert_bitwise_equal(self, got, everything, name)
            else:
                self.assertIsNone(got, name)
        ref = _reference(*args, mode, REFLECTION, False, output_mask)
        if output_mask[0]:
            self._assert_close(partial[0], ref[0], dtype, "grad_input")
        if output_mask[1]:
            self._assert_close(partial[1], ref[1], dtype, "grad_grid")

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_empty_output_mask_returns_no_gradients(self, device, dims):
        depth = depth_sizes(dims, 2, 3)
        args = make_problem(1, 2, 3, 4, 2, 2, device=device, **depth)
        self.assertEqual(
            detgrid_backward(*args, BILINEAR, ZEROS, False, (False, False)),
            (None, None))

    @hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
    @hypothesis.given(
        batch=st.integers(0, 3), channels=st.integers(0, 4),
        in_h=st.integers(1, 7), in_w=st.integers(1, 7),
        out_h=st.integers(0, 6), out_w=st.integers(0, 6),
        mode=st.sampled_from(MODES), padding=st.sampled_from(PADDINGS),
        align_corners=st.booleans(), grid_range=st.sampled_from((0.5, 1.0, 2.5, 40.0)),
        seed=st.integers(0, 2**16))
    def test_gradients_match_stock_on_random_shapes(
            self, device, batch, channels, in_h, in_w, out_h, out_w, mode,
            padding, align_corners, grid_range, seed):
        args = make_problem(batch, channels, in_h, in_w, out_h, out_w,
                            device=device, seed=seed, grid_range=grid_range)
        grad_input, grad_grid = detgrid_backward(*args, mode, padding, align_corners)
        ref_input, ref_grid = _reference(*args, mode, padding, align_corners)
        self._assert_close(grad_input, ref_input, torch.float64, "grad_input")
        self._assert_close(grad_grid, ref_grid, torch.float64, "grad_grid")

    @onlyCPU
    @dtypes(*REDUCED_DTYPES)
    @parametrize("dims,mode", ((2, BILINEAR), (2, BICUBIC), (3, BILINEAR)),
                 name_fn=sampler_name)
    def test_reduced_precision_grad_input_is_at_least_as_accurate_as_stock(
            self, device, dtype, dims, mode):
        # detgrid forms each term in the dtype as stock does, sums the terms
        # in float32 and rounds once; stock's backward rounds to the dtype at
        # every step of its sums. (grad_grid
        # is stock's CUDA arithmetic by design: test_gradients_match_stock.)
        # The input stays far below the size where stock's own
        # half-precision CPU backward breaks (STOCK_CPU_HALF_MAX_PLANE_OFFSET).
        depth = depth_sizes(dims, 3, 4)
        args = make_problem(2, 4, 6, 7, 5, 8, dtype=dtype, device=device, seed=11,
                            **depth)
        self.assertTrue(stock_cpu_backward_is_reliable(args[1]), "precondition")
        ours = detgrid_backward(*args, mode, ZEROS, False, (True, False))[0]
        stock = stock_backward(*args, mode, ZEROS, False, (True, False))[0]
        exact = _reference(*args, mode, ZEROS, False)[0]
        our_error = (ours.double() - exact).abs().sum()
        stock_error = (stock.double() - exact).abs().sum()
        self.assertLessEqual(our_error.item(), stock_error.item(), "grad_input")


class TestGradcheck(DetgridTestCase):

    def _inputs(self, device, align_corners, seed=0, dims=2):
        # 2-D: a 4 x 5 image sampled at 3 x 3 points; 3-D: a 2 x 3 x 4
        # volume sampled at 2 x 2 x 2 points (few, as gradcheck perturbs
        # every input and grid element).
        if dims == 2:
            in_size, out_H, out_W = (4, 5), 3, 3
        else:
            in_size, out_H, out_W = (2, 3, 4), 2, 2
        gen = torch.Generator().manual_seed(seed)
        inp = torch.randn(2, 2, *in_size, generator=gen, dtype=torch.float64)
        grid = smooth_grid(2, out_H, out_W, *in_size[-2:], align_corners, seed=seed,
                           **depth_sizes(dims, in_size[0], 2))
        return (inp.to(device).requires_grad_(),
                grid.to(device).requires_grad_())

    @parametrize("align_corners", (False, True))
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_gradcheck_of_detgrid_backward(self, device, dims, mode, padding,
                                           align_corners):
        inp, grid = self._inputs(device, align_corners, seed=mode * 9 + padding,
                                 dims=dims)
        self.assertTrue(torch.autograd.gradcheck(
            DetGridSample.apply, (inp, grid, mode, padding, align_corners)))

    @parametrize("dims,mode", ((2, "bilinear"), (2, "bicubic"), (3, "bilinear")),
                 name_fn=lambda dims, mode: "_".join(filter(None, (
                     f"mode_{mode}", dims_name(dims)))))
    def test_gradcheck_of_grid_sample_while_enabled(self, device, dims, mode):
        inp, grid = self._inputs(device, align_corners=False, seed=5, dims=dims)
        with detgrid.enabled((self.device_type,)), DeterministicGuard(True):
            self.assertTrue(torch.autograd.gradcheck(
                lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode="border",
                                           align_corners=False),
                (inp, grid)))


# ---------------------------------------------------------------------------
# OpInfo samples of grid_sampler_2d and nn.functional.grid_sample (4-D and
# 5-D), extended with hard samples. (The grid_sampler_3d OpInfo skips CPU and
# CUDA; nn.functional.grid_sample's 5-D samples cover it.)
# ---------------------------------------------------------------------------

_GRID_SAMPLE_OPS = [
    op for op in op_db if op.name in ("grid_sampler_2d", "nn.functional.grid_sample")
]
_MODE_BY_NAME = {"bilinear": BILINEAR, "nearest": NEAREST, "bicubic": BICUBIC}
_PADDING_BY_NAME = {"zeros": 0, "border": 1, "reflection": 2}
_MODE_NAME = {v: k for k, v in _MODE_BY_NAME.items()}
_PADDING_NAME = {v: k for k, v in _PADDING_BY_NAME.items()}


def _sample(op_name, inp, grid, mode, padding, align_corners):
    if op_name == "grid_sampler_2d":
        return SampleInput(inp, args=(grid, mode, padding, align_corners))
    return SampleInput(inp, args=(grid,), kwargs={
        "mode": _MODE_NAME[mode], "padding_mode": _PADDING_NAME[padding],
        "align_corners": align_corners})


def _backward_args(op_name, sample):
    """(input, grid, mode, padding, align_corners) of a sample."""
    if op_name == "grid_sampler_2d":
        grid, mode, padding, align_corners = sample.args
        return sample.input, grid, mode, padding, align_corners
    (grid,) = sample.args
    kwargs = sample.kwargs
    return (sample.input, grid, _MODE_BY_NAME[kwargs.get("mode", "bilinear")],
            _PADDING_BY_NAME[kwargs.get("padding_mode", "zeros")],
            bool(kwargs.get("align_corners", False)))


_OP_DIMS = {"grid_sampler_2d": (2,), "nn.functional.grid_sample": (2, 3)}


def _hard_samples(op_name, device, dtype):
    """Samples the OpInfo lacks: exact pixel/edge positions, 1x1 and 1xN
    inputs (1x1x1 and 1xNx1 ... in 3-D), channels_last input, non-contiguous
    grid, a grid far outside."""
    for (dims, mode), padding, align_corners in itertools.product(
            SAMPLERS, PADDINGS, (False, True)):
        if dims not in _OP_DIMS[op_name]:
            continue
        _, inp, grid = _hard_problem(mode, align_corners, dtype, device, seed=1,
                                     dims=dims)
        yield _sample(op_name, inp, grid, mode, padding, align_corners)
        yield _sample(op_name, strided_like(inp, "channels_last"),
                      strided_like(grid, "transposed"), mode, padding, align_corners)
        sizes = (((1, 1), (1, 6), (6, 1)) if dims == 2 else
                 ((1, 1, 1), (1, 1, 6), (1, 6, 1), (6, 1, 1)))
        for *D, H, W in sizes:
            depth = dict(D=D[0], out_D=2) if D else {}
            _, small, far = make_problem(2, 2, H, W, 3, 4, dtype=dtype, device=device,
                                         seed=H + W, grid_range=3.0, **depth)
            yield _sample(op_name, small, far, mode, padding, align_corners)


class TestOpInfoSamples(DetgridTestCase):

    @ops(_GRID_SAMPLE_OPS, allowed_dtypes=(torch.float32, torch.float64))
    def test_backward_matches_stock_on_opinfo_and_hard_samples(self, device,
                                                               dtype, op):
        samples = itertools.chain(op.sample_inputs(device, dtype),
                                  _hard_samples(op.name, device, dtype))
        gen = torch.Generator().manual_seed(0)
        checked = 0
        for sample in samples:
            args = _backward_args(op.name, sample)
            if args is None:
                continue
            inp, grid, mode, padding, align_corners = args
            if inp.dim() == 5 and mode == BICUBIC and not STOCK_HAS_TRICUBIC:
                continue  # this torch has no 5-D bicubic forward to compare with
            out = op(sample.input, *sample.args, **sample.kwargs)
            grad_output = torch.randn(out.shape, generator=gen,
                                      dtype=torch.float64).to(out)
            ours = detgrid_backward(grad_output, inp, grid, mode, padding, align_corners)
            ref = stock_backward(grad_output, inp, grid, mode, padding, align_corners)
            what = (f"{tuple(inp.shape)} {_MODE_NAME[mode]} {_PADDING_NAME[padding]} "
                    f"align_corners={align_corners}")
            for got, expected in zip(ours, ref):
                rtol, atol = _tolerances(dtype, expected)
                self.assertEqual(got, expected, rtol=rtol, atol=atol, msg=what)
            checked += 1
        # Every op's OpInfo samples plus 5 (2-D) or 6 (3-D) hard samples per
        # (mode, padding, align_corners) this torch can sample.
        combos_3d = 18 if STOCK_HAS_TRICUBIC else 12
        hard = {"grid_sampler_2d": 18 * 5,
                "nn.functional.grid_sample": 18 * 5 + combos_3d * 6}[op.name]
        self.assertGreater(checked, hard)


instantiate_device_type_tests(TestAgreementWithStock, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestGradcheck, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestOpInfoSamples, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
