# Owner(s): ["module: nn"]
"""Bitwise reproducibility of detgrid's backward, and the canonical
summation order it promises (GridSamplerDeterministic.cu, invariant (a)).

Equality here is of bit patterns (NaN-safe, sign of zero included): the
same inputs give the same bits whatever the thread count, grain size,
chunk size, CUDA launch shape or device."""

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
    TAPS_PER_POINT,
    TILE_POINTS,
    ZEROS,
    assert_bitwise_equal,
    assert_pair_bitwise_equal,
    detgrid_backward,
    expanded,
    make_problem,
    make_zoom_problem,
    mode_name,
    padding_name,
    same_bits,
    strided_like,
)

# 2 * 64 * 80 = 10240 points: three tiles, the last one partial.
MULTI_TILE = dict(N=2, C=3, H=12, W=16, out_H=64, out_W=80)


def _multi_tile_problem(kind, dtype, device, seed=0):
    if kind == "zoom":
        return make_zoom_problem(**MULTI_TILE, dtype=dtype, device=device, seed=seed)
    return make_problem(**MULTI_TILE, dtype=dtype, device=device, seed=seed,
                        grid_range=1.1)


class TestBitwiseReproducibility(DetgridTestCase):

    def _problem_points(self, args):
        grad_output = args[0]
        return grad_output.shape[0] * grad_output.shape[2] * grad_output.shape[3]

    @dtypes(*ALL_DTYPES)
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_repeated_runs_are_bitwise_identical(self, device, dtype, mode):
        args = _multi_tile_problem("zoom", dtype, device)
        first = detgrid_backward(*args, mode, ZEROS, False)
        for _ in range(3):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, ZEROS, False), first)

    @dtypes(*ALL_DTYPES)
    @parametrize("kind", ("random", "zoom"))
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_chunk_points_do_not_change_bits(self, device, dtype, mode, kind):
        args = _multi_tile_problem(kind, dtype, device, seed=1)
        self.assertGreater(self._problem_points(args), 2 * TILE_POINTS)
        # The default is one chunk here; 4096 and 8192 give three and two
        # (for Half/BFloat16 that means a float32 carry between chunks).
        single = detgrid_backward(*args, mode, REFLECTION, True)
        for chunk_points in (4096, 8192, 3 * 4096):
            assert_pair_bitwise_equal(
                self,
                detgrid_backward(*args, mode, REFLECTION, True,
                                 chunk_points=chunk_points),
                single, f"chunk_points={chunk_points}")

    @onlyCPU
    @parametrize("kind", ("random", "zoom"))
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_grain_size_does_not_change_bits(self, device, mode, kind):
        args = _multi_tile_problem(kind, torch.float32, device, seed=2)
        default = detgrid_backward(*args, mode, ZEROS, False)
        for grain_size in (1, 7, 64):
            assert_pair_bitwise_equal(
                self,
                detgrid_backward(*args, mode, ZEROS, False, grain_size=grain_size),
                default, f"grain_size={grain_size}")

    @onlyCPU
    @dtypes(torch.float32, torch.float64)
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_thread_count_does_not_change_bits(self, device, dtype, mode):
        args = _multi_tile_problem("zoom", dtype, device, seed=3)
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
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_reduced_precision_equals_float32_result_rounded_once(
            self, device, dtype, mode, chunk_points):
        # Half/BFloat16 upcast exactly to float32, and detgrid computes
        # their gradients in float32 and rounds once at the end: the result
        # must be the float32 result on the upcast inputs, rounded, bit for
        # bit, also when the sums are carried across chunks.
        args = _multi_tile_problem("zoom", dtype, device, seed=4)
        ours = detgrid_backward(*args, mode, ZEROS, False, chunk_points=chunk_points)
        upcast = detgrid_backward(*(t.float() for t in args), mode, ZEROS, False,
                                  chunk_points=chunk_points)
        assert_pair_bitwise_equal(self, ours, tuple(t.to(dtype) for t in upcast))

    @dtypes(*ALL_DTYPES)
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_memory_layout_does_not_change_bits(self, device, dtype, mode):
        grad_output, inp, grid = _multi_tile_problem("zoom", dtype, device, seed=9)
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
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_cuda_kernel_matches_host_executor_bitwise(self, device, dtype, mode,
                                                        padding, align_corners):
        for kind in ("random", "zoom"):
            args = _multi_tile_problem(kind, dtype, "cpu", seed=5)
            on_host = detgrid_backward(*args, mode, padding, align_corners)
            on_device = detgrid_backward(*(t.to(device) for t in args), mode,
                                         padding, align_corners)
            self.assertEqual(on_device[0].device.type, "cuda")
            assert_pair_bitwise_equal(self, on_device, on_host, kind)

    @onlyCUDA
    @dtypes(*ALL_DTYPES)
    @parametrize("mode", MODES, name_fn=mode_name)
    def test_cuda_launch_shape_does_not_change_bits(self, device, dtype, mode):
        args = _multi_tile_problem("zoom", dtype, device, seed=6)
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
    def test_cuda_runs_on_a_side_stream_give_the_same_bits(self, device):
        args = _multi_tile_problem("zoom", torch.float32, device, seed=7)
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


