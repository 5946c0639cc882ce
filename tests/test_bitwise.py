# Owner(s): ["module: nn"]
"""Bitwise reproducibility of detgrid's backward, and the summation order of
the core (aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu,
Note [Deterministic grid_sampler backward]).

Equality here is of bit patterns (NaN-safe, sign of zero included): the
same inputs give the same bits whatever the build of the core
(detgrid.levels.CORE_BUILDS), the host build's launch shape and thread
count, the memory layout, the run or the device. Tests parametrized over
SAMPLERS (or dims) run for grid_sampler_2d and grid_sampler_3d; the 3-D
subtests carry a "3d" suffix."""

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
from detgrid import levels, ops
from detgrid_testing import (
    DetgridTestCase,
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    BORDER,
    MODES,
    PADDINGS,
    REDUCED_DTYPES,
    REFLECTION,
    SAMPLERS,
    ZEROS,
    assert_bitwise_equal,
    assert_pair_bitwise_equal,
    detgrid_backward,
    dims_name,
    expanded,
    make_problem,
    make_zoom_problem,
    padding_name,
    same_bits,
    sampler_name,
    snapped_grid,
    strided_like,
)

PROBLEMS = {
    # 2 * 128 * 160 = 40,960 points: two of the core's chunks of 2^19
    # records for 2-D bicubic (32,768 points of 16 taps), one for the others.
    2: dict(N=2, C=3, H=12, W=16, out_H=128, out_W=160),
    # 2 * 8 * 28 * 28 = 12,544 points: two chunks for tricubic (8,192
    # points of 64 taps), one for the others.
    3: dict(N=2, C=3, D=4, H=6, W=8, out_D=8, out_H=28, out_W=28),
}
# The chunks each (dims, mode) of SAMPLERS makes of PROBLEMS.
PROBLEM_CHUNKS = {(dims, mode): 2 if mode == BICUBIC else 1 for dims, mode in SAMPLERS}

# The host build's launch shapes (block_size, max_blocks; 0: the launch's
# own) tests turn: one thread a block, blocks of a warp in a small grid, so
# that each thread loops over many items, and a large block in one.
HOST_LAUNCH_SHAPES = ((1, 0), (32, 3), (64, 7), (512, 1))


def _problem(kind, dtype, device, seed=0, dims=2):
    """A "zoom" problem (make_zoom_problem: hot pixels whose runs of thousands
    of records are summed in stored partials) or a "random" one."""
    if kind == "zoom":
        return make_zoom_problem(**PROBLEMS[dims], dtype=dtype, device=device,
                                 seed=seed)
    return make_problem(**PROBLEMS[dims], dtype=dtype, device=device, seed=seed,
                        grid_range=1.1)


# PROBLEMS' point counts over power-of-two input sizes.
POWER_OF_TWO_SIZES = {
    2: dict(PROBLEMS[2], H=16),
    3: dict(PROBLEMS[3], H=8),
}
# Half's smallest normal number over the smallest nonzero weight of a tap
# on whole and half pixels (a trilinear 0.5 ** 3): a grad_output at least this
# large makes a term gOut * weight a normal Half, exact.
EXACT_TERM_GRAD_OUTPUT = 2.0 ** -14 / 0.5 ** 3


def _exact_term_problem(dtype, device, seed, dims, mode):
    """A zoom problem on which every term gOut * weight that the core forms in
    the dtype, as stock does, is exact: the grid on whole and half pixels of
    power-of-two sizes (whole pixels for bicubic, whose coefficients are
    then 0 and 1; see snapped_grid), grad_output no smaller in magnitude than
    EXACT_TERM_GRAD_OUTPUT."""
    grad_output, inp, grid = make_zoom_problem(**POWER_OF_TWO_SIZES[dims],
                                               dtype=torch.float64, device=device,
                                               seed=seed)
    grid = snapped_grid(grid, inp.shape[2:], 1 if mode == BICUBIC else 2)
    grad_output = grad_output.sign() * grad_output.abs().clamp(min=EXACT_TERM_GRAD_OUTPUT)
    return tuple(t.to(dtype) for t in (grad_output, inp, grid))


