# Owner(s): ["module: nn"]
"""Exact work counters of the core's builds (detgrid.ops.work_counters).

Each build's host build counts what its CUDA build launches, sorts and
allocates (hostify counts the launches and the allocator's peak): from the
shapes alone, so meta tensors will do and the counts are those of a CUDA call
on any machine; with CPU tensors it also counts where the points land. These
tests pin them on small problems worked out by hand from
GridSamplerDeterministic.cu and bound the workspace on large ones."""

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import levels, ops
from detgrid_testing import meta_problem

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS = 0
MIB = 2 ** 20
THREADS = 256  # kThreads: the threads of every block the core launches


def _counters(input_shape, grid_spatial, mode=BILINEAR, mask=(True, False),
              dtype=torch.float32, level=levels.TOP):
    """The counters of a call from shapes alone: grad_input alone unless a
    test asks for more."""
    return ops.work_counters(*meta_problem(input_shape, grid_spatial, dtype), mode, ZEROS,
                             False, list(mask), level=level)


def _blocks(threads):
    return -(-threads // THREADS)


def _own_buffers(records, points, channels, taps_weights, key_bytes=4, weight_bytes=4,
                 sum_bytes=4):
    """Bytes of the core's own buffers for a chunk of `records` records of
    `points` points (sum_grad_input's allocations): keys and ids in and out,
    the weights (one per record, or a bicubic point's coefficients), a
    grad_output offset per point, the runs' starts and count, and the stored
    partials of every channel."""
    return (2 * records * key_bytes + 2 * records * 4 + taps_weights * weight_bytes
            + points * key_bytes + records * 4 + 4
            + -(-records // 256) * channels * sum_bytes)


@instantiate_parametrized_tests
class TestWorkCounters(TestCase):

    @parametrize("level", levels.CORE_BUILDS)
    def test_one_chunk_counts_by_hand(self, level):
        # 256 points x 4 taps = 1024 records of 3 channels, one chunk: the
        # records, their sort, the runs' starts (unique_by_key), the stored
        # partials and the run sums.
        c = _counters((1, 3, 8, 8), (16, 16), level=level)
        self.assertEqual((c["points"], c["records"]), (256, 1024))
        self.assertEqual((c["chunks"], c["launches"], c["launches_per_chunk"]), (1, 5, 5))
        self.assertEqual(c["items_sorted"], 1024)
        # Keys up to `nowhere`, one past the 8 x 8 positions: 64 needs 7 bits.
        self.assertEqual((c["key_bytes"], c["key_bits"]), (4, 7))
        # CUB's temporary storage comes on top of the core's own buffers.
        self.assertGreater(c["workspace_bytes"], _own_buffers(1024, 256, 3, 1024))
        # A thread per point, per partial's slot and channel (group), per
        # possible run (at most 8 x 8 positions and the run landing nowhere)
        # and channel (group): 3 channels are one group of grouped-channels.
        self.assertEqual(c["threads"], 3 * THREADS)
        wide = _counters((1, 16, 8, 8), (16, 16), level=level)
        groups = 16 // ops.CORE_CHANNEL_GROUPS[level]
        self.assertEqual(wide["threads"],
                         THREADS * (1 + _blocks(4 * groups) + _blocks(65 * groups)))
        # Channels cost only their stored partials: 4 slots of 4-byte sums each.
        self.assertEqual(wide["workspace_bytes"] - c["workspace_bytes"], 4 * 13 * 4)

    def test_wider_types_widen_the_weights_and_sums(self):
        # float64: 8-byte weights and partial sums; Half: 2-byte weights, float sums.
        f32 = _counters((1, 3, 8, 8), (16, 16))
        f64 = _counters((1, 3, 8, 8), (16, 16), dtype=torch.float64)
        f16 = _counters((1, 3, 8, 8), (16, 16), dtype=torch.float16)
        self.assertEqual(f64["workspace_bytes"] - f32["workspace_bytes"], 1024 * 4 + 4 * 3 * 4)
        self.assertEqual(f16["workspace_bytes"] - f32["workspace_bytes"], -1024 * 2)

    @parametrize("dims,mode,taps",
                 [(2, BILINEAR, 4), (2, NEAREST, 1), (2, BICUBIC, 16),
                  (3, BILINEAR, 8), (3, NEAREST, 1), (3, BICUBIC, 64)],
                 name_fn=lambda dims, mode, taps: f"{dims}d_{taps}_taps")
    def test_every_record_is_sorted(self, dims, mode, taps):
        shape = (2, 3) + (5,) * dims
        points = 2 * 6 ** dims
        for level in levels.CORE_BUILDS:
            c = _counters(shape, (6,) * dims, mode=mode, level=level)
            self.assertEqual(c["records"], points * taps)
            self.assertEqual(c["items_sorted"], points * taps)
            self.assertEqual(c["launches_per_chunk"], 5)

    def test_a_chunk_holds_2_to_the_19_records(self):
        # 131,073 bilinear points: 131,072 points in the first chunk, one in
        # the second; each chunk five launches.
        c = _counters((1, 3, 8, 8), (1, 131073))
        self.assertEqual((c["chunks"], c["launches"], c["items_sorted"]), (2, 10, 4 * 131073))
        self.assertEqual(_counters((1, 3, 8, 8), (1, 131072))["chunks"], 1)
        # Records per point do not change the records per chunk: 2^13 tricubic points.
        self.assertEqual(_counters((1, 1, 4, 4, 4), (1, 1, 8192), mode=BICUBIC)["chunks"], 1)
        self.assertEqual(_counters((1, 1, 4, 4, 4), (1, 1, 8193), mode=BICUBIC)["chunks"], 2)

    def _two_chunks(self, dtype, device="cpu"):
        """A call of 3 x 8 x 8 input and 131,328 bilinear points: two chunks."""
        gen = torch.Generator().manual_seed(0)
        inp = torch.randn(1, 3, 8, 8, generator=gen).to(dtype)
        grid = (torch.rand(1, 256, 513, 2, generator=gen) * 2 - 1).to(dtype)
        grad_output = torch.randn(1, 3, 256, 513, generator=gen).to(dtype)
        return [ops.work_counters(*(t.to(device) for t in (grad_output, inp, grid)), BILINEAR,
                                  ZEROS, False, [True, False], level=level)
                for level in levels.CORE_BUILDS]

    def test_half_sums_over_chunks_wait_in_a_float_scratch(self):
        # Half and BFloat16 sums over two chunks wait in a float per
        # grad_input element (3 x 8 x 8), zero-filled before the first chunk
        # (cudaMemsetAsync) and rounded into grad_input after the last (a
        # thread per element); one chunk sums in grad_input directly.
        f32 = self._two_chunks(torch.float32)
        for dtype in (torch.float16, torch.bfloat16):
            for two, full in zip(self._two_chunks(dtype), f32):
                self.assertEqual((two["chunks"], full["chunks"]), (2, 2))
                self.assertEqual(full["launches"], 2 * 5)
                self.assertEqual(two["launches"], 1 + 2 * 5 + 1)
                # The fill and the rounding are the call's, not a chunk's.
                self.assertEqual(two["launches_per_chunk"], 5)
                self.assertEqual(two["threads"], full["threads"] + THREADS * _blocks(3 * 8 * 8))
                # the scratch, and weights of 2 bytes for the chunk's 2^19 records
                self.assertEqual(two["workspace_bytes"] - full["workspace_bytes"],
                                 3 * 8 * 8 * 4 - 2**19 * 2)
            self.assertEqual(_counters((1, 3, 8, 8), (16, 16), dtype=dtype)["launches"], 5)

    def test_half_sums_over_chunks_count_the_same_from_the_shapes_alone(self):
        # The count from the shapes alone is what the call with data counts:
        # the scratch's rounding launch included.
        for dtype in (torch.float16, torch.bfloat16):
            for with_data, shapes in zip(self._two_chunks(dtype), self._two_chunks(dtype, "meta")):
                for field in ("longest_fold", "reduce_items", "record_visits"):
                    del with_data[field], shapes[field]
                self.assertEqual(shapes, with_data, dtype)

    def test_grad_grid_is_one_launch_more(self):
        # The grid gradient's kernel, one thread per point; nothing of
        # grad_input's changes (its threads included).
        for mode in (BILINEAR, NEAREST, BICUBIC):
            with self.subTest(mode=mode):
                alone = _counters((2, 3, 8, 8), (16, 16), mode=mode)
                both = _counters((2, 3, 8, 8), (16, 16), mode=mode, mask=(True, True))
                self.assertEqual(both["launches"], alone["launches"] + 1)
                self.assertEqual({k: v for k, v in both.items() if k != "launches"},
                                 {k: v for k, v in alone.items() if k != "launches"})

    def test_grid_gradient_alone_is_one_launch_without_workspace(self):
        for mode in (BILINEAR, NEAREST, BICUBIC):
            with self.subTest(mode=mode):
                c = _counters((2, 3, 8, 8), (16, 16), mode=mode, mask=(False, True))
                self.assertEqual(c["launches"], 1)
                for field in ("records", "items_sorted", "chunks", "workspace_bytes",
                              "threads", "longest_fold", "reduce_items", "record_visits"):
                    self.assertEqual(c[field], 0, field)
        self.assertEqual(_counters((2, 3, 8, 8), (16, 16), mask=(False, False))["launches"], 0)

    def test_no_points_launch_nothing(self):
        for mask in ((True, False), (True, True)):
            c = _counters((2, 3, 8, 8), (0, 4), mask=mask)
            self.assertEqual((c["launches"], c["chunks"], c["workspace_bytes"]), (0, 0, 0))

    def test_meta_and_real_tensors_count_the_same_but_where_the_points_land(self):
        torch.manual_seed(0)
        inp = torch.randn(2, 3, 9, 7)
        grid = torch.rand(2, 5, 6, 2) * 2 - 1
        grad_output = torch.randn(2, 3, 5, 6)
        for level in levels.CORE_BUILDS:
            real = ops.work_counters(grad_output, inp, grid, BICUBIC, ZEROS, True,
                                     [True, True], level=level)
            meta = ops.work_counters(grad_output.to("meta"), inp.to("meta"), grid.to("meta"),
                                     BICUBIC, ZEROS, True, [True, True], level=level)
            for field in ("longest_fold", "reduce_items", "record_visits"):
                self.assertEqual(meta.pop(field), -1, field)
                self.assertGreater(real.pop(field), 0, field)
            self.assertEqual(real, meta)

    @parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    def test_workspace_is_bounded_whatever_the_input_size(self, dtype):
        # The buffers and CUB's storage stay within 64 MiB with 64-bit keys,
        # beyond 256 channels too (chunks shrink), and stop growing once the
        # problem fills a chunk; the float scratch of Half/BFloat16 sums over
        # several chunks comes on top, a float per grad_input element.
        for level in levels.CORE_BUILDS:
            for dims, sides in ((2, (64, 256, 1000, 2048, 4096)), (3, (16, 40, 120, 200))):
                for mode in (BILINEAR, NEAREST, BICUBIC):
                    for channels in (1, 4, 256, 4096):
                        totals = []
                        for side in sides:
                            shape = (2, channels) + (side,) * dims
                            if torch.Size(shape).numel() > 2**33:
                                continue
                            c = _counters(shape, (side,) * dims, mode=mode, dtype=dtype,
                                          level=level)
                            scratch = 0
                            if dtype in (torch.float16, torch.bfloat16) and c["chunks"] > 1:
                                scratch = 4 * torch.Size(shape).numel()
                            where = f"{level} {dims}d mode {mode} C={channels} side {side}"
                            self.assertLessEqual(c["workspace_bytes"] - scratch, 64 * MIB,
                                                 msg=where)
                            if c["records"] >= 2**19:  # it fills a chunk
                                totals.append((c["key_bytes"], c["workspace_bytes"] - scratch))
                        # Inputs that fill a chunk, with keys of one width, take the same.
                        for key_bytes in (4, 8):
                            full = {t for k, t in totals if k == key_bytes}
                            self.assertLessEqual(len(full), 1,
                                                 msg=f"{level} {dims}d mode {mode} C={channels}")

    def test_keys_are_32_bit_until_the_input_needs_64_bit_indices(self):
        self.assertEqual(_counters((1, 1, 32768, 65535), (4, 4))["key_bytes"], 4)
        self.assertEqual(_counters((1, 1, 32768, 65536), (4, 4))["key_bytes"], 8)
        # Tricubic is indexed with 64 bits only.
        tricubic = _counters((1, 1, 4, 4, 4), (2, 2, 2), mode=BICUBIC)
        # 64-bit keys, of which the sort reads the bits of `nowhere` (4 x 4 x 4 = 64): 7.
        self.assertEqual((tricubic["key_bytes"], tricubic["key_bits"]), (8, 7))
        self.assertEqual(_counters((1, 1, 4, 4, 4), (2, 2, 2))["key_bytes"], 4)

    def test_unknown_level_is_a_one_line_error(self):
        for level in ("Core", "grouped", ""):
            with self.assertRaisesRegex(ValueError, "^work_counters\\(\\): unknown level"):
                _counters((1, 1, 8, 8), (4, 4), level=level)

    def test_the_default_is_the_whole_stack(self):
        self.assertEqual(_counters((1, 5, 8, 8), (16, 16)),
                         _counters((1, 5, 8, 8), (16, 16), level=levels.TOP))
        self.assertEqual(levels.TOP, levels.CORE_BUILDS[-1])


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


if __name__ == "__main__":
    run_tests()
