# Owner(s): ["module: nn"]
"""Helpers shared by detgrid's tests (not a test module itself).

Terminology follows GridSamplerDeterministic.cu: a *point* is one output
location (n, h, w) or (n, d, h, w), a *tap* one input pixel (voxel) a point
reads, a *record* one (point, tap) pair.

Every helper serves both grid_sampler_2d (4-D input, `dims` = 2) and
grid_sampler_3d (5-D input, `dims` = 3): the problem makers take D and out_D
for 3-D, the calls dispatch on input.dim().
"""

import functools
import math
import unittest

import numpy as np
import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase

import detgrid
import stock_reference
from detgrid import ops
from detgrid.bench import stock_limits
from detgrid.kit.bitwise import differing_elements

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
MODES = (BILINEAR, NEAREST, BICUBIC)
PADDINGS = (ZEROS, BORDER, REFLECTION)
MODE_NAMES = {BILINEAR: "bilinear", NEAREST: "nearest", BICUBIC: "bicubic"}
PADDING_NAMES = {ZEROS: "zeros", BORDER: "border", REFLECTION: "reflection"}
# Taps per point of grid_sampler_2d; taps_per_point() for any rank.
TAPS_PER_POINT = {BILINEAR: 4, NEAREST: 1, BICUBIC: 16}
TAPS_PER_AXIS = {BILINEAR: 2, NEAREST: 1, BICUBIC: 4}
# 5-D bicubic is tricubic: stock has it from torch 2.15 (see
# STOCK_HAS_TRICUBIC; earlier releases refuse 5-D bicubic input), detgrid on
# every torch, on CPU and CUDA alike.
MODES_3D = (BILINEAR, NEAREST, BICUBIC)
# Every (spatial dims, interpolation mode) grid_sample supports.
SAMPLERS = tuple((2, mode) for mode in MODES) + tuple((3, mode) for mode in MODES_3D)

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
REDUCED_DTYPES = (torch.float16, torch.bfloat16)

HAS_DETGRID_CUDA = ops.has_cuda_kernels() and torch.cuda.is_available()


def mode_name(mode):
    return MODE_NAMES[mode]


def padding_name(padding):
    return PADDING_NAMES[padding]


def dims_name(dims):
    """Subtest name of a spatial rank. Empty for 2-D, so the 2-D tests keep
    the names they had before 3-D existed."""
    return "" if dims == 2 else f"{dims}d"


def sampler_name(dims, mode):
    """Subtest name of a (dims, mode) pair of SAMPLERS: "bilinear",
    "bilinear_3d", ..."""
    return "_".join(filter(None, (mode_name(mode), dims_name(dims))))


def taps_per_point(mode, dims=2):
    return TAPS_PER_AXIS[mode] ** dims


# ---------------------------------------------------------------------------
# Bitwise comparison
# ---------------------------------------------------------------------------

_INT_VIEW = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def bits(t):
    """The raw bit patterns of a floating tensor (NaN-safe, sign of zero
    included)."""
    return t.detach().cpu().contiguous().view(_INT_VIEW[t.dtype])


def same_bits(a, b):
    if a is None or b is None:
        return a is None and b is None
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(bits(a), bits(b))
    )


def assert_bitwise_equal(test, actual, expected, what="tensor"):
    """Same dtype, shape and bits; also torch.equal wherever no NaN is
    involved (so the two notions of equality can't silently diverge)."""
    if actual is None or expected is None:
        test.assertIs(actual, expected, f"{what}: one side is None")
        return
    test.assertEqual(actual.dtype, expected.dtype, msg=f"{what}: dtype")
    test.assertEqual(tuple(actual.shape), tuple(expected.shape), msg=f"{what}: shape")
    a_bits, e_bits = bits(actual), bits(expected)
    differ = a_bits != e_bits
    if differ.any():
        index = tuple(int(i) for i in differ.nonzero()[0])
        test.fail(
            f"{what}: {int(differ.sum())} of {differ.numel()} elements differ "
            f"bitwise; first at {index}: {actual.detach().cpu()[index].item()!r} "
            f"vs {expected.detach().cpu()[index].item()!r}")
    a_cpu, e_cpu = actual.detach().cpu(), expected.detach().cpu()
    if not (a_cpu.isnan().any() or e_cpu.isnan().any()):
        test.assertTrue(torch.equal(a_cpu, e_cpu), f"{what}: torch.equal")