class TestBitwiseReproducibility(DetgridTestCase):

    @dtypes(*ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_repeated_runs_are_bitwise_identical(self, device, dtype, dims, mode):
        args = _problem("zoom", dtype, device, dims=dims)
        first = detgrid_backward(*args, mode, ZEROS, False)
        for _ in range(3):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, ZEROS, False), first)

    @dtypes(*ALL_DTYPES)
    @parametrize("kind", ("random", "zoom"))
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_every_core_build_gives_the_default_bits(self, device, dtype, dims, mode, kind):
        # The default backward runs the whole stack (levels.TOP); the core and
        # each speed level sum in its order, also over two chunks (bicubic),
        # where Half and BFloat16 sums wait in float between them.
        args = _problem(kind, dtype, device, seed=1, dims=dims)
        default = detgrid_backward(*args, mode, REFLECTION, True)
        for level in levels.CORE_BUILDS:
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, REFLECTION, True, level=level),
                default, f"level={level}")

    @onlyCPU
    @parametrize("kind", ("random", "zoom"))
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_host_launch_shape_does_not_change_bits(self, device, dims, mode, kind):
        args = _problem(kind, torch.float32, device, seed=2, dims=dims)
        default = detgrid_backward(*args, mode, ZEROS, False)
        for level in levels.CORE_BUILDS:
            for block_size, max_blocks in HOST_LAUNCH_SHAPES:
                assert_pair_bitwise_equal(
                    self,
                    detgrid_backward(*args, mode, ZEROS, False, level=level,
                                     block_size=block_size, max_blocks=max_blocks),
                    default,
                    f"level={level} block_size={block_size} max_blocks={max_blocks}")

    @onlyCPU
    @dtypes(torch.float32, torch.float64)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_thread_count_does_not_change_bits(self, device, dtype, dims, mode):
        args = _problem("zoom", dtype, device, seed=3, dims=dims)
        threads = torch.get_num_threads()
        self.addCleanup(torch.set_num_threads, threads)
        results = {}
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            # The host build runs a launch's blocks in parallel: small blocks
            # make many, so that two threads really split every launch.
            results[num_threads] = [
                detgrid_backward(*args, mode, ZEROS, False, **options)
                for options in ({}, {"block_size": 32})]
        reference = results[1][0]
        for num_threads, runs in results.items():
            for run in runs:
                assert_pair_bitwise_equal(self, run, reference,
                                          f"{num_threads} threads")

    @dtypes(*REDUCED_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_reduced_precision_grad_input_sums_its_terms_in_float_and_rounds_once(
            self, device, dtype, dims, mode):
        # The core forms each Half/BFloat16 term in the dtype, as stock does,
        # and sums the terms in float, rounded to the dtype once at the end
        # (over several chunks the sums wait in a float scratch). Where every
        # term is exact in the dtype (_exact_term_problem) grad_input must then
        # be the float32 result on the upcast inputs, rounded, bit for bit: a
        # sum rounded to the dtype on the way would differ. grad_grid is
        # stock's scalar_t arithmetic instead.
        args = _exact_term_problem(dtype, device, seed=4, dims=dims, mode=mode)
        counters = ops.work_counters(*(t.to("meta") for t in args), mode, ZEROS, False,
                                     [True, False])
        self.assertEqual(counters["chunks"], PROBLEM_CHUNKS[dims, mode])
        ours = detgrid_backward(*args, mode, ZEROS, False)
        upcast = detgrid_backward(*(t.float() for t in args), mode, ZEROS, False)
        assert_bitwise_equal(self, ours[0], upcast[0].to(dtype), "grad_input")
        stock_grid = stock_reference.grid_gradient(*(t.cpu() for t in args), mode, ZEROS,
                                                   False)
        assert_bitwise_equal(self, ours[1].cpu(), stock_grid.to(dtype), "grad_grid")

    @dtypes(*ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_memory_layout_does_not_change_bits(self, device, dtype, dims, mode):
        grad_output, inp, grid = _problem("zoom", dtype, device, seed=9, dims=dims)
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
    def test_builds_and_launch_shapes_never_change_bits_on_random_problems(
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
        for options in ({"level": levels.CORE}, {"block_size": 32, "max_blocks": 3},
                        {"level": levels.CORE, "block_size": 1, "max_blocks": 7}):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*args, mode, padding, align_corners, **options),
                default, str(options))

    # -- CUDA build against the host build ------------------------------------

    @onlyCUDA
    @dtypes(*ALL_DTYPES)
    @parametrize("align_corners", (False, True))
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_cuda_build_matches_host_build_bitwise(
            self, device, dtype, dims, mode, padding, align_corners):
        for kind in ("random", "zoom"):
            args = _problem(kind, dtype, "cpu", seed=5, dims=dims)
            for level in levels.CORE_BUILDS:
                on_host = detgrid_backward(*args, mode, padding, align_corners, level=level)
                on_device = detgrid_backward(*(t.to(device) for t in args), mode,
                                             padding, align_corners, level=level)
                self.assertEqual(on_device[0].device.type, "cuda")
                assert_pair_bitwise_equal(self, on_device, on_host, f"{kind} level={level}")

    @onlyCUDA
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_cuda_runs_on_a_side_stream_give_the_same_bits(self, device, dims):
        args = _problem("zoom", torch.float32, device, seed=7, dims=dims)
        default = detgrid_backward(*args, BILINEAR, ZEROS, False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            other = detgrid_backward(*args, BILINEAR, ZEROS, False)
        torch.cuda.current_stream().wait_stream(stream)
        assert_pair_bitwise_equal(self, other, default)


# ---------------------------------------------------------------------------
# The core's summation order, written out in numpy float32: IEEE round to
# nearest, one rounding per operation, but for the one multiply-add the
# core's builds contract (see _unnormalize).
# ---------------------------------------------------------------------------

f32 = np.float32


def fma32(a, b, c):
    """float32 a * b + c rounded once. The product of two floats is exact in
    float64; their sum with c is rounded to odd there (TwoSum finds whether it
    was exact), and 53 bits rounded to odd round correctly to 24."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bp = s - p
    e = (p - (s - bp)) + (c - bp)  # s + e == p + c exactly
    odd = (e != 0) & ((s.view(np.int64) & 1) == 0)
    s = np.where(odd, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(f32)


def _unnormalize(g, size, contract):
    """grid_sampler_unnormalize for align_corners=False in float32:
    ((g + 1) * size - 1) / 2, its multiply-add fused where `contract` (nvcc
    contracts it, and so does the core's host build where the CPU has FMA:
    torch.ops.detgrid._core_host_contracts()), each operation rounded
    otherwise (the grid gradient's builds, -fmad=false and -ffp-contract=off)."""
    if contract:
        return fma32(g + f32(1), f32(size), f32(-1)) * f32(0.5)
    return ((g + f32(1)) * f32(size) - f32(1)) * f32(0.5)


def _bilinear_zeros_taps(grid, *sizes, contract):
    """Per point (flattened n, spatial position) and tap: destination (or -1
    when out of bounds), weight, and what the grid gradient needs, all in
    float32 exactly as the core's records kernels (and stock's kernels)
    compute them for align_corners=False. `sizes` are the input's spatial
    sizes, outermost first: (H, W) or (D, H, W). Taps are numbered row-major
    over the axes, x fastest (k = j * 2 + i in 2-D), the weight of a tap is
    the product of its axes' weights multiplied from x outwards
    ((wx * wy) * wz)."""
    dims = len(sizes)
    N = grid.shape[0]
    points = grid.size // dims
    n = np.repeat(np.arange(N), points // N)

    def axis(g, size):
        coord = _unnormalize(g, size, contract)
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


def _starts(new):
    """For each position, the last position at or before it where `new` is True."""
    return np.maximum.accumulate(np.where(new, np.arange(new.size), 0))


def _in_ascending_groups(keys):
    """Index arrays of the positions holding each value of `keys` (small
    non-negative integers), for each value in ascending order."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(keys.max() + 2))
    return [order[bounds[k]:bounds[k + 1]] for k in range(keys.max() + 1)]


def reference_grad_input(grad_output, grid, *sizes, chunk_records, partial_len,
                         contract):
    """grad_input of bilinear/zeros/align_corners=False in float32 (2-D, or
    3-D when `sizes` is (D, H, W)) for the given partition of each element's
    records. An element's records, in ascending record id (point * taps +
    tap), split where the chunk (record id // chunk_records; None: one
    chunk) changes, and each chunk's run of them into partials of up to
    `partial_len` records (None: one), each a left fold from 0 of the terms
    weight * gOut; the element is the left fold from 0 of its partials in
    order. The core's order: chunk_records CORE_CHUNK_RECORDS (for up to
    2048 channels), partial_len CORE_PARTIAL_RECORDS. `contract`: see
    _unnormalize."""
    N, C = grad_output.shape[:2]
    go = grad_output.numpy().reshape(N, C, -1)
    out_numel = go.shape[2]
    dest, weight, _ = _bilinear_zeros_taps(grid.numpy(), *sizes, contract=contract)
    taps = dest.shape[1]
    flat_dest = dest.reshape(-1)
    ids = np.nonzero(flat_dest >= 0)[0]
    ids = ids[np.argsort(flat_dest[ids], kind="stable")]
    element = flat_dest[ids]
    chunk = ids // chunk_records if chunk_records else np.zeros_like(ids)
    records = np.arange(ids.size)
    new_run = np.ones(ids.size, dtype=bool)
    new_run[1:] = (element[1:] != element[:-1]) | (chunk[1:] != chunk[:-1])
    offset = records - _starts(new_run)
    if partial_len:
        offset %= partial_len
    partial = np.cumsum(offset == 0) - 1
    point = ids // taps
    terms = (weight.reshape(-1)[ids] * go[point // out_numel, :, point % out_numel].T)
    partials = np.zeros((C, partial[-1] + 1), dtype=f32)
    for at_offset in _in_ascending_groups(offset):  # one record of each partial
        partials[:, partial[at_offset]] += terms[:, at_offset]
    partial_element = element[offset == 0]
    new_element = np.ones(partial_element.size, dtype=bool)
    new_element[1:] = partial_element[1:] != partial_element[:-1]
    rank = np.arange(partial_element.size) - _starts(new_element)
    out = np.zeros((C, N * math.prod(sizes)), dtype=f32)
    for at_rank in _in_ascending_groups(rank):  # one partial of each element
        out[:, partial_element[at_rank]] += partials[:, at_rank]
    return torch.from_numpy(out.reshape(C, N, -1).transpose(1, 0, 2).reshape(N, C, *sizes))


def reference_grad_grid(grad_output, inp, grid, *sizes):
    """grad_grid of bilinear/zeros/align_corners=False in float32, as stock's
    kernel orders it: channels ascending, taps in record order, each term
    ((value * dweight) * the other axes' weights, x first) * gOut, then
    times the unnormalize multiplier. No operation is contracted
    (GridGradient.cu's builds)."""
    N, C = grad_output.shape[:2]
    out_size = grad_output.shape[2:]
    go = grad_output.numpy().reshape(N, C, -1)
    x = inp.numpy().reshape(N, C, -1)
    dims = len(sizes)
    _, _, (axes, digits, n) = _bilinear_zeros_taps(grid.numpy(), *sizes, contract=False)
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


def _contracts(device_type):
    """Whether the core's build on this device contracts the unnormalize's
    multiply-add: nvcc does; the host build where the CPU has FMA."""
    return device_type == "cuda" or torch.ops.detgrid._core_host_contracts()


class TestSummationOrder(DetgridTestCase):
    # Two of the core's chunks of 2^19 records: 2-D, 2 * 256 * 272 =
    # 139,264 points of 4 taps, chunk 1 from point 131,072; 3-D, 2 * 4 * 96 *
    # 96 = 73,728 points of 8 taps, chunk 1 from point 65,536. Either way the
    # boundary falls inside image 1, whose hot pixels (voxels) collect tens of
    # thousands of records before it and thousands after.
    PROBLEMS = {
        2: dict(N=2, C=2, H=6, W=7, out_H=256, out_W=272),
        3: dict(N=2, C=2, D=4, H=5, W=6, out_D=4, out_H=96, out_W=96),
    }
    # The orders tests compare, by name: (chunk_records, partial_len).
    ORDERS = {
        "core": (ops.CORE_CHUNK_RECORDS, ops.CORE_PARTIAL_RECORDS),
        "sequential": (None, None),
        "partials ignoring chunks": (None, ops.CORE_PARTIAL_RECORDS),
        "chunks without partials": (ops.CORE_CHUNK_RECORDS, None),
    }
    _references = {}

    def _problem(self, dims):
        return make_zoom_problem(**self.PROBLEMS[dims], dtype=torch.float32, seed=8)

    def _sizes(self, dims):
        """The input's spatial sizes, outermost first."""
        return tuple(self.PROBLEMS[dims][k] for k in ("D", "H", "W")[3 - dims:])

    def _reference(self, dims, order, contract):
        """reference_grad_input of the problem in one of ORDERS (computed once)."""
        key = (dims, order, contract)
        if key not in self._references:
            grad_output, _, grid = self._problem(dims)
            chunk_records, partial_len = self.ORDERS[order]
            self._references[key] = reference_grad_input(
                grad_output, grid, *self._sizes(dims), chunk_records=chunk_records,
                partial_len=partial_len, contract=contract)
        return self._references[key]

    @onlyCPU
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_problem_exercises_partials_and_chunks(self, device, dims):
        grad_output, inp, grid = self._problem(dims)
        counters = ops.work_counters(grad_output.to("meta"), inp.to("meta"),
                                     grid.to("meta"), BILINEAR, ZEROS, False, [True, False])
        self.assertEqual(counters["chunks"], 2)
        dest, _, _ = _bilinear_zeros_taps(grid.numpy(), *self._sizes(dims),
                                          contract=_contracts(device))
        counts = np.bincount(dest[dest >= 0],
                             minlength=self.PROBLEMS[dims]["N"] * math.prod(self._sizes(dims)))
        self.assertGreater(counts.max(), 4 * ops.CORE_PARTIAL_RECORDS)
        # Some element has records on both sides of the chunk boundary, and a
        # count before it that is not a multiple of a partial.
        first_chunk = dest[:ops.CORE_CHUNK_RECORDS // dest.shape[1]]
        before = np.bincount(first_chunk[first_chunk >= 0], minlength=counts.size)
        straddling = (before > 0) & (before < counts)
        self.assertTrue((straddling & (before % ops.CORE_PARTIAL_RECORDS != 0)).any())

    @onlyCPU
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_reference_order_is_distinguishable_from_other_orders(self, device, dims):
        # If these coincided, the comparison below could not tell the core's
        # order from another, or the contracted unnormalize from a rounded one.
        contract = _contracts(device)
        core = self._reference(dims, "core", contract)
        for order in self.ORDERS:
            if order != "core":
                self.assertFalse(same_bits(core, self._reference(dims, order, contract)),
                                 order)
        self.assertFalse(same_bits(core, self._reference(dims, "core", not contract)),
                         "the other contraction")

    @parametrize("level", levels.CORE_BUILDS)
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_grad_input_follows_the_cores_order_bitwise(self, device, dims, level):
        grad_output, inp, grid = self._problem(dims)
        expected = self._reference(dims, "core", _contracts(self.device_type))
        grad_input, _ = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False, level=level)
        assert_bitwise_equal(self, grad_input, expected, "grad_input")

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_grad_input_is_not_a_sequential_sum(self, device, dims):
        grad_output, inp, grid = self._problem(dims)
        sequential = self._reference(dims, "sequential", _contracts(self.device_type))
        grad_input, _ = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False)
        self.assertFalse(same_bits(grad_input.cpu(), sequential))

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_grad_grid_follows_stocks_order_bitwise(self, device, dims):
        grad_output, inp, grid = self._problem(dims)
        expected = reference_grad_grid(grad_output, inp, grid, *self._sizes(dims))
        _, grad_grid = detgrid_backward(
            grad_output.to(device), inp.to(device), grid.to(device), BILINEAR,
            ZEROS, False)
        assert_bitwise_equal(self, grad_grid, expected, "grad_grid")


instantiate_device_type_tests(TestBitwiseReproducibility, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestSummationOrder, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
