# Owner(s): ["module: nn"]
"""Exact work counters of the deterministic pipeline (detgrid.ops.work_counters).

The counting executor runs the one pipeline that CUDA and the host executor
run (GridSamplerDeterministicPipeline.cuh) without running any stage, so its
counts are those of a CUDA call, on any machine. These tests pin them on
small problems worked out by hand, and bound the workspace on large ones
(meta tensors: nothing is allocated)."""

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid_testing import meta_problem

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS = 0
MIB = 2 ** 20


# grad_input alone unless a test asks for more: the pipeline's own counts (grad_grid is one
# more launch, test_grad_grid_is_one_launch_before_the_chunks).
def _counters(input_shape, grid_spatial, mode=BILINEAR, mask=(True, False),
              dtype=torch.float32, **knobs):
    return ops.work_counters(*meta_problem(input_shape, grid_spatial, dtype), mode, ZEROS,
                             False, list(mask), **knobs)


class TestWorkCounters(TestCase):

    def test_dense_bilinear_call_sorts_one_key_per_point(self):
        # 256 points; 9 x 9 = 81 cells <= 256 x 4 taps: dense, keyed per cell.
        c = _counters((1, 3, 8, 8), (16, 16))
        self.assertEqual(c["points"], 256)
        self.assertEqual(c["records"], 1024)
        self.assertEqual(c["items_sorted"], 256)
        self.assertEqual(c["chunks"], 1)
        # point pass (which zero-fills the segment table), sort, mark
        # segments, reduce; the zero fill is a launch of its own with
        # separate_fills=1
        self.assertEqual(c["launches_per_chunk"], 4)
        self.assertEqual(c["launches"], 4)
        self.assertEqual(
            _counters((1, 3, 8, 8), (16, 16), separate_fills=1)["launches_per_chunk"], 5)
        self.assertEqual(c["key_bits"], 7)  # keys 0..81 (81 marks "nowhere")
        self.assertEqual(c["key_bytes"], 4)
        # keys in/out, ids in and out, the weights of all 1024 taps,
        # per-point offsets, the segment table over the cells
        self.assertEqual(c["workspace_bytes"],
                         2 * 256 * 4 + (256 + 256) * 4 + 1024 * 4 + 256 * 4 + 2 * 81 * 4)
        self.assertEqual(c["sort_scratch_bytes"], 256 * (4 + 4))

    def test_dense_bilinear_call_keyed_per_tap_counts_by_hand(self):
        c = _counters((1, 3, 8, 8), (16, 16), keying=1)
        self.assertEqual(c["items_sorted"], 1024)
        self.assertEqual(c["launches_per_chunk"], 4)
        self.assertEqual(c["key_bits"], 7)  # keys 0..64 (64 marks "nowhere")
        self.assertEqual(c["workspace_bytes"],
                         2 * 1024 * 4 + (1024 + 1024) * 4 + 1024 * 4 + 256 * 4 + 2 * 64 * 4)

    def test_dense_trilinear_call_sorts_one_key_per_point(self):
        # 512 points; 5^3 = 125 cells <= 512 x 8 taps.
        c = _counters((1, 2, 4, 4, 4), (8, 8, 8))
        self.assertEqual(c["items_sorted"], 512)
        self.assertEqual(c["records"], 4096)
        self.assertEqual(c["key_bits"], 7)  # keys 0..125
        self.assertEqual(_counters((1, 2, 4, 4, 4), (8, 8, 8), keying=1)["items_sorted"], 4096)

    def test_bilinear_keys_per_tap_where_the_cells_need_a_sparse_reduction(self):
        # 64 points x 4 taps = 256 records: 201 x 201 cells would need a
        # sparse reduction, which merges no cells, so the keys are per tap.
        c = _counters((1, 1, 200, 200), (8, 8))
        self.assertEqual(c["items_sorted"], 256)

    def test_many_channels_gather_a_channels_last_copy_of_grad_output(self):
        # 16 channels: the dense reduce takes channels fastest, reading the
        # chunk's grad_output copied channels last (256 points x 16
        # channels) with its offsets, by the point pass up to 64 channels,
        # in a launch of its own beyond (or with separate_fills=1).
        base = 2 * 256 * 4 + (256 + 256) * 4 + 1024 * 4 + 256 * 4 + 2 * 81 * 4
        c = _counters((1, 16, 8, 8), (16, 16))
        self.assertEqual(c["launches_per_chunk"], 4)
        self.assertEqual(c["workspace_bytes"], base + 256 * 16 * 4 + 256 * 4)
        self.assertEqual(
            _counters((1, 16, 8, 8), (16, 16), separate_fills=1)["launches_per_chunk"], 6)
        self.assertEqual(_counters((1, 65, 8, 8), (16, 16))["launches_per_chunk"], 5)
        # 15 channels, or threads told to take destinations fastest: no copy.
        self.assertEqual(_counters((1, 15, 8, 8), (16, 16))["launches_per_chunk"], 4)
        destinations_fastest = _counters((1, 16, 8, 8), (16, 16), gather=1)
        self.assertEqual(destinations_fastest["launches_per_chunk"], 4)
        self.assertEqual(destinations_fastest["workspace_bytes"], base)

    def test_channels_last_grad_output_is_gathered_without_a_copy(self):
        grad_output, inp, grid = meta_problem((1, 16, 8, 8), (16, 16))
        grad_output = grad_output.contiguous(memory_format=torch.channels_last)
        c = ops.work_counters(grad_output, inp, grid, BILINEAR, ZEROS, False, [True, True])
        self.assertEqual(c["launches_per_chunk"], 4)
        self.assertEqual(c["workspace_bytes"],
                         2 * 256 * 4 + (256 + 256) * 4 + 1024 * 4 + 256 * 4 + 2 * 81 * 4)

    def test_dense_reduce_sweeps_only_the_images_of_each_chunk(self):
        # 4 images of 64 x 64 points, chunks of 4096 points: each chunk's
        # points are one image, so it sweeps that image's 3 x 16 x 16
        # elements, not all four images'.
        per_image = 3 * 16 * 16
        c = _counters((4, 3, 16, 16), (64, 64), chunk_points=4096)
        self.assertEqual(c["chunks"], 4)
        self.assertEqual(c["elements_swept"], 4 * per_image)
        # Chunks of 12288 points straddle images: [0, 3) and [3, 4).
        c = _counters((4, 3, 16, 16), (64, 64), chunk_points=12288)
        self.assertEqual(c["chunks"], 2)
        self.assertEqual(c["elements_swept"], (3 + 1) * per_image)
        # One chunk sweeps all of grad_input once, in either thread order.
        for gather in (1, 2):
            c = _counters((4, 3, 16, 16), (64, 64), gather=gather)
            self.assertEqual(c["elements_swept"], 4 * per_image)

    def test_last_chunk_of_a_float_carry_sweeps_every_image_before_it(self):
        # BFloat16 over two chunks: the last one rounds the float carry of
        # the images finished before it into grad_input too.
        per_image = 3 * 16 * 16
        c = _counters((4, 3, 16, 16), (64, 64), dtype=torch.bfloat16, chunk_points=12288)
        self.assertEqual(c["elements_swept"], 3 * per_image + 4 * per_image)

    def test_sparse_reduce_sweeps_no_elements(self):
        self.assertEqual(_counters((1, 1, 200, 200), (8, 8))["elements_swept"], 0)

    def test_no_points_is_one_zero_fill(self):
        c = _counters((2, 3, 8, 8), (0, 4))
        self.assertEqual((c["launches"], c["chunks"], c["elements_swept"]), (1, 0, 0))

    def test_channels_last_copy_never_splits_a_problem_that_fits_one_chunk(self):
        # 32 x 1024 points of 1024 channels: their channels-last copy alone
        # (128 MiB) would need three chunks; without it the problem fits one,
        # and its grad_output is read where it lies.
        c = _counters((1, 1024, 64, 64), (32, 1024))
        self.assertEqual(c["chunks"], 1)
        # A dense chunk's 4 launches, no copy among them, and the hot fold's
        # sum over its slots (its launch takes the marking's place): its
        # partials of 1024 channels do not fit the chunk's dead keys alone,
        # but the keys grow into the workspace that the one chunk leaves
        # spare.
        self.assertEqual(c["launches_per_chunk"], 4 + 1)
        self.assertEqual(_counters((1, 1024, 64, 64), (32, 1024), serial_fold=1)
                         ["launches_per_chunk"], 4)
        # Where it is needed anyway, the copy stays (a launch of its own
        # beyond 64 channels).
        self.assertEqual(_counters((1, 65, 8, 8), (16, 16))["launches_per_chunk"], 5)

    def test_a_one_point_last_chunk_leaves_the_table_to_a_zero_fill(self):
        # 64 x 64 = 4096 cells: a dense table of 8192 words, chunks of 4096
        # points. The full chunk's point pass zero-fills it, 2 words a
        # thread; the last chunk's one point would fill all 8192 alone, so
        # the executor's zero fill clears the table there: the full chunk's
        # point pass, sort, mark segments and reduce, then the same with the
        # zero fill (serial_fold=1 keeps the hot fold's launches out).
        c = _counters((1, 1, 63, 63), (1, 4097), chunk_points=4096, serial_fold=1)
        self.assertEqual(c["chunks"], 2)
        self.assertEqual(c["longest_fill"], 2)
        self.assertEqual(c["launches"], 4 + 5)
        # Apart (separate_fills=1), every chunk's table is the zero fill's.
        apart = _counters((1, 1, 63, 63), (1, 4097), chunk_points=4096, serial_fold=1,
                          separate_fills=1)
        self.assertEqual(apart["longest_fill"], 0)
        self.assertEqual(apart["launches"], 5 + 5)

    @parametrize("input_shape,mode,taps",
                 [((1, 1, 63, 63), BILINEAR, 4), ((1, 1, 256, 256), BICUBIC, 16),
                  ((1, 1, 15, 15, 15), BILINEAR, 8), ((1, 1, 15, 15, 15), NEAREST, 1)],
                 name_fn=lambda shape, mode, taps: f"{len(shape) - 2}d_{taps}_taps")
    def test_no_point_pass_thread_fills_more_than_two_table_words_per_tap(
            self, input_shape, mode, taps):
        # Dense tables as large as a chunk of 4096 points allows, and last
        # chunks of every size: a thread's share of the table stays within
        # that of a full chunk (one two-word entry per tap at most).
        dims = len(input_shape) - 2
        for last in (0, 1, 100, 2047, 4095):
            grid_spatial = (1,) * (dims - 1) + (4096 + last,)
            c = _counters(input_shape, grid_spatial, mode=mode, chunk_points=4096)
            self.assertGreater(c["longest_fill"], 0, f"last chunk of {last}")
            self.assertLessEqual(c["longest_fill"], 2 * taps, f"last chunk of {last}")

    def test_unknown_gather_is_a_one_line_error(self):
        with self.assertRaisesRegex(RuntimeError, "gather must be 0 \\(automatic\\), 1"):
            _counters((1, 1, 8, 8), (4, 4), gather=3)

    def test_unknown_keying_is_a_one_line_error(self):
        with self.assertRaisesRegex(RuntimeError, "keying must be 0 \\(automatic\\) or 1"):
            _counters((1, 1, 8, 8), (4, 4), keying=2)

    def test_sparse_bilinear_call_counts_by_hand(self):
        # 64 points x 4 taps = 256 records < 40000 destinations: sparse.
        c = _counters((1, 1, 200, 200), (8, 8))
        self.assertEqual(c["items_sorted"], 256)
        self.assertEqual(c["chunks"], 1)
        # point pass, sort, reduce (the first record of each run folds it); plus the
        # zero fill of grad_input before the first chunk
        self.assertEqual(c["launches_per_chunk"], 3)
        self.assertEqual(c["launches"], 4)
        self.assertEqual(c["key_bits"], 16)  # keys 0..40000
        # keys in/out, ids in and out, the weights, the per-point offsets
        self.assertEqual(c["workspace_bytes"],
                         2 * 256 * 4 + (256 + 256) * 4 + 256 * 4 + 64 * 4)

    def test_grad_grid_is_one_launch_before_the_chunks(self):
        # Upstream, stock's kernel makes grad_grid after the deterministic grad_input; the
        # extension's grid-gradient kernel does, before the first chunk: one launch, outside
        # the per-chunk count, and nothing else changes.
        for mode in (BILINEAR, "bicubic"):
            with self.subTest(mode=mode):
                alone = _counters((2, 3, 8, 8), (16, 16), mode=mode)
                both = _counters((2, 3, 8, 8), (16, 16), mode=mode, mask=(True, True))
                self.assertEqual(both["launches"], alone["launches"] + 1)
                self.assertEqual({k: v for k, v in both.items() if k != "launches"},
                                 {k: v for k, v in alone.items() if k != "launches"})

    def test_grid_gradient_alone_is_one_pass_without_workspace(self):
        # On CUDA a deterministic call for grad_grid alone takes the
        # grid-gradient kernel: one launch (nearest too), no sort, no
        # workspace, no fold.
        for mode in ("bilinear", "bicubic", "nearest"):
            with self.subTest(mode=mode):
                c = _counters((2, 3, 8, 8), (16, 16), mode=mode, mask=(False, True))
                self.assertEqual(c["launches"], 1)
                for field in ("records", "items_sorted", "chunks", "workspace_bytes",
                              "longest_fold"):
                    self.assertEqual(c[field], 0, field)
        nothing = _counters((2, 3, 8, 8), (16, 16), mask=(False, False))
        self.assertEqual(nothing["launches"], 0)

    def test_chunks_of_a_reduced_precision_call_add_a_float_carry(self):
        # 3 chunks of 4096 points; 101 x 101 = 10201 cells <= 4096 x 4 taps:
        # dense, keyed per cell.
        c = _counters((1, 2, 100, 100), (96, 128), dtype=torch.float16, chunk_points=4096)
        self.assertEqual(c["chunks"], 3)
        self.assertEqual(c["items_sorted"], 96 * 128)
        # 4096 points a chunk may put more than 1024 in one cell: each
        # chunk runs the hot fold's sum over its slots, and its launch
        # marks the segments in the plain marking's place.
        self.assertEqual(c["launches"], 3 * (4 + 1))
        points = 4096
        # The hot fold's tables live in the dead sort items.
        own = (2 * points * 4 + 2 * points * 4 + points * 4 * 4 + points * 4
               + 2 * 101 * 101 * 4)
        self.assertEqual(c["workspace_bytes"], own + 2 * 100 * 100 * 4)

    def test_sparse_float_carry_is_rounded_out_once(self):
        c = _counters((1, 1, 300, 300), (64, 128), dtype=torch.bfloat16, chunk_points=4096)
        self.assertEqual(c["chunks"], 2)
        # zero fill, 2 chunks of 3 (point pass, sort, reduce), the rounding of the carry
        # into grad_input
        self.assertEqual(c["launches"], 1 + 2 * 3 + 1)

    @parametrize("dims,mode,taps,items_per_point",
                 [(2, BILINEAR, 4, 1), (2, NEAREST, 1, 1), (2, BICUBIC, 16, 16),
                  (3, BILINEAR, 8, 1), (3, NEAREST, 1, 1), (3, BICUBIC, 64, 64)],
                 name_fn=lambda dims, mode, taps, items_per_point: f"{dims}d_{taps}_taps")
    def test_items_sorted_per_point(self, dims, mode, taps, items_per_point):
        # Dense problems: bilinear and trilinear sort one key per point, the
        # others one per tap (nearest has one); keying=1 is one per tap.
        shape = (2, 3) + (5,) * dims
        points = 2 * 6 ** dims
        c = _counters(shape, (6,) * dims, mode=mode)
        self.assertEqual(c["records"], points * taps)
        self.assertEqual(c["items_sorted"], points * items_per_point)
        per_tap = _counters(shape, (6,) * dims, mode=mode, keying=1)
        self.assertEqual(per_tap["items_sorted"], points * taps)

    def test_meta_and_real_tensors_count_the_same_but_the_longest_fold(self):
        torch.manual_seed(0)
        inp = torch.randn(2, 3, 9, 7)
        grid = torch.rand(2, 5, 6, 2) * 2 - 1
        grad_output = torch.randn(2, 3, 5, 6)
        real = ops.work_counters(grad_output, inp, grid, BICUBIC, ZEROS, True, [True, True])
        meta = ops.work_counters(grad_output.to("meta"), inp.to("meta"), grid.to("meta"),
                                 BICUBIC, ZEROS, True, [True, True])
        # Where the points land decides the folds: measured only with data.
        self.assertEqual(meta.pop("longest_fold"), -1)
        self.assertGreater(real.pop("longest_fold"), 0)
        self.assertEqual(real, meta)

    @parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    def test_workspace_is_bounded_whatever_the_input_size(self, dtype):
        # Our buffers and CUB's copy of the sort items stay within 64 MiB,
        # dense segment table included, from inputs a dense table fits to
        # inputs it does not, with 32- or 64-bit keys and index math, and
        # stop growing with the problem once it fills a chunk. Full precision
        # keeps its sums in grad_input; the float carry of Half/BFloat16 sums
        # over several chunks is part of the budget (at most 32 MiB of it).
        for dims, sides in ((2, (64, 256, 700, 1000, 1400, 2048, 4096)),
                            (3, (16, 40, 80, 120, 160, 200))):
            for mode in (BILINEAR, NEAREST, BICUBIC):
                for knobs in ({}, {"key_bits": 64, "index_bits": 64}, {"keying": 1},
                              {"gather": 2}):
                    totals = []
                    for side in sides:
                        c = _counters((2, 4) + (side,) * dims, (side,) * dims, mode=mode,
                                      dtype=dtype, **knobs)
                        total = c["workspace_bytes"] + c["sort_scratch_bytes"]
                        self.assertLessEqual(total, 64 * MIB - MIB,
                                             msg=f"{dims}d mode {mode} {side} {knobs}")
                        totals.append(total)
                    # The two largest inputs fill chunks and need no dense table.
                    self.assertEqual(totals[-2], totals[-1], msg=f"{dims}d mode {mode} {knobs}")

    def test_workspace_is_bounded_with_the_channels_last_copy(self):
        # The copy of a chunk's grad_output is part of the budget: more
        # channels make smaller chunks, or a sparse reduction (no copy) when
        # not even one tile of copies fits beside the table.
        for channels in (16, 1024, 8192):
            for side in (64, 512, 2048):
                for dtype in (torch.float32, torch.float64):
                    c = _counters((1, channels, side, side), (side, side), dtype=dtype)
                    self.assertLessEqual(c["workspace_bytes"] + c["sort_scratch_bytes"],
                                         64 * MIB - MIB, msg=f"C={channels} side {side}")

    def test_default_chunks_fill_most_of_the_budget(self):
        # Chunks are as many tiles as fit: at most one tile's bytes short.
        c = _counters((2, 4, 4096, 4096), (4096, 4096))
        self.assertGreater(c["workspace_bytes"] + c["sort_scratch_bytes"], 60 * MIB)

    def test_keys_are_32_bit_until_destinations_reach_2_to_31(self):
        self.assertEqual(_counters((1, 1, 32768, 65535), (4, 4))["key_bytes"], 4)
        self.assertEqual(_counters((1, 1, 32768, 65536), (4, 4))["key_bytes"], 8)

    def test_forced_widths(self):
        self.assertEqual(_counters((1, 1, 8, 8), (4, 4), key_bits=64)["key_bytes"], 8)
        with self.assertRaisesRegex(RuntimeError, "key_bits=32, but this problem needs 64 bits"):
            _counters((1, 1, 32768, 65536), (4, 4), key_bits=32)
        with self.assertRaisesRegex(RuntimeError, "index_bits must be 0 \\(automatic\\), 32 or 64"):
            _counters((1, 1, 8, 8), (4, 4), index_bits=16)
        # Tricubic sampling is built with 64-bit index math only: planned so
        # where 32 bits would fit, and refused when forced.
        tricubic = _counters((1, 1, 4, 4, 4), (2, 2, 2), mode=BICUBIC)
        self.assertEqual(tricubic, _counters((1, 1, 4, 4, 4), (2, 2, 2), mode=BICUBIC,
                                             index_bits=64))
        with self.assertRaisesRegex(
                RuntimeError, "^grid_sampler_3d_backward \\(deterministic\\): index_bits=32, "
                "but 3-D bicubic sampling runs with 64-bit index math only$"):
            _counters((1, 1, 4, 4, 4), (2, 2, 2), mode=BICUBIC, index_bits=32)