def assert_pair_bitwise_equal(test, actual, expected, what=""):
    assert_bitwise_equal(test, actual[0], expected[0], f"{what} grad_input")
    assert_bitwise_equal(test, actual[1], expected[1], f"{what} grad_grid")


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def pixel_to_grid(coord, size, align_corners):
    """Normalized grid coordinate of a pixel-unit source coordinate (inverse
    of grid_sampler_unnormalize)."""
    if align_corners:
        return coord * 2.0 / (size - 1) - 1.0
    return (2.0 * coord + 1.0) / size - 1.0


def _spatial_sizes(H, W, out_H, out_W, D, out_D):
    """(input spatial sizes, output spatial sizes), outermost first."""
    if (D is None) != (out_D is None):
        raise ValueError("a 3-D problem needs both D and out_D")
    if D is None:
        return (H, W), (out_H, out_W)
    return (D, H, W), (out_D, out_H, out_W)


def depth_sizes(dims, D, out_D):
    """The D and out_D keywords of the problem makers for a 3-D problem;
    none for a 2-D one: make_problem(..., **depth_sizes(dims, 3, 2))."""
    return {} if dims == 2 else dict(D=D, out_D=out_D)


def make_problem(N, C, H, W, out_H, out_W, *, D=None, out_D=None,
                 dtype=torch.float64, device="cpu", seed=0, grid_range=1.2):
    """(grad_output, input, grid): values drawn in float64 from a seeded
    generator and then cast, so every dtype sees the same problem. With D
    and out_D, a grid_sampler_3d problem: input (N, C, D, H, W), grid
    (N, out_D, out_H, out_W, 3)."""
    in_size, out_size = _spatial_sizes(H, W, out_H, out_W, D, out_D)
    gen = torch.Generator().manual_seed(seed)
    inp = torch.randn(N, C, *in_size, generator=gen, dtype=torch.float64)
    grid = (torch.rand(N, *out_size, len(in_size), generator=gen,
                       dtype=torch.float64) * 2 - 1) * grid_range
    grad_output = torch.randn(N, C, *out_size, generator=gen, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (grad_output, inp, grid))


def meta_problem(input_shape, grid_spatial, dtype=torch.float32):
    """(grad_output, input, grid) on the meta device, for the work counters
    (which read shapes only): input `input_shape`, grid (N, *grid_spatial,
    dims)."""
    n, c = input_shape[:2]
    dims = len(input_shape) - 2
    inp = torch.empty(input_shape, dtype=dtype, device="meta")
    grid = torch.empty((n, *grid_spatial, dims), dtype=dtype, device="meta")
    grad_output = torch.empty((n, c, *grid_spatial), dtype=dtype, device="meta")
    return grad_output, inp, grid


def make_zoom_problem(N, C, H, W, out_H, out_W, *, D=None, out_D=None,
                      dtype=torch.float32, device="cpu", seed=0, hot_fraction=0.7,
                      align_corners=False):
    """A high-collision problem: `hot_fraction` of the points land inside one
    pixel cell (voxel cell in 3-D, with D and out_D), so each of its corner
    pixels receives a record from almost every point, thousands per
    destination; the rest are spread over the image (so record counts per
    chunk are not multiples of a partial's 256). The grad outputs span several binades so
    that the summation order shows in the bits."""
    in_size, out_size = _spatial_sizes(H, W, out_H, out_W, D, out_D)
    gen = torch.Generator().manual_seed(seed)
    inp = torch.randn(N, C, *in_size, generator=gen, dtype=torch.float64)
    points = N * math.prod(out_size)
    hot = torch.rand(points, generator=gen, dtype=torch.float64) < hot_fraction
    coords = []
    for size in reversed(in_size):  # the grid's order: x, y(, z)
        pixel = torch.where(
            hot,
            1.0 + torch.rand(points, generator=gen, dtype=torch.float64),
            torch.rand(points, generator=gen, dtype=torch.float64) * (size - 1))
        coords.append(pixel_to_grid(pixel, size, align_corners))
    grid = torch.stack(coords, dim=-1).reshape(N, *out_size, len(in_size))
    scale = torch.exp2(torch.randint(-6, 7, (N, C, *out_size), generator=gen)
                       .to(torch.float64))
    grad_output = torch.randn(N, C, *out_size, generator=gen,
                              dtype=torch.float64) * scale
    return tuple(t.to(device=device, dtype=dtype) for t in (grad_output, inp, grid))