def _bilinear_zeros_taps(grid, H, W):
    """Per point (flattened n, h, w) and tap k = j * 2 + i: destination
    (or -1 when out of bounds), weight, and what the grid gradient needs,
    all in float32 exactly as GridSamplerDeterministic.cuh computes them
    for align_corners=False."""
    N = grid.shape[0]
    gx = grid[..., 0].reshape(-1)
    gy = grid[..., 1].reshape(-1)
    points = gx.shape[0]
    n = np.repeat(np.arange(N), points // N)

    def axis(g, size):
        coord = ((g + f32(1)) * f32(size) - f32(1)) * f32(0.5)
        low = np.floor(coord)
        weight = np.stack(((low + f32(1)) - coord, coord - low), axis=1)
        dweight = np.stack((np.full_like(coord, -1), np.full_like(coord, 1)), axis=1)
        index = np.stack((low, low + f32(1)), axis=1).astype(np.int64)
        return index, weight, dweight, f32(size) * f32(0.5)

    ix, wx, dwx, mult_x = axis(gx, W)
    iy, wy, dwy, mult_y = axis(gy, H)
    dest = np.full((points, 4), -1, dtype=np.int64)
    weight = np.zeros((points, 4), dtype=f32)
    for j in range(2):
        for i in range(2):
            k = j * 2 + i
            inside = (ix[:, i] >= 0) & (ix[:, i] < W) & (iy[:, j] >= 0) & (iy[:, j] < H)
            dest[:, k] = np.where(inside, n * H * W + iy[:, j] * W + ix[:, i], -1)
            weight[:, k] = wx[:, i] * wy[:, j]
    axes = (ix, wx, dwx, mult_x, iy, wy, dwy, mult_y, n)
    return dest, weight, axes


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


def reference_grad_input(grad_output, grid, H, W, *, records_per_tile,
                         partial_len):
    """grad_input of bilinear/zeros/align_corners=False in float32, for the
    given partitioning of each destination's records. The canonical order
    is records_per_tile=4 * 4096, partial_len=256."""
    go = grad_output.numpy()
    N, C, out_H, out_W = go.shape
    dest, weight, _ = _bilinear_zeros_taps(grid.numpy(), H, W)
    flat_dest = dest.reshape(-1)
    record_ids = np.nonzero(flat_dest >= 0)[0]
    order = np.argsort(flat_dest[record_ids], kind="stable")
    record_ids = record_ids[order]
    sorted_dest = flat_dest[record_ids]
    starts = np.searchsorted(sorted_dest, np.arange(N * H * W + 1))
    point = record_ids // 4
    q = point % (out_H * out_W)
    out = np.zeros((N, C, H, W), dtype=f32)
    for c in range(C):
        contributions = weight.reshape(-1)[record_ids] * go[
            point // (out_H * out_W), c, q // out_W, q % out_W]
        for d in range(N * H * W):
            begin, end = starts[d], starts[d + 1]
            if begin == end:
                continue
            n, s = divmod(d, H * W)
            out[n, c, s // W, s % W] = _fold(
                contributions[begin:end], record_ids[begin:end],
                records_per_tile, partial_len)
    return torch.from_numpy(out)


def reference_grad_grid(grad_output, inp, grid, H, W):
    """grad_grid of bilinear/zeros/align_corners=False in float32: channels
    ascending, taps in record order, (value * dweight) * gOut, then times
    the unnormalize multiplier."""
    go = grad_output.numpy()
    x = inp.numpy()
    N, C, out_H, out_W = go.shape
    _, _, (ix, wx, dwx, mult_x, iy, wy, dwy, mult_y, n) = _bilinear_zeros_taps(
        grid.numpy(), H, W)
    points = ix.shape[0]
    q = np.arange(points) % (out_H * out_W)
    gx = np.zeros(points, dtype=f32)
    gy = np.zeros(points, dtype=f32)
    for c in range(C):
        gout = go[n, c, q // out_W, q % out_W]
        for j in range(2):
            for i in range(2):
                inside = (ix[:, i] >= 0) & (ix[:, i] < W) & (iy[:, j] >= 0) & (iy[:, j] < H)
                value = x[n, c, np.clip(iy[:, j], 0, H - 1), np.clip(ix[:, i], 0, W - 1)]
                dx = dwx[:, i] * wy[:, j]
                dy = wx[:, i] * dwy[:, j]
                gx = np.where(inside, gx + (value * dx) * gout, gx)
                gy = np.where(inside, gy + (value * dy) * gout, gy)
    out = np.stack((mult_x * gx, mult_y * gy), axis=1).astype(f32)
    return torch.from_numpy(out.reshape(N, out_H, out_W, 2))


class TestCanonicalOrder(DetgridTestCase):
    # 2 * 48 * 48 = 4608 points: the tile boundary (point 4096) falls inside
    # image 1, whose hot pixels collect > 1000 records before it and a few
    # hundred after.
    N, C, H, W, OUT_H, OUT_W = 2, 2, 6, 7, 48, 48

    def _problem(self, device="cpu"):
        return make_zoom_problem(self.N, self.C, self.H, self.W, self.OUT_H,
                                 self.OUT_W, dtype=torch.float32, device=device,
                                 seed=8)

    @onlyCPU
    def test_problem_exercises_partials_and_tiles(self, device):
        _, _, grid = self._problem()
        dest, _, _ = _bilinear_zeros_taps(grid.numpy(), self.H, self.W)
        points = dest.shape[0]
        self.assertGreater(points, TILE_POINTS)
        counts = np.bincount(dest[dest >= 0], minlength=self.N * self.H * self.W)
        self.assertGreater(counts.max(), 4 * RECORDS_PER_PARTIAL)
        # Some destination has records on both sides of the tile boundary,
        # and a count before it that is not a multiple of 256.
        before = np.bincount(dest[:TILE_POINTS][dest[:TILE_POINTS] >= 0],
                             minlength=counts.size)
        straddling = (before > 0) & (before < counts)
        self.assertTrue((straddling & (before % RECORDS_PER_PARTIAL != 0)).any())

    @onlyCPU
    def test_reference_order_is_distinguishable_from_other_orders(self, device):
        # If these coincided, the comparison below could not tell the
        # canonical order from a plain sequential sum.
        grad_output, _, grid = self._problem()
        canonical = reference_grad_input(
            grad_output, grid, self.H, self.W,
            records_per_tile=TAPS_PER_POINT[BILINEAR] * TILE_POINTS,
            partial_len=RECORDS_PER_PARTIAL)
        sequential = reference_grad_input(
            grad_output, grid, self.H, self.W, records_per_tile=None,
            partial_len=1 << 62)
        no_tiles = reference_grad_input(
            grad_output, grid, self.H, self.W, records_per_tile=None,
            partial_len=RECORDS_PER_PARTIAL)
        no_partials = reference_grad_input(
            grad_output, grid, self.H, self.W,
            records_per_tile=TAPS_PER_POINT[BILINEAR] * TILE_POINTS,
            partial_len=1 << 62)
        for name, other in (("sequential", sequential), ("partials ignoring tiles", no_tiles),
                            ("tiles without partials", no_partials)):
            self.assertFalse(same_bits(canonical, other), name)

    @parametrize("chunk_points", (0, 4096), name_fn=lambda c: f"chunk{c}")
    def test_grad_input_follows_canonical_order_bitwise(self, device, chunk_points):
        grad_output, inp, grid = self._problem()
        expected = reference_grad_input(
            grad_output, grid, self.H, self.W,
            records_per_tile=TAPS_PER_POINT[BILINEAR] * TILE_POINTS,
            partial_len=RECORDS_PER_PARTIAL)
        grad_input, _ = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False, chunk_points=chunk_points)
        assert_bitwise_equal(self, grad_input, expected, "grad_input")

    def test_grad_input_is_not_a_sequential_sum(self, device):
        grad_output, inp, grid = self._problem()
        sequential = reference_grad_input(
            grad_output, grid, self.H, self.W, records_per_tile=None,
            partial_len=1 << 62)
        grad_input, _ = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False)
        self.assertFalse(same_bits(grad_input.cpu(), sequential))

    def test_grad_grid_follows_canonical_order_bitwise(self, device):
        grad_output, inp, grid = self._problem()
        expected = reference_grad_grid(grad_output, inp, grid, self.H, self.W)
        _, grad_grid = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False)
        assert_bitwise_equal(self, grad_grid, expected, "grad_grid")


instantiate_device_type_tests(TestBitwiseReproducibility, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestCanonicalOrder, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
