# Owner(s): ["module: nn"]
"""The core (aten_kernels/aten/, issue 59): the deterministic backward
written as plain PyTorch CUDA on the existing coordinate helpers, run here
by its host build, which setup.py makes from the same source bytes
(aten_kernels/hostify/). Its grad_input is checked against a serial run of
the existing CUDA kernel's arithmetic built on the same helpers
(hostify/existing_kernel_reference.cpp), non-finite and huge coordinates
included, 5-D bicubic (tricubic) against tests/stock_reference.py's float64
sums, and its bits against every launch shape and thread order."""

import hashlib
import itertools
import os
import re
import unittest

import detgrid.ops  # noqa: F401  (registers torch.ops.detgrid)
import stock_reference
import torch
from detgrid import levels
from detgrid.kit import stack
from golden import core as golden_core
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "aten_kernels", "aten", "src", "ATen", "native", "cuda",
                      "GridSamplerDeterministic.cu")
ops = torch.ops.detgrid

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
MODES_2D = (BILINEAR, NEAREST, BICUBIC)
MODES_3D = (BILINEAR, NEAREST, BICUBIC)
# The 5-D modes of the existing kernel's host run (existing_kernel_reference.cpp);
# tricubic is checked against tests/stock_reference.py.
EXISTING_KERNEL_MODES_3D = (BILINEAR, NEAREST)
PADDINGS = (0, 1, 2)  # zeros, border, reflection
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# grad_input against the existing kernel's serial sums in the same dtype:
# those round every add to the dtype, ours once.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 2e-2,
             torch.bfloat16: 1e-1}
# Coordinates the existing kernel's helpers treat specially: non-finite, far
# beyond int's range, beyond 2^31 pixels, and ordinary ones beside them.
HOSTILE = (float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 3e9, -3e9, 0.5, -0.9, 1.0)

# Under .ci/sanitize.sh (g++ with UBSan's float-cast-overflow), coordinates
# that make the existing helpers convert a NaN or an out-of-range float to
# int are left out: that conversion is undefined on the host, where the GPU
# saturates (clang's -fno-strict-float-cast-overflow would define it).
# The sanitizers look for memory errors, which one dtype's run of the large
# cases meets as well as four; the other dtypes run them in the main suite.
UNDER_SANITIZERS = os.environ.get("DETGRID_SANITIZERS") == "1"
MAIN_SUITE_ONLY = "under the sanitizers one dtype runs the large cases"

# At this many records a chunk ends (kMaxChunkRecords); bilinear has 4 per point.
CHUNK_RECORDS = 1 << 19


def problem(dims, dtype, points=(7, 9), image=(5, 6), channels=3, batch=2, seed=0,
            coordinates=None):
    """(grad_output, input, grid) with grid values in [-1.2, 1.2], or drawn
    from `coordinates`."""
    gen = torch.Generator().manual_seed(seed)
    if dims == 3:
        points, image = points + (3,), image + (4,)
    inp = torch.randn((batch, channels) + image, generator=gen, dtype=torch.float64)
    grid_shape = (batch,) + points + (dims,)
    if coordinates is None:
        grid = torch.rand(grid_shape, generator=gen, dtype=torch.float64) * 2.4 - 1.2
    else:
        values = torch.tensor(coordinates, dtype=torch.float64)
        grid = values[torch.randint(0, len(values), grid_shape, generator=gen)]
    grad_output = torch.randn((batch, channels) + points, generator=gen, dtype=torch.float64)
    return grad_output.to(dtype), inp.to(dtype), grid.to(dtype)


def cases(dims, existing_kernel=False):
    """(mode, padding, align_corners) of every case; existing_kernel: only the
    modes existing_kernel_reference.cpp runs."""
    modes = MODES_2D if dims == 2 else (EXISTING_KERNEL_MODES_3D if existing_kernel
                                        else MODES_3D)
    return itertools.product(modes, PADDINGS, (False, True))