def hard_grid(N, out_H, out_W, H, W, align_corners, *, D=None, out_D=None,
              seed=0):
    """A float64 grid whose points sit where implementations are most likely
    to disagree: on pixel centers, half-way between them, on and beyond the
    image edges, mixed with random points. With H, W (and D) chosen so that
    the normalization is exact (power-of-two sizes for align_corners=False,
    power-of-two size - 1 for True), every such coordinate is exact in every
    dtype. With D and out_D, a 3-D grid (N, out_D, out_H, out_W, 3)."""
    in_size, out_size = _spatial_sizes(H, W, out_H, out_W, D, out_D)
    gen = torch.Generator().manual_seed(seed)
    count = N * math.prod(out_size)

    def axis(size):
        special = torch.tensor(
            [0.0, 1.0, size - 1.0, size - 2.0, 0.5, size / 2.0, size - 1.5,
             -0.5, size - 0.5, -1.0, size, -2.0, size + 1.0, 1.5, 2.0],
            dtype=torch.float64)
        pick = torch.randint(0, special.numel(), (count,), generator=gen)
        coords = special[pick]
        random = torch.rand(count, generator=gen, dtype=torch.float64) * (size + 2) - 1.5
        use_random = torch.rand(count, generator=gen) < 0.3
        coords = torch.where(use_random, random, coords)
        return pixel_to_grid(coords, size, align_corners)

    return torch.stack([axis(size) for size in reversed(in_size)],
                       dim=-1).reshape(N, *out_size, len(in_size))


def snapped_grid(grid, in_size, steps_per_pixel):
    """`grid` (float64) moved to the nearest multiple of 1 / steps_per_pixel
    of a pixel under align_corners=False: whole pixels (1) or whole and half
    pixels (2). With power-of-two input sizes (`in_size`, outermost first)
    the grid values, pixel coordinates, weights and cubic coefficients are
    then exact in every dtype, so half and bfloat16 take the taps and
    weights float32 does: bilinear weights are powers of two (or 0), bicubic
    coefficients 0 and 1 on whole pixels."""
    size = torch.tensor(tuple(in_size)[::-1], dtype=torch.float64, device=grid.device)
    # The pixel coordinate is ((grid + 1) * size - 1) / 2.
    steps = torch.round(((grid + 1) * size - 1) * (steps_per_pixel / 2))
    return (steps * (2 / steps_per_pixel) + 1) / size - 1


def smooth_grid(N, out_H, out_W, H, W, align_corners, *, D=None, out_D=None,
                seed=0):
    """A float64 grid whose pixel coordinates are k + u with u in
    [0.15, 0.35]: away from integers (bilinear/bicubic kinks, reflection and
    clipping edges) and from half-integers (nearest's rounding), so finite
    differences are well defined. With D and out_D, a 3-D grid."""
    in_size, out_size = _spatial_sizes(H, W, out_H, out_W, D, out_D)
    gen = torch.Generator().manual_seed(seed)
    count = N * math.prod(out_size)

    def axis(size):
        base = torch.randint(-1, size, (count,), generator=gen).to(torch.float64)
        offset = 0.15 + 0.2 * torch.rand(count, generator=gen, dtype=torch.float64)
        return pixel_to_grid(base + offset, size, align_corners)

    return torch.stack([axis(size) for size in reversed(in_size)],
                       dim=-1).reshape(N, *out_size, len(in_size))


def strided_like(t, layout):
    """A copy of `t` with the requested memory layout (same values).
    "channels_last" means channels_last_3d for a 5-D tensor."""
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4
                            else torch.channels_last_3d)
    if layout == "transposed":
        # (N, A, B, ..., K) stored as (N, B, A, ..., K + 1), viewed back: no
        # dimension is contiguous in the usual sense.
        N, A, B, *rest, K = t.shape
        storage = torch.empty(N, B, A, *rest, K + 1, dtype=t.dtype, device=t.device)
        view = storage.transpose(1, 2)[..., 1:]
        view.copy_(t)
        assert not view.is_contiguous()
        return view
    if layout == "contiguous":
        return t.contiguous()
    raise ValueError(layout)


