# Owner(s): ["module: nn"]
"""Bitwise reproducibility of detgrid's backward, and the canonical
summation order it promises (GridSamplerDeterministic.cu, invariant (a)).

Equality here is of bit patterns (NaN-safe, sign of zero included): the
same inputs give the same bits whatever the thread count, grain size,
chunk size, CUDA launch shape or device. Tests parametrized over SAMPLERS
(or dims) run for grid_sampler_2d and grid_sampler_3d; the 3-D subtests
carry a "3d" suffix."""

import math

import hypothesis
import hypothesis.strategies as st
import numpy as np
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

import stock_reference
from detgrid_testing import (
    DetgridTestCase,
    ALL_DTYPES,
    BILINEAR,
    BORDER,
    MODES,
    PADDINGS,
    RECORDS_PER_PARTIAL,
    REDUCED_DTYPES,
    REFLECTION,
    SAMPLERS,
    TILE_POINTS,
    ZEROS,
    assert_bitwise_equal,
    assert_pair_bitwise_equal,
    detgrid_backward,
    dims_name,
    expanded,
    make_problem,
    half_pixel_grid,
    make_zoom_problem,
    padding_name,
    same_bits,
    sampler_name,
    strided_like,
    taps_per_point,
)

MULTI_TILE = {
    # 2 * 64 * 80 = 10240 points: three tiles, the last one partial.
    2: dict(N=2, C=3, H=12, W=16, out_H=64, out_W=80),
    # 2 * 8 * 28 * 28 = 12544 points: four tiles, the last one partial, so
    # that even 12288-point chunks make two.
    3: dict(N=2, C=3, D=4, H=6, W=8, out_D=8, out_H=28, out_W=28),
}


def _multi_tile_problem(kind, dtype, device, seed=0, dims=2):
    if kind == "zoom":
        return make_zoom_problem(**MULTI_TILE[dims], dtype=dtype, device=device,
                                 seed=seed)
    return make_problem(**MULTI_TILE[dims], dtype=dtype, device=device, seed=seed,
                        grid_range=1.1)


# MULTI_TILE's point counts over power-of-two input sizes.
HALF_PIXEL = {
    2: dict(MULTI_TILE[2], H=16),
    3: dict(MULTI_TILE[3], H=8),
}


def _half_pixel_problem(dtype, device, seed, dims):
    """A zoom problem whose grid lands on whole and half pixels, where half
    and bfloat16 take float32's taps and weights (see half_pixel_grid)."""
    grad_output, inp, grid = make_zoom_problem(**HALF_PIXEL[dims], dtype=torch.float64,
                                               device=device, seed=seed)
    grid = half_pixel_grid(grid, inp.shape[2:])
    return tuple(t.to(dtype) for t in (grad_output, inp, grid))