def same_bits(a, b):
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


class TestCore(TestCase):
    def test_host_build_compiles_the_patch_source_bytes(self):
        with open(SOURCE, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        self.assertEqual(ops._core_source_sha256(), digest)

    def test_each_build_compiles_its_prefix_of_the_stack(self):
        # The host build of each level compiles exactly the bytes of the
        # core's file with the speed levels' diffs up to it applied.
        self.assertEqual(tuple(ops._core_builds()), levels.CORE_BUILDS)
        digests = set()
        for level in levels.CORE_BUILDS:
            (text,) = stack.core_sources(ROOT, upto=level).values()
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            with self.subTest(level=level):
                self.assertEqual(ops._core_source_sha256(level), digest)
            digests.add(digest)
        self.assertEqual(len(digests), len(levels.CORE_BUILDS))

    def test_an_unknown_level_is_refused_in_one_line(self):
        args = problem(2, torch.float32) + (BILINEAR, 0, False)
        message = ("^core: no build of the core named 'no-such-level'; the builds are "
                   + re.escape(", ".join(levels.CORE_BUILDS)) + "$")
        calls = {
            "_core_grad_input": lambda: ops._core_grad_input(*args, level="no-such-level"),
            "_core_counters": lambda: ops._core_counters(*args, level="no-such-level"),
            "_core_source_sha256": lambda: ops._core_source_sha256("no-such-level"),
        }
        for name, call in calls.items():
            with self.subTest(op=name):
                with self.assertRaisesRegex(RuntimeError, message):
                    call()
        levels_message = ("unknown level 'no-such-level'; the levels are "
                          + re.escape(", ".join(levels.CORE_BUILDS)) + "$")
        python_calls = {
            "grid_sampler_2d_backward_with_options":
                lambda: detgrid.ops.grid_sampler_2d_backward_with_options(
                    *args, [True, False], level="no-such-level"),
            "work_counters": lambda: detgrid.ops.work_counters(
                *args, [True, False], level="no-such-level"),
        }
        for name, call in python_calls.items():
            with self.subTest(op=name):
                with self.assertRaisesRegex(ValueError,
                                            f"^{name}\\(\\): {levels_message}"):
                    call()

    @parametrize("dims", (2, 3))
    @parametrize("dtype", DTYPES)
    def test_grad_input_is_the_existing_kernels(self, dims, dtype):
        for mode, padding, align in cases(dims, existing_kernel=True):
            args = problem(dims, dtype, seed=mode * 10 + padding) + (mode, padding, align)
            ours = ops._core_grad_input(*args)
            existing = ops._existing_kernel_reference(*args)
            with self.subTest(mode=mode, padding=padding, align_corners=align):
                self.assertEqual(ours.double(), existing.double(), atol=TOLERANCE[dtype],
                                 rtol=TOLERANCE[dtype])

    @parametrize("dims", (2, 3))
    def test_existing_kernel_reference_agrees_with_the_cpu_kernel(self, dims):
        # The reference itself, where aten's CPU kernel computes the same
        # function (finite coordinates, float64).
        backward = (torch.ops.aten.grid_sampler_2d_backward if dims == 2
                    else torch.ops.aten.grid_sampler_3d_backward)
        for mode, padding, align in cases(dims, existing_kernel=True):
            args = problem(dims, torch.float64, seed=padding) + (mode, padding, align)
            with self.subTest(mode=mode, padding=padding, align_corners=align):
                self.assertEqual(ops._existing_kernel_reference(*args),
                                 backward(*args, [True, False])[0])

    @parametrize("dims", (2, 3))
    @parametrize("dtype", (torch.float64, torch.float32))
    @unittest.skipIf(UNDER_SANITIZERS, "NaN and huge flip counts convert to int (undefined "
                     "on the host with g++)")
    def test_non_finite_and_huge_coordinates_give_the_existing_kernels_result(
            self, dims, dtype):
        # The same NaN and infinity in the same elements (bicubic with border
        # or reflection padding puts a NaN coordinate's terms on an edge
        # pixel), and the same finite values.
        for mode, padding, align in cases(dims, existing_kernel=True):
            args = problem(dims, dtype, points=(9, 9), image=(4, 5), channels=2, batch=1,
                           seed=padding, coordinates=HOSTILE) + (mode, padding, align)
            ours = ops._core_grad_input(*args)
            existing = ops._existing_kernel_reference(*args)
            with self.subTest(mode=mode, padding=padding, align_corners=align):
                self.assertEqual(ours.isnan(), existing.isnan())
                self.assertEqual(ours.isinf(), existing.isinf())
                finite = ours.isfinite()
                self.assertEqual(ours[finite], existing[finite], atol=1e-4, rtol=1e-4)

    def test_bicubic_nan_coordinate_reaches_an_edge_pixel_under_border_padding(self):
        grad_output, inp, grid = problem(2, torch.float64, points=(1, 1), image=(4, 4),
                                         channels=1, batch=1)
        grid[...] = float("nan")
        ours = ops._core_grad_input(grad_output, inp, grid, BICUBIC, 1, False)
        self.assertTrue(ours[0, 0, 0, 0].isnan())
        self.assertEqual(ours.isnan().sum().item(), 1)

    @parametrize("dtype", DTYPES)
    def test_bits_do_not_depend_on_launch_shape_or_thread_order(self, dtype):
        if UNDER_SANITIZERS and dtype != torch.float16:
            self.skipTest(MAIN_SUITE_ONLY)
        # Two chunks, a hot position (every point on it) and ordinary ones.
        grad_output, inp, grid = problem(2, dtype, points=(400, 400), image=(8, 8),
                                         channels=2, batch=1, seed=3)
        grid[0, :200, :, :] = 0.0
        shapes = ((0, 0, 0), (32, 0, 0), (0, 7, 0), (64, 3, 11), (256, 0, 5), (1, 1, 1))
        results = [ops._core_grad_input(grad_output, inp, grid, BILINEAR, 0, False,
                                             *shape) for shape in shapes]
        for shape, result in zip(shapes[1:], results[1:]):
            with self.subTest(block_size=shape[0], grid_size=shape[1], seed=shape[2]):
                self.assertTrue(same_bits(result, results[0]))

    @parametrize("dims", (2, 3))
    def test_bitwise_reproducible_over_runs(self, dims):
        for mode, padding, align in cases(dims):
            args = problem(dims, torch.float32, seed=1) + (mode, padding, align)
            first = ops._core_grad_input(*args)
            with self.subTest(mode=mode, padding=padding, align_corners=align):
                for _ in range(3):
                    self.assertTrue(same_bits(ops._core_grad_input(*args), first))

    @parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
    def test_sums_over_several_chunks_match_the_float64_sum(self, dtype):
        if UNDER_SANITIZERS and dtype != torch.float16:
            self.skipTest(MAIN_SUITE_ONLY)
        # 360,000 points: three chunks; Half and BFloat16 sums wait in float.
        grad_output, inp, grid = problem(2, dtype, points=(600, 600), image=(16, 16),
                                         channels=2, batch=1, seed=4)
        ours = ops._core_grad_input(grad_output, inp, grid, BILINEAR, 0, False)
        exact = ops._existing_kernel_reference(grad_output.double(), inp.double(),
                                               grid.double(), BILINEAR, 0, False)
        counters = ops._core_counters(grad_output.to("meta"), inp.to("meta"),
                                      grid.to("meta"), BILINEAR, 0, False)
        self.assertGreater(counters[1], 2 * CHUNK_RECORDS)  # items sorted: 3 chunks
        # Relative to the largest element: each term carries the dtype's
        # rounding of its coordinate and product, the sum only one rounding.
        scale = exact.abs().max()
        bound = {torch.float16: 1e-2, torch.bfloat16: 8e-2, torch.float32: 1e-5}[dtype]
        self.assertLess(((ours.double() - exact).abs().max() / scale).item(), bound)

    def test_constant_grid_is_summed_in_bounded_partials(self):
        # A million points on one pixel's corner: every output element equals
        # the float64 sum, and the call runs in eight chunks, five launches each.
        grad_output, inp, _ = problem(2, torch.float32, points=(1024, 1024), image=(2, 2),
                                      channels=1, batch=1)
        grid = torch.zeros(1, 1024, 1024, 2)
        ours = ops._core_grad_input(grad_output, inp, grid, BILINEAR, 0, False)
        exact = grad_output.double().sum() * 0.25
        self.assertEqual(ours.double(), exact.expand(1, 1, 2, 2), atol=1e-3, rtol=1e-5)
        counted = detgrid.ops.work_counters(grad_output, inp, grid, BILINEAR, 0, False,
                                            [True, False], level="core")
        self.assertEqual(counted["items_sorted"], 4 * 1024 * 1024)
        self.assertEqual(counted["launches"], 5 * (counted["items_sorted"] // CHUNK_RECORDS))
        # Each chunk's run of 2^17 records per pixel: a first partial of 256
        # records, then 511 stored partials.
        self.assertEqual(counted["longest_fold"], 256 + 511)

    @parametrize("seed", range(6))
    def test_clustered_grids_sum_to_the_float64_total(self, seed):
        # Points piled on a few positions in runs of every length around the
        # partial size (255 .. 513 records and longer), beside scattered
        # ones: every run's partials, stored or folded, are summed once.
        gen = torch.Generator().manual_seed(seed)
        grad_output, inp, grid = problem(2, torch.float64, points=(300, 300), image=(6, 7),
                                         channels=2, batch=2, seed=seed)
        flat = grid.view(-1, 2)
        hot = torch.rand(5, 2, generator=gen, dtype=torch.float64) * 2 - 1
        lengths = torch.tensor([255, 256, 257, 512, 513, 40000])[
            torch.randperm(6, generator=gen)[:5]]
        starts = torch.randint(0, flat.shape[0] - 40000, (5,), generator=gen)
        for position, start, length in zip(hot, starts, lengths):
            flat[start:start + length] = position
        for mode in MODES_2D:
            args = (grad_output, inp, grid, mode, seed % 3, bool(seed % 2))
            with self.subTest(mode=mode):
                self.assertEqual(ops._core_grad_input(*args),
                                 ops._existing_kernel_reference(*args), atol=1e-9, rtol=1e-9)

    def test_a_chunk_of_few_runs_launches_few_threads(self):
        # A constant grid on a 512x512 image with 256 channels: per chunk of
        # 2^19 records, 131,072 points, 2,048 partial slots per channel, and
        # the run sums' grid capped at 4,096 blocks of 256 threads, where one
        # thread per (possible run, channel) would be 2^18 x 256.
        meta = {"device": "meta", "dtype": torch.float32}
        grad_output = torch.empty(1, 256, 1024, 1024, **meta)
        inp = torch.empty(1, 256, 512, 512, **meta)
        grid = torch.empty(1, 1024, 1024, 2, **meta)
        threads = ops._core_counters(grad_output, inp, grid, BILINEAR, 0, False)[5]
        self.assertEqual(threads, 8 * (131072 + 2048 * 256 + 4096 * 256))

    @parametrize("channels", (1, 256, 4096))
    def test_workspace_stays_within_64_mib(self, channels):
        # Shapes alone (meta tensors): the largest chunk, 64-bit keys.
        meta = {"device": "meta", "dtype": torch.float64}
        inp = torch.empty(4, channels, 512, 512, **meta)
        grid = torch.empty(4, 512, 512, 2, **meta)
        grad_output = torch.empty(4, channels, 512, 512, **meta)
        counters = ops._core_counters(grad_output, inp, grid, BICUBIC, 0, False)
        self.assertLessEqual(counters[4], 64 << 20)

    def test_work_counters_take_the_chunk_and_partial_sizes_of_the_source(self):
        with open(SOURCE, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("kMaxChunkRecords = int64_t{1} << 19;", text)
        self.assertIn("kPartialRecords = 256;", text)
        self.assertEqual((detgrid.ops.CORE_CHUNK_RECORDS, detgrid.ops.CORE_PARTIAL_RECORDS),
                         (1 << 19, 256))
        self.assertEqual([detgrid.ops.core_longest_fold(n) for n in (-1, 1, 256, 257, 512, 513)],
                         [-1, 1, 256, 257, 257, 258])

    def test_work_counters_take_the_channel_groups_of_each_builds_source(self):
        # kChannelGroup as each build's source (core_sources) has it, 1 where
        # it has none: the core's run sums take one channel per thread.
        self.assertEqual(tuple(detgrid.ops.CORE_CHANNEL_GROUPS), levels.CORE_BUILDS)
        for level in levels.CORE_BUILDS:
            (text,) = stack.core_sources(ROOT, upto=level).values()
            found = re.findall(r"^constexpr int kChannelGroup = (\d+);$", text, re.M)
            with self.subTest(level=level):
                self.assertLessEqual(len(found), 1)
                self.assertEqual(detgrid.ops.CORE_CHANNEL_GROUPS[level],
                                 int(found[0]) if found else 1)
        self.assertNotIn("kChannelGroup", stack.core_sources(ROOT)[
            f"{stack.KERNEL_DIR}/GridSamplerDeterministic.cu"])

    @parametrize("dtype", DTYPES)
    def test_tricubic_grad_input_agrees_with_the_float64_reference(self, dtype):
        # stock_reference.backward: float64 sums of the existing kernel's taps
        # and weights (64 per point), in the dtype's coordinate arithmetic.
        for padding, align in itertools.product(PADDINGS, (False, True)):
            args = problem(3, dtype, seed=20 + padding) + (BICUBIC, padding, align)
            expected = stock_reference.backward(*args)[0]
            with self.subTest(padding=padding, align_corners=align):
                self.assertEqual(ops._core_grad_input(*args).double(), expected,
                                 atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])

    @parametrize("dtype", (torch.float64, torch.float32))
    @unittest.skipIf(UNDER_SANITIZERS, "huge flip counts convert to int in the reference's "
                     "arithmetic (undefined on the host with g++)")
    def test_tricubic_non_finite_coordinates_give_the_references_nan_and_inf(self, dtype):
        # A point with a non-finite coordinate gets no tap, as the reference
        # decides (tricubic_records: padding would place its NaN coefficients on
        # an edge): the same NaN and infinity in the same elements. Finite values
        # agree but under reflection with align_corners=False, where a
        # coordinate near 3e9 moves by the unnormalize's contracted multiply-add
        # (the host build's FMA, as nvcc's), which the reference rounds twice,
        # and reflects elsewhere.
        for padding, align in itertools.product(PADDINGS, (False, True)):
            args = problem(3, dtype, points=(9, 9), image=(4, 5), channels=2, batch=1,
                           seed=padding, coordinates=HOSTILE) + (BICUBIC, padding, align)
            ours = ops._core_grad_input(*args)
            reference = stock_reference.backward(*args)[0]
            with self.subTest(padding=padding, align_corners=align):
                self.assertEqual(ours.isnan(), reference.isnan())
                self.assertEqual(ours.isinf(), reference.isinf())
                if padding != 2 or align:
                    finite = ours.isfinite()
                    self.assertEqual(ours[finite].double(), reference[finite].double(),
                                     atol=1e-4, rtol=1e-4)

    @parametrize("dtype", (torch.float32, torch.float16))
    def test_tricubic_bits_do_not_depend_on_launch_shape_or_thread_order(self, dtype):
        if UNDER_SANITIZERS and dtype != torch.float16:
            self.skipTest(MAIN_SUITE_ONLY)
        # 9,000 points of 64 taps: two chunks, a hot position and ordinary ones.
        grad_output, inp, grid = problem(3, dtype, points=(60, 50), image=(6, 7),
                                         channels=2, batch=1, seed=4)
        grid[0, :20] = 0.0
        args = (grad_output, inp, grid, BICUBIC, 1, False)
        self.assertEqual(ops._core_counters(*args)[10], 2)  # sorts: chunks
        shapes = ((0, 0, 0), (32, 0, 0), (0, 7, 0), (64, 3, 11), (256, 0, 5), (1, 1, 1))
        results = [ops._core_grad_input(*args, *shape) for shape in shapes]
        for shape, result in zip(shapes[1:], results[1:]):
            with self.subTest(block_size=shape[0], grid_size=shape[1], seed=shape[2]):
                self.assertTrue(same_bits(result, results[0]))


# Launch shapes of the host build (block_size, grid_size, shuffle_seed) the
# speed levels are run under beside their own: few threads looping over many
# items, in shuffled block and thread orders.
LEVEL_LAUNCHES = ((0, 0, 0), (32, 3, 5), (1, 7, 9))


def hot_grid(grid, seed, lengths=(255, 256, 257, 513, 3000)):
    """grid with runs of points piled on a few positions (one per length)."""
    gen = torch.Generator().manual_seed(seed)
    dims = grid.shape[-1]
    flat = grid.view(-1, dims)
    hot = torch.rand(len(lengths), dims, generator=gen, dtype=torch.float64) * 1.6 - 0.8
    starts = torch.randperm(flat.shape[0] // 3000 - 1, generator=gen)[:len(lengths)] * 3000
    for position, start, length in zip(hot, starts.tolist(), lengths):
        flat[start:start + length] = position.to(grid.dtype)
    return grid


class TestCoreBuilds(TestCase):
    """Each speed level of the core (detgrid.levels.CORE_BUILDS after the
    core) sums every channel's terms in the core's order: its grad_input has
    the core's bits, under every launch shape and thread order, where a
    level's grouping meets its edge cases: channel counts that are not a
    multiple of a group, runs long enough for stored partials, Half and
    BFloat16 over several chunks (the float scratch), 3-D. The core's own
    bits are pinned by tests/test_core_golden.py."""

    def assert_levels_give_the_cores_bits(self, args, what, nan_signs=False):
        """nan_signs: the sign bit of a NaN may differ (golden.core.differ_only_in_nan_signs:
        the host code's operand order, not the order of the sum)."""
        core = ops._core_grad_input(*args)
        for level in levels.CORE_BUILDS[1:]:
            for shape in LEVEL_LAUNCHES:
                got = ops._core_grad_input(*args, *shape, level=level)
                same = same_bits(got, core) or (
                    nan_signs and golden_core.differ_only_in_nan_signs(got, core))
                self.assertTrue(same, f"{what}: {level}, launch {shape}")
        return core

    @parametrize("channels", (1, 3, 5, 6, 7))
    def test_hot_runs_with_stored_partials(self, channels):
        # Runs of 255 .. 3000 records of one position beside scattered ones;
        # 2-D bicubic's 16 taps of 36,000 points make two chunks, 3-D
        # bicubic's 64 taps of 18,000 points three.
        for dims, mode, dtype in itertools.chain(
                itertools.product((2,), MODES_2D, (torch.float32, torch.float64)),
                itertools.product((3,), MODES_3D, (torch.float32,))):
            points = (150, 240) if dims == 2 else (100, 60)
            grad_output, inp, grid = problem(dims, dtype, points=points, image=(9, 11),
                                             channels=channels, batch=1, seed=channels)
            args = (grad_output, inp, hot_grid(grid, channels), mode, channels % 3,
                    bool(channels % 2))
            what = f"{dims}-D mode {mode} {dtype}"
            self.assert_levels_give_the_cores_bits(args, what)
            if mode == BICUBIC:
                chunks = 2 if dims == 2 else 3
                self.assertEqual(ops._core_counters(*args)[10], chunks, what)  # sorts
            if mode != BICUBIC:  # bicubic's taps spread a pile over 16 (64) positions
                fold = detgrid.ops.work_counters(*args, [True, False], level="core")
                self.assertGreater(fold["longest_fold"], 256, what)

    @parametrize("dims", (2, 3))
    @parametrize("dtype", (torch.float16, torch.bfloat16))
    def test_reduced_precision_over_several_chunks(self, dims, dtype):
        # Sums over several chunks wait in float (the core's scratch), with
        # hot runs among them; 5 channels: a group of 4 and one of 1.
        if UNDER_SANITIZERS and dtype != torch.float16:
            self.skipTest(MAIN_SUITE_ONLY)
        points = (600, 600) if dims == 2 else (200, 120)
        grad_output, inp, grid = problem(dims, dtype, points=points, image=(12, 10),
                                         channels=5, batch=1, seed=dims)
        args = (grad_output, inp, hot_grid(grid, dims), BILINEAR, 0, False)
        sorts = ops._core_counters(*(t.to("meta") for t in args[:3]), *args[3:])[10]
        self.assertGreaterEqual(sorts, 2)  # chunks
        self.assertGreater(grad_output[0, 0].numel() * 2 ** dims, CHUNK_RECORDS)
        self.assert_levels_give_the_cores_bits(args, f"{dims}-D {dtype}")

    @parametrize("dims", (2, 3))
    @parametrize("dtype", DTYPES)
    def test_every_mode_and_padding(self, dims, dtype):
        for mode, padding, align in cases(dims):
            args = problem(dims, dtype, channels=6, seed=mode * 10 + padding) + (
                mode, padding, align)
            self.assert_levels_give_the_cores_bits(args, f"mode {mode} padding {padding} "
                                                   f"align_corners={align}")

    @parametrize("dtype", (torch.float64, torch.float32))
    def test_non_finite_and_huge_coordinates(self, dtype):
        # Bicubic sums +NaN terms (a NaN coordinate's weights) with -NaN ones
        # (inf * 0 in the cubic coefficients): which sign the sum keeps is the
        # host code's operand order, which differs between the builds (see
        # tests/test_core_golden.py's NAN_SIGNS_DIFFER); every other bit is
        # the core's, and bilinear and nearest keep every bit.
        if UNDER_SANITIZERS:
            self.skipTest("NaN and huge flip counts convert to int (undefined on the host "
                          "with g++)")
        for dims in (2, 3):
            for mode, padding, align in cases(dims):
                args = problem(dims, dtype, points=(9, 9), image=(4, 5), channels=7,
                               batch=1, seed=padding, coordinates=HOSTILE) + (
                                   mode, padding, align)
                self.assert_levels_give_the_cores_bits(
                    args, f"{dims}-D mode {mode} padding {padding}",
                    nan_signs=mode == BICUBIC)

    def test_a_level_counts_the_cores_launches_sorts_and_workspace(self):
        # A speed level regroups the run sums' threads: it launches, sorts
        # and allocates what the core does, and finds the same runs.
        grad_output, inp, grid = problem(2, torch.float32, points=(300, 300), channels=7,
                                         seed=2)
        args = (grad_output, inp, hot_grid(grid, 2), BILINEAR, 0, False)
        core = ops._core_counters(*args)
        for level in levels.CORE_BUILDS[1:]:
            counted = ops._core_counters(*args, level=level)
            with self.subTest(level=level):
                # all but the threads launched (index 5)
                self.assertEqual(counted[:5] + counted[6:], core[:5] + core[6:])
                self.assertLess(counted[5], core[5])


instantiate_parametrized_tests(TestCore)
instantiate_parametrized_tests(TestCoreBuilds)

if __name__ == "__main__":
    run_tests()