def _core_counters(grad_output, inp, grid, mode, align_corners=True, mask=(True, False),
                   level="core"):
    return ops.work_counters(grad_output, inp, grid, mode, ZEROS, align_corners, list(mask),
                             level=level)


def _points(channels, coordinates, dtype=torch.float64):
    """(grad_output, input, grid) on the CPU: one 5x5 image of `channels` channels,
    a row of points at the given (x, y) grid coordinates. With align_corners=True
    pixel p of 5 is at -1 + p / 2, exactly."""
    gen = torch.Generator().manual_seed(0)
    grid = torch.tensor([[list(coordinates)]], dtype=dtype)
    inp = torch.randn(1, channels, 5, 5, generator=gen, dtype=dtype)
    grad_output = torch.randn(1, channels, 1, len(coordinates), generator=gen, dtype=dtype)
    return grad_output, inp, grid


class TestCoreWorkCounters(TestCase):
    """reduce_items and record_visits of the core's builds (the host build's
    hostify::Counters: what unique_by_key found, per chunk), worked out by
    hand. A build's channel group is ops.CORE_CHANNEL_GROUPS[level] (its
    source's kChannelGroup, tests/test_core.py)."""

    def test_nearest_runs_and_records_by_hand(self):
        # 6 points: two on pixel (0, 0), one on (1, 2), one on (4, 4), two
        # outside (keyed nowhere): 4 records in 3 runs with a destination,
        # and the nowhere run.
        problem = _points(5, [(-1, -1), (-1, -1), (-0.5, 0), (1, 1), (3, 0), (-3, 0)])
        raw = torch.ops.detgrid._core_counters(*problem, NEAREST, ZEROS, True)
        # runs (nowhere's included), runs with a destination, their records, sorts
        self.assertEqual(raw[7:], [4, 3, 4, 1])
        core = _core_counters(*problem, NEAREST)
        self.assertEqual((core["reduce_items"], core["record_visits"]), (3 * 5, 4 * 5))
        grouped = _core_counters(*problem, NEAREST, level="grouped-channels")
        # 5 channels: a group of 4 and a group of 1
        self.assertEqual((grouped["reduce_items"], grouped["record_visits"]), (3 * 2, 4 * 2))

    def test_bilinear_taps_outside_the_image_are_not_visited(self):
        # A point on pixel (1, 2): its 4 taps land; one on pixel (4, 0) at
        # the right edge: its 2 taps at x = 5 land nowhere. 6 runs of one
        # record each with a destination.
        problem = _points(7, [(-0.5, 0), (1, -1)])
        raw = torch.ops.detgrid._core_counters(*problem, BILINEAR, ZEROS, True)
        self.assertEqual(raw[7:], [7, 6, 6, 1])
        for level, groups in (("core", 7), ("grouped-channels", 2)):
            c = _core_counters(*problem, BILINEAR, level=level)
            self.assertEqual((c["reduce_items"], c["record_visits"]), (6 * groups, 6 * groups),
                             level)

    def test_runs_are_summed_over_chunks(self):
        # 131,073 points on the middle of a 2x2 image: a chunk of 2^19
        # records (131,072 points x 4 taps), then one of 4 records. Each
        # chunk finds 4 runs, all with a destination.
        points = 131073
        grid = torch.zeros(1, 1, points, 2)
        inp = torch.randn(1, 3, 2, 2)
        grad_output = torch.randn(1, 3, 1, points)
        raw = torch.ops.detgrid._core_counters(grad_output, inp, grid, BILINEAR, ZEROS, False)
        self.assertEqual(raw[7:], [8, 8, 4 * points, 2])
        for level, groups in (("core", 3), ("grouped-channels", 1)):
            c = _core_counters(grad_output, inp, grid, BILINEAR, False, level=level)
            self.assertEqual(c["chunks"], 2)
            self.assertEqual(c["reduce_items"], 8 * groups, level)
            self.assertEqual(c["record_visits"], 4 * points * groups, level)

    def test_records_of_landed_runs_are_every_record_inside_the_image(self):
        # Points well inside the image: every tap lands, so each record is
        # visited once per channel group; a level divides the core's visits
        # by C and multiplies them by ceil(C / 4).
        gen = torch.Generator().manual_seed(1)
        for channels in (1, 3, 4, 5, 6, 7, 9):
            grid = torch.rand(2, 40, 30, 2, generator=gen) - 0.5
            inp = torch.randn(2, channels, 8, 9, generator=gen)
            grad_output = torch.randn(2, channels, 40, 30, generator=gen)
            core = _core_counters(grad_output, inp, grid, BILINEAR, False)
            grouped = _core_counters(grad_output, inp, grid, BILINEAR, False,
                                     level="grouped-channels")
            groups = -(-channels // 4)
            with self.subTest(channels=channels):
                self.assertEqual(core["record_visits"], core["records"] * channels)
                self.assertEqual(grouped["record_visits"], core["records"] * groups)
                self.assertEqual(grouped["reduce_items"] * channels,
                                 core["reduce_items"] * groups)
                # at most one run per grad_input position of one channel
                self.assertLessEqual(core["reduce_items"], 2 * 8 * 9 * channels)
                for field in ("launches", "chunks", "items_sorted", "workspace_bytes",
                              "longest_fold", "key_bytes"):
                    self.assertEqual(grouped[field], core[field], field)

    def test_shapes_alone_count_no_runs(self):
        # Meta tensors: where the points land is unknown.
        problem = meta_problem((1, 5, 8, 8), (4, 4))
        for level in ops.CORE_CHANNEL_GROUPS:
            c = _core_counters(*problem, BILINEAR, level=level)
            self.assertEqual((c["reduce_items"], c["record_visits"]), (-1, -1), level)
            self.assertEqual(c["chunks"], 1, level)
        raw = torch.ops.detgrid._core_counters(*problem, BILINEAR, ZEROS, True)
        self.assertEqual(raw[7:], [-1, -1, -1, 1])

    def test_grid_only_calls_reduce_nothing(self):
        problem = _points(5, [(-1, -1), (0, 0)])
        for level in ops.CORE_CHANNEL_GROUPS:
            c = _core_counters(*problem, BILINEAR, mask=(False, True), level=level)
            self.assertEqual((c["reduce_items"], c["record_visits"]), (0, 0), level)

    def test_the_pipeline_has_no_run_sums(self):
        problem = _points(5, [(-1, -1), (0, 0)])
        for level in ("pipeline", "fused-fills"):
            c = _core_counters(*problem, BILINEAR, level=level)
            self.assertEqual((c["reduce_items"], c["record_visits"]), (-1, -1), level)
            self.assertEqual(set(c), set(ops.WORK_COUNTER_FIELDS) | {"points", "records"})

    def test_every_core_field_is_counted(self):
        problem = _points(5, [(-1, -1), (0, 0)])
        c = _core_counters(*problem, BILINEAR)
        self.assertEqual(set(c), set(ops.WORK_COUNTER_FIELDS) | {"points", "records"})

    def test_chunks_are_the_sorts_where_many_channels_shrink_them(self):
        # 4096 float channels: a chunk's stored partials (16 MiB of them)
        # leave room for 2^18 records, not 2^19: 2^20 records make 4 chunks.
        problem = meta_problem((1, 4096, 16, 16), (512, 512))
        c = _core_counters(*problem, BILINEAR)
        self.assertEqual(c["items_sorted"], 1 << 20)
        self.assertEqual(c["chunks"], 4)
        self.assertEqual(c["launches_per_chunk"], c["launches"] // 4)
        # 256 channels keep chunks of 2^19 records.
        self.assertEqual(_core_counters(*meta_problem((1, 256, 16, 16), (512, 512)),
                                        BILINEAR)["chunks"], 2)


instantiate_parametrized_tests(TestWorkCounters)

if __name__ == "__main__":
    run_tests()