def expanded(value, shape, dtype, device="cpu"):
    """A zero-stride tensor, like the grad_output `out.sum().backward()` gives."""
    return torch.full((), value, dtype=dtype, device=device).expand(*shape)


# ---------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------


def _spatial_dims(inp, dims):
    return inp.dim() - 2 if dims is None else dims


def detgrid_backward(grad_output, inp, grid, mode, padding, align_corners,
                     output_mask=(True, True), *, dims=None, **options):
    """detgrid's grid_sampler_2d_backward, or its 3-D twin for a 5-D input;
    `dims` picks the op explicitly (to hand one op the other's shapes)."""
    if _spatial_dims(inp, dims) == 3:
        plain = ops.grid_sampler_3d_backward
        with_options = ops.grid_sampler_3d_backward_with_options
    else:
        plain = ops.grid_sampler_2d_backward
        with_options = ops.grid_sampler_2d_backward_with_options
    if options:
        return with_options(grad_output, inp, grid, mode, padding, align_corners,
                            list(output_mask), **options)
    return plain(grad_output, inp, grid, mode, padding, align_corners,
                 list(output_mask))


def _stock_has_tricubic():
    try:
        torch.grid_sampler_3d(torch.zeros(1, 1, 1, 1, 1), torch.zeros(1, 1, 1, 1, 3),
                              BICUBIC, 0, False)
    except (RuntimeError, NotImplementedError):
        return False
    return True


# Whether this torch samples 5-D input bicubically (torch >= 2.15). Where it
# does not, a comparison with stock's 5-D bicubic is skipped, not passed.
STOCK_HAS_TRICUBIC = _stock_has_tricubic()


def skip_unless_stock_samples(dims, mode):
    if dims == 3 and mode == BICUBIC and not STOCK_HAS_TRICUBIC:
        raise unittest.SkipTest(
            f"torch {torch.__version__} has no 5-D bicubic grid_sample to compare with")


def stock_backward(grad_output, inp, grid, mode, padding, align_corners,
                   output_mask=(True, True), *, dims=None):
    """Stock aten backward (2-D, or 3-D for a 5-D input), bypassing any
    detgrid override: the CPU override only acts under deterministic mode,
    so run it with determinism off. Never call this with NaN grids on CPU
    (upstream #24823)."""
    spatial_dims = _spatial_dims(inp, dims)
    skip_unless_stock_samples(spatial_dims, mode)
    op = (torch.ops.aten.grid_sampler_3d_backward if spatial_dims == 3
          else torch.ops.aten.grid_sampler_2d_backward)
    with _determinism(False):
        return op(grad_output, inp, grid, mode, padding, align_corners,
                  list(output_mask))


@functools.cache
def stock_has_double_backward(dims=2):
    """Whether this torch differentiates grid_sampler_{dims}d_backward: grid_sample's
    double backward came with pytorch#177487 (torch 2.12); earlier releases raise
    "derivative for aten::grid_sampler_2d_backward is not implemented" at the second
    backward. Probed once per rank on a tiny CPU problem with stock's backward
    (determinism off), as STOCK_HAS_TRICUBIC is; any other error propagates."""
    inp = torch.ones((1, 1) + (2,) * dims, dtype=torch.double, requires_grad=True)
    grid = torch.zeros((1,) + (1,) * dims + (dims,), dtype=torch.double, requires_grad=True)
    with _determinism(False):
        out = F.grid_sample(inp, grid, align_corners=False)
        (grad_grid,) = torch.autograd.grad(out.sum(), grid, create_graph=True)
        try:
            torch.autograd.grad(grad_grid.sum(), inp)
        except RuntimeError as e:
            if "not implemented" not in str(e):
                raise
            return False
    return True


def skip_unless_stock_has_double_backward(dims=2):
    """Skip a test that differentiates grid_sample's backward where this torch
    cannot (a missing stock derivative is no detgrid failure). Looks the probe up
    at call time, so a test can fake its answer with mock.patch.object."""
    if not stock_has_double_backward(dims):
        raise unittest.SkipTest(
            f"torch {torch.__version__} has no double backward of {dims}-D grid_sample "
            "(grid_sampler_backward is differentiable from torch 2.12, pytorch#177487)")