class TestBitwiseReproducibility(DetgridTestCase):

    def _problem_points(self, args):
        grad_output = args[0]
        return grad_output.shape[0] * math.prod(grad_output.shape[2:])

    @dtypes(*ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_repeated_runs_are_bitwise_identical(self, device, dtype, dims, mode):
        args = _multi_tile_problem("zoom", dtype, device, dims=dims)
        first = detgrid_backward(*args, mode, ZEROS, False)
        for _ in range(3):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, ZEROS, False), first)

    @dtypes(*ALL_DTYPES)
    @parametrize("kind", ("random", "zoom"))
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_chunk_points_do_not_change_bits(self, device, dtype, dims, mode, kind):
        args = _multi_tile_problem(kind, dtype, device, seed=1, dims=dims)
        self.assertGreater(self._problem_points(args),
                           (2 if dims == 2 else 3) * TILE_POINTS)
        # The default is one chunk here; 4096 and 8192 give three and two
        # (four and two in 3-D, where 12288 gives two as well); for
        # Half/BFloat16 that means a float32 carry between chunks.
        single = detgrid_backward(*args, mode, REFLECTION, True)
        for chunk_points in (4096, 8192, 3 * 4096):
            assert_pair_bitwise_equal(
                self,
                detgrid_backward(*args, mode, REFLECTION, True,
                                 chunk_points=chunk_points),
                single, f"chunk_points={chunk_points}")

    @onlyCPU
    @parametrize("kind", ("random", "zoom"))
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_grain_size_does_not_change_bits(self, device, dims, mode, kind):
        args = _multi_tile_problem(kind, torch.float32, device, seed=2, dims=dims)
        default = detgrid_backward(*args, mode, ZEROS, False)
        for grain_size in (1, 7, 64):
            assert_pair_bitwise_equal(
                self,
                detgrid_backward(*args, mode, ZEROS, False, grain_size=grain_size),
                default, f"grain_size={grain_size}")

    @onlyCPU
    @dtypes(torch.float32, torch.float64)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_thread_count_does_not_change_bits(self, device, dtype, dims, mode):
        args = _multi_tile_problem("zoom", dtype, device, seed=3, dims=dims)
        threads = torch.get_num_threads()
        self.addCleanup(torch.set_num_threads, threads)
        results = {}
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            # A small grain so that two threads really split every stage.
            results[num_threads] = [
                detgrid_backward(*args, mode, ZEROS, False, grain_size=grain)
                for grain in (0, 5)]
        reference = results[1][0]
        for num_threads, runs in results.items():
            for run in runs:
                assert_pair_bitwise_equal(self, run, reference,
                                          f"{num_threads} threads")

    @dtypes(*REDUCED_DTYPES)
    @parametrize("chunk_points", (0, 4096), name_fn=lambda c: f"chunk{c}")
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_reduced_precision_grad_input_equals_float32_result_rounded_once(
            self, device, dtype, dims, mode, chunk_points):
        # Half/BFloat16 upcast exactly to float32, and detgrid sums their
        # grad_input in float32 and rounds once at the end. Taps and weights
        # are computed in the dtype, as stock's forward does; on half pixels
        # of power-of-two sizes that computation is exact, so grad_input
        # must be the float32 result on the upcast inputs, rounded, bit for
        # bit, also when the sums are carried across chunks. grad_grid is
        # stock's scalar_t arithmetic instead, also across chunks.
        args = _half_pixel_problem(dtype, device, seed=4, dims=dims)
        ours = detgrid_backward(*args, mode, ZEROS, False, chunk_points=chunk_points)
        upcast = detgrid_backward(*(t.float() for t in args), mode, ZEROS, False,
                                  chunk_points=chunk_points)
        assert_bitwise_equal(self, ours[0], upcast[0].to(dtype), "grad_input")
        stock_grid = stock_reference.grid_gradient(*(t.cpu() for t in args), mode, ZEROS,
                                                   False)
        assert_bitwise_equal(self, ours[1].cpu(), stock_grid.to(dtype), "grad_grid")

    @dtypes(*ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_memory_layout_does_not_change_bits(self, device, dtype, dims, mode):
        grad_output, inp, grid = _multi_tile_problem("zoom", dtype, device, seed=9,
                                                     dims=dims)
        contiguous = detgrid_backward(grad_output, inp, grid, mode, BORDER, False)
        strided = detgrid_backward(
            strided_like(grad_output, "channels_last"),
            strided_like(inp, "channels_last"),
            strided_like(grid, "transposed"), mode, BORDER, False)
        assert_pair_bitwise_equal(self, strided, contiguous, "strided")
        # A zero-stride grad_output reads like its materialized copy.
        ones = expanded(1.0, grad_output.shape, dtype, device)
        assert_pair_bitwise_equal(
            self, detgrid_backward(ones, inp, grid, mode, BORDER, False),
            detgrid_backward(ones.contiguous(), inp, grid, mode, BORDER, False),
            "expanded")

    @onlyCPU
    @hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
    @hypothesis.given(
        batch=st.integers(1, 3), channels=st.integers(1, 3),
        in_h=st.integers(1, 9), in_w=st.integers(1, 9),
        out_h=st.integers(1, 64), out_w=st.integers(1, 64),
        mode=st.sampled_from(MODES), padding=st.sampled_from(PADDINGS),
        align_corners=st.booleans(), zoom=st.booleans(),
        dtype=st.sampled_from((torch.float32, torch.bfloat16)),
        seed=st.integers(0, 2**16))
    def test_knobs_never_change_bits_on_random_problems(
            self, device, batch, channels, in_h, in_w, out_h, out_w, mode,
            padding, align_corners, zoom, dtype, seed):
        if zoom and in_h > 2 and in_w > 2:
            args = make_zoom_problem(batch, channels, in_h, in_w, out_h, out_w,
                                     dtype=dtype, device=device, seed=seed,
                                     align_corners=align_corners)
        else:
            args = make_problem(batch, channels, in_h, in_w, out_h, out_w,
                                dtype=dtype, device=device, seed=seed)
        default = detgrid_backward(*args, mode, padding, align_corners)
        for options in ({"chunk_points": 4096}, {"grain_size": 3},
                        {"chunk_points": 8192, "grain_size": 1}):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, padding, align_corners, **options),
                default, str(options))

    # -- CUDA kernel against the host executor --------------------------------

    @onlyCUDA
    @dtypes(torch.float32, torch.float64)
    @parametrize("align_corners", (False, True))
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_cuda_kernel_matches_host_executor_bitwise(
            self, device, dtype, dims, mode, padding, align_corners):
        for kind in ("random", "zoom"):
            args = _multi_tile_problem(kind, dtype, "cpu", seed=5, dims=dims)
            on_host = detgrid_backward(*args, mode, padding, align_corners)
            on_device = detgrid_backward(*(t.to(device) for t in args), mode,
                                         padding, align_corners)
            self.assertEqual(on_device[0].device.type, "cuda")
            assert_pair_bitwise_equal(self, on_device, on_host, kind)

    @onlyCUDA
    @dtypes(*ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_cuda_launch_shape_does_not_change_bits(self, device, dtype, dims, mode):
        args = _multi_tile_problem("zoom", dtype, device, seed=6, dims=dims)
        default = detgrid_backward(*args, mode, ZEROS, False)
        for block_size in (32, 128, 512):
            for max_blocks in (1, 3, 0):
                for chunk_points in (0, 4096):
                    assert_pair_bitwise_equal(
                        self,
                        detgrid_backward(*args, mode, ZEROS, False,
                                         block_size=block_size,
                                         max_blocks=max_blocks,
                                         chunk_points=chunk_points),
                        default,
                        f"block_size={block_size} max_blocks={max_blocks} "
                        f"chunk_points={chunk_points}")

    @onlyCUDA
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_cuda_runs_on_a_side_stream_give_the_same_bits(self, device, dims):
        args = _multi_tile_problem("zoom", torch.float32, device, seed=7, dims=dims)
        default = detgrid_backward(*args, BILINEAR, ZEROS, False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            other = detgrid_backward(*args, BILINEAR, ZEROS, False)
        torch.cuda.current_stream().wait_stream(stream)
        assert_pair_bitwise_equal(self, other, default)



# ---------------------------------------------------------------------------
# The canonical order, written out in numpy float32 (IEEE round to nearest,
# one rounding per operation, no contraction).
# ---------------------------------------------------------------------------

f32 = np.float32


def _bilinear_zeros_taps(grid, *sizes):
    """Per point (flattened n, spatial position) and tap: destination (or -1
    when out of bounds), weight, and what the grid gradient needs, all in
    float32 exactly as GridSamplerDeterministic.cuh computes them for
    align_corners=False. `sizes` are the input's spatial sizes, outermost
    first: (H, W) or (D, H, W). Taps are numbered row-major over the axes,
    x fastest (k = j * 2 + i in 2-D), the weight of a tap is the product of
    its axes' weights multiplied from x outwards ((wx * wy) * wz)."""
    dims = len(sizes)
    N = grid.shape[0]
    points = grid.size // dims
    n = np.repeat(np.arange(N), points // N)

    def axis(g, size):
        coord = ((g + f32(1)) * f32(size) - f32(1)) * f32(0.5)
        low = np.floor(coord)
        weight = np.stack(((low + f32(1)) - coord, coord - low), axis=1)
        dweight = np.stack((np.full_like(coord, -1), np.full_like(coord, 1)), axis=1)
        index = np.stack((low, low + f32(1)), axis=1).astype(np.int64)
        return index, weight, dweight, f32(size) * f32(0.5)

    # axes[a] is spatial axis a (outermost first); its grid coordinate is
    # component dims - 1 - a (the grid lists x first).
    axes = [axis(grid[..., dims - 1 - a].reshape(-1), sizes[a]) for a in range(dims)]
    taps = 2 ** dims
    digits = [[(k >> (dims - 1 - a)) & 1 for a in range(dims)] for k in range(taps)]
    dest = np.full((points, taps), -1, dtype=np.int64)
    weight = np.zeros((points, taps), dtype=f32)
    for k, digit in enumerate(digits):
        inside = np.ones(points, dtype=bool)
        linear = n
        for a, (index, _, _, _) in enumerate(axes):
            inside &= (index[:, digit[a]] >= 0) & (index[:, digit[a]] < sizes[a])
            linear = linear * sizes[a] + index[:, digit[a]]
        dest[:, k] = np.where(inside, linear, -1)
        weight[:, k] = _tap_product(axes, digit, derivative_axis=None)
    return dest, weight, (axes, digits, n)


def _tap_product(axes, digit, derivative_axis):
    """Product of one tap's axis weights from x outwards, with d weight in
    place of the weight along `derivative_axis`."""
    product = None
    for a in reversed(range(len(axes))):
        _, weight, dweight, _ = axes[a]
        factor = (dweight if a == derivative_axis else weight)[:, digit[a]]
        product = factor if product is None else product * factor
    return product


def _fold(contributions, record_ids, records_per_tile, partial_len):
    """Left fold of partials, each a left fold of at most `partial_len`
    records within one tile (records_per_tile=None: tiles ignored)."""
    acc = f32(0)
    i, m = 0, len(record_ids)
    while i < m:
        tile = None if records_per_tile is None else record_ids[i] // records_per_tile
        end = min(i + partial_len, m)
        partial = f32(0)
        while i < end and (tile is None or record_ids[i] // records_per_tile == tile):
            partial = partial + contributions[i]
            i += 1
        acc = acc + partial
    return acc


def reference_grad_input(grad_output, grid, *sizes, records_per_tile,
                         partial_len):
    """grad_input of bilinear/zeros/align_corners=False in float32 (2-D, or
    3-D when `sizes` is (D, H, W)), for the given partitioning of each
    destination's records. The canonical order is records_per_tile =
    taps * 4096, partial_len = 256."""
    N, C = grad_output.shape[:2]
    go = grad_output.numpy().reshape(N, C, -1)
    out_numel = go.shape[2]
    dest, weight, _ = _bilinear_zeros_taps(grid.numpy(), *sizes)
    taps = dest.shape[1]
    destinations = N * math.prod(sizes)
    flat_dest = dest.reshape(-1)
    record_ids = np.nonzero(flat_dest >= 0)[0]
    order = np.argsort(flat_dest[record_ids], kind="stable")
    record_ids = record_ids[order]
    sorted_dest = flat_dest[record_ids]
    starts = np.searchsorted(sorted_dest, np.arange(destinations + 1))
    point = record_ids // taps
    out = np.zeros((N, C, math.prod(sizes)), dtype=f32)
    for c in range(C):
        contributions = weight.reshape(-1)[record_ids] * go[
            point // out_numel, c, point % out_numel]
        for d in range(destinations):
            begin, end = starts[d], starts[d + 1]
            if begin == end:
                continue
            n, s = divmod(d, math.prod(sizes))
            out[n, c, s] = _fold(
                contributions[begin:end], record_ids[begin:end],
                records_per_tile, partial_len)
    return torch.from_numpy(out.reshape(N, C, *sizes))


def reference_grad_grid(grad_output, inp, grid, *sizes):
    """grad_grid of bilinear/zeros/align_corners=False in float32, as stock's
    kernel orders it: channels ascending, taps in record order, each term
    ((value * dweight) * the other axes' weights, x first) * gOut, then
    times the unnormalize multiplier."""
    N, C = grad_output.shape[:2]
    out_size = grad_output.shape[2:]
    go = grad_output.numpy().reshape(N, C, -1)
    x = inp.numpy().reshape(N, C, -1)
    dims = len(sizes)
    _, _, (axes, digits, n) = _bilinear_zeros_taps(grid.numpy(), *sizes)
    points = n.shape[0]
    q = np.arange(points) % go.shape[2]
    # sums[g]: grid coordinate g (x first), i.e. spatial axis dims - 1 - g.
    sums = [np.zeros(points, dtype=f32) for _ in range(dims)]
    for c in range(C):
        gout = go[n, c, q]
        for digit in digits:
            inside = np.ones(points, dtype=bool)
            linear = np.zeros(points, dtype=np.int64)
            for a, (index, _, _, _) in enumerate(axes):
                i = index[:, digit[a]]
                inside &= (i >= 0) & (i < sizes[a])
                linear = linear * sizes[a] + np.clip(i, 0, sizes[a] - 1)
            value = x[n, c, linear]
            for g in range(dims):
                along = dims - 1 - g
                term = value * axes[along][2][:, digit[along]]
                for a in reversed(range(dims)):
                    if a != along:
                        term = term * axes[a][1][:, digit[a]]
                sums[g] = np.where(inside, sums[g] + term * gout, sums[g])
    out = np.stack([axes[dims - 1 - g][3] * sums[g] for g in range(dims)],
                   axis=1).astype(f32)
    return torch.from_numpy(out.reshape(N, *out_size, dims))


class TestCanonicalOrder(DetgridTestCase):
    # 2-D: 2 * 48 * 48 = 4608 points; 3-D: 2 * 4 * 24 * 24 = 4608 points.
    # Either way the tile boundary (point 4096) falls inside image 1, whose
    # hot pixels (voxels) collect > 1000 records before it and a few hundred
    # after.
    PROBLEMS = {
        2: dict(N=2, C=2, H=6, W=7, out_H=48, out_W=48),
        3: dict(N=2, C=2, D=4, H=5, W=6, out_D=4, out_H=24, out_W=24),
    }

    def _problem(self, dims, device="cpu"):
        return make_zoom_problem(**self.PROBLEMS[dims], dtype=torch.float32,
                                 device=device, seed=8)

    def _sizes(self, dims):
        """The input's spatial sizes, outermost first."""
        return tuple(self.PROBLEMS[dims][k] for k in ("D", "H", "W")[3 - dims:])

    def _reference_grad_input(self, dims, grad_output, grid, *, records_per_tile,
                              partial_len):
        return reference_grad_input(grad_output, grid, *self._sizes(dims),
                                    records_per_tile=records_per_tile,
                                    partial_len=partial_len)

    def _canonical_grad_input(self, dims, grad_output, grid):
        return self._reference_grad_input(
            dims, grad_output, grid,
            records_per_tile=taps_per_point(BILINEAR, dims) * TILE_POINTS,
            partial_len=RECORDS_PER_PARTIAL)

    @onlyCPU
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_problem_exercises_partials_and_tiles(self, device, dims):
        _, _, grid = self._problem(dims)
        dest, _, _ = _bilinear_zeros_taps(grid.numpy(), *self._sizes(dims))
        points = dest.shape[0]
        self.assertGreater(points, TILE_POINTS)
        counts = np.bincount(dest[dest >= 0],
                             minlength=self.PROBLEMS[dims]["N"] * math.prod(self._sizes(dims)))
        self.assertGreater(counts.max(), 4 * RECORDS_PER_PARTIAL)
        # Some destination has records on both sides of the tile boundary,
        # and a count before it that is not a multiple of 256.
        before = np.bincount(dest[:TILE_POINTS][dest[:TILE_POINTS] >= 0],
                             minlength=counts.size)
        straddling = (before > 0) & (before < counts)
        self.assertTrue((straddling & (before % RECORDS_PER_PARTIAL != 0)).any())

    @onlyCPU
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_reference_order_is_distinguishable_from_other_orders(self, device, dims):
        # If these coincided, the comparison below could not tell the
        # canonical order from a plain sequential sum.
        grad_output, _, grid = self._problem(dims)
        canonical = self._canonical_grad_input(dims, grad_output, grid)
        sequential = self._reference_grad_input(
            dims, grad_output, grid, records_per_tile=None, partial_len=1 << 62)
        no_tiles = self._reference_grad_input(
            dims, grad_output, grid, records_per_tile=None,
            partial_len=RECORDS_PER_PARTIAL)
        no_partials = self._reference_grad_input(
            dims, grad_output, grid,
            records_per_tile=taps_per_point(BILINEAR, dims) * TILE_POINTS,
            partial_len=1 << 62)
        for name, other in (("sequential", sequential), ("partials ignoring tiles", no_tiles),
                            ("tiles without partials", no_partials)):
            self.assertFalse(same_bits(canonical, other), name)

    @parametrize("chunk_points", (0, 4096), name_fn=lambda c: f"chunk{c}")
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_grad_input_follows_canonical_order_bitwise(self, device, dims, chunk_points):
        grad_output, inp, grid = self._problem(dims)
        expected = self._canonical_grad_input(dims, grad_output, grid)
        grad_input, _ = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False, chunk_points=chunk_points)
        assert_bitwise_equal(self, grad_input, expected, "grad_input")

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_grad_input_is_not_a_sequential_sum(self, device, dims):
        grad_output, inp, grid = self._problem(dims)
        sequential = self._reference_grad_input(
            dims, grad_output, grid, records_per_tile=None, partial_len=1 << 62)
        grad_input, _ = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False)
        self.assertFalse(same_bits(grad_input.cpu(), sequential))

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_grad_grid_follows_canonical_order_bitwise(self, device, dims):
        grad_output, inp, grid = self._problem(dims)
        expected = reference_grad_grid(grad_output, inp, grid, *self._sizes(dims))
        _, grad_grid = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False)
        assert_bitwise_equal(self, grad_grid, expected, "grad_grid")


instantiate_device_type_tests(TestBitwiseReproducibility, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestCanonicalOrder, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