class _determinism:
    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.prev = torch.are_deterministic_algorithms_enabled()
        self.prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(self.on, warn_only=self.prev_warn)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.prev, warn_only=self.prev_warn)


class DetGridSample(torch.autograd.Function):
    """grid_sampler_2d (grid_sampler_3d for a 5-D input) with detgrid's
    backward, without touching the global switch: what gradcheck
    differentiates."""

    @staticmethod
    def forward(ctx, inp, grid, mode, padding, align_corners):
        ctx.save_for_backward(inp, grid)
        ctx.args = (mode, padding, align_corners)
        skip_unless_stock_samples(inp.dim() - 2, mode)
        forward = torch.grid_sampler_3d if inp.dim() == 5 else torch.grid_sampler_2d
        return forward(inp, grid, mode, padding, align_corners)

    @staticmethod
    def backward(ctx, grad_output):
        inp, grid = ctx.saved_tensors
        grad_input, grad_grid = detgrid_backward(
            grad_output, inp, grid, *ctx.args, ctx.needs_input_grad[:2])
        return grad_input, grad_grid, None, None, None


def reset_switch():
    detgrid.disable(("cpu",))
    if ops.has_cuda_kernels():
        detgrid.disable(("cuda",))


class DetgridTestCase(TestCase):
    """Base of detgrid's test classes: every test starts and ends with the
    switch off, and the CUDA variant of a device-generic test is skipped
    when detgrid has no CUDA kernels (a CUDA torch alone is not enough)."""

    def setUp(self):
        super().setUp()
        if getattr(self, "device_type", "cpu") == "cuda" and not ops.has_cuda_kernels():
            self.skipTest("detgrid was built without CUDA kernels")
        reset_switch()
        self.addCleanup(reset_switch)


# ---------------------------------------------------------------------------
# Half and BFloat16 against float64
# ---------------------------------------------------------------------------

# How often the core rounds a Half/BFloat16 term of grad_input to the dtype,
# forming it as stock's kernel does (GridSamplerDeterministic.cu's
# SortedChunk::term): nearest's is gOut itself; bilinear's (trilinear's)
# weight * gOut; bicubic's gOut * x_coeff * y_coeff (* z_coeff), a rounding
# per product. (The weights themselves are stock's scalar_t values, as the
# reference takes them.)
TERM_ROUNDINGS = {(2, NEAREST): 0, (3, NEAREST): 0, (2, BILINEAR): 1, (3, BILINEAR): 1,
                  (2, BICUBIC): 2, (3, BICUBIC): 3}


def term_magnitudes(grad_output, inp, grid, mode, padding, align_corners):
    """Per grad_input element, in float64: the sum of its terms' magnitudes
    |weight| * |gOut| and how many terms it has, over stock's taps and weights
    (stock_reference.point_taps)."""
    dims = inp.dim() - 2
    N, C = inp.shape[:2]
    in_size = tuple(inp.shape[2:])
    points = grid.detach().cpu().reshape(-1, dims)
    positions, in_bounds, weights = stock_reference.point_taps(
        points, in_size, mode, padding, align_corners)
    per_image = math.prod(grad_output.shape[2:])
    gout = grad_output.detach().cpu().double().reshape(N, C, per_image).permute(0, 2, 1)
    gout = gout.reshape(len(points), C).abs().numpy()
    flat = np.zeros(in_bounds.shape, dtype=np.int64)
    for a in range(dims):
        flat = flat * in_size[a] + np.where(in_bounds, positions[..., a], 0)
    image = np.repeat(np.arange(N), per_image)[:, None, None]
    channel = np.arange(C)[None, None, :]
    magnitude = np.zeros((N, C, int(np.prod(in_size))))
    count = np.zeros_like(magnitude)
    contribution = np.abs(np.where(in_bounds, weights, 0.0))[..., None] * gout[:, None, :]
    np.add.at(magnitude, (image, channel, flat[..., None]), contribution)
    np.add.at(count, (image, channel, flat[..., None]), in_bounds[..., None] * 1.0)
    return (torch.from_numpy(magnitude).reshape(N, C, *in_size),
            torch.from_numpy(count).reshape(N, C, *in_size))


def reduced_precision_error_bound(dtype, dims, mode, exact, magnitude, count):
    """How far a Half/BFloat16 grad_input element of the core may lie from the
    float64 sum `exact` of stock's terms (stock_reference.backward), given the
    sum of the terms' magnitudes and their count (term_magnitudes): each
    term formed in the dtype (TERM_ROUNDINGS[dims, mode] roundings, relative
    error u each, u the dtype's unit roundoff, or eta absolute below its
    smallest normal), the terms summed in float (gamma_n of float32 over the
    magnitudes, in any order), the sum rounded to the dtype once (u |sum|, or
    eta); plus the reference's own error, within 2^-23 of the magnitudes
    (float32 products of tricubic coefficients, float64 sums). Stock's
    atomic backward forms the same terms and rounds each add to the dtype as
    well, so it needs at least this bound; a tap moved by a pixel, or a
    weight off by more than the dtype's rounding, leaves it."""
    finfo = torch.finfo(dtype)
    u = finfo.eps / 2
    eta = finfo.smallest_normal * u  # half the spacing of the dtype's subnormals
    k = TERM_ROUNDINGS[dims, mode]
    gamma = count * 2.0 ** -24 / (1 - count * 2.0 ** -24)
    terms = ((1 + u) ** k * (1 + gamma) - 1 + 2.0 ** -23) * magnitude
    return u * exact.abs() + eta + (1 + u) * (terms + k * eta * count * (1 + gamma))


def assert_within_rounding_of_exact(test, grad_input, exact, args, mode, padding,
                                    align_corners, what="grad_input"):
    """A Half/BFloat16 grad_input within reduced_precision_error_bound of the
    float64 reference `exact` (stock_reference.backward of `args`, the
    (grad_output, input, grid) it ran on, with finite grids), element by
    element."""
    magnitude, count = term_magnitudes(*args, mode, padding, align_corners)
    bound = reduced_precision_error_bound(grad_input.dtype, grad_input.dim() - 2, mode,
                                          exact, magnitude, count)
    error = (grad_input.detach().cpu().double() - exact).abs()
    over = ~(error <= bound)  # a NaN on either side is over too
    if over.any():
        index = tuple(int(i) for i in over.nonzero()[0])
        test.fail(f"{what}: {int(over.sum())} of {over.numel()} elements beyond the "
                  f"rounding bound; first at {index}: "
                  f"{grad_input.detach().cpu()[index].item()!r} vs exact "
                  f"{exact[index].item()!r}, error {error[index].item():.3g} > "
                  f"bound {bound[index].item():.3g}")


# ---------------------------------------------------------------------------
# Equality across devices
# ---------------------------------------------------------------------------


def assert_same_bits_or_both_nan(test, actual, expected, what="tensor"):
    """assert_bitwise_equal, except that two NaNs are equal whatever their
    payloads: the rule for a CUDA result against the host build's, whose
    arithmetic NaNs differ in their bits (detgrid.kit.bitwise says why)."""
    if actual is None or expected is None:
        test.assertIs(actual, expected, f"{what}: one side is None")
        return
    test.assertEqual(actual.dtype, expected.dtype, msg=f"{what}: dtype")
    test.assertEqual(tuple(actual.shape), tuple(expected.shape), msg=f"{what}: shape")
    differ = differing_elements(actual, expected)
    if differ.any():
        index = tuple(int(i) for i in differ.nonzero()[0])
        test.fail(
            f"{what}: {int(differ.sum())} of {differ.numel()} elements differ "
            f"bitwise (NaN payloads aside); first at {index}: "
            f"{actual.detach().cpu()[index].item()!r} vs "
            f"{expected.detach().cpu()[index].item()!r}")


# ---------------------------------------------------------------------------
# Stock's limits
# ---------------------------------------------------------------------------

# Stock's CPU float16/bfloat16 2-D backward is wrong once the largest element
# offset within an input plane passes this (from 182x182 contiguous; channels
# last multiplies the offsets by C), and crashes with SIGSEGV in mask_gather
# from about 400x400 (detgrid.bench.stock_limits). Every comparison with stock in
# those dtypes keeps its input below it.
STOCK_CPU_HALF_MAX_PLANE_OFFSET = stock_limits.STOCK_CPU_HALF_MAX_PLANE_OFFSET
stock_cpu_backward_is_reliable = stock_limits.stock_cpu_backward_is_reliable
