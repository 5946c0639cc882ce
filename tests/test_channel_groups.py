# Owner(s): ["module: nn"]
"""Channel groups: a thread of the dense reduce (destinations fastest) and of
the hot fold walks a destination's records once for a group of up to 16
channels (8 in double), where the stack's earlier levels walk them once per
channel (channel_group=1). Each channel keeps its own partials and additions,
so every group width gives the same bits; channel_merges counts the walks."""

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests

from detgrid import ops
from detgrid.bench import workloads
from detgrid_testing import (
    ALL_DTYPES,
    BILINEAR,
    NEAREST,
    TILE_POINTS,
    ZEROS,
    DetgridTestCase,
    assert_pair_bitwise_equal,
    depth_sizes,
    detgrid_backward,
    make_problem,
    meta_problem,
)
from test_hot_fold import hot_problem

# Channel counts around the group widths: one group, a full one (8 in
# double, 16 otherwise), one more, and several groups with a remainder.
CHANNELS = (1, 3, 8, 9, 16, 17, 33)


def _counters(input_shape, grid_spatial, mode=BILINEAR, dtype=torch.float32, **knobs):
    return ops.work_counters(*meta_problem(input_shape, grid_spatial, dtype), mode, ZEROS,
                             False, [True, False], **knobs)


class TestChannelGroups(DetgridTestCase):

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims", (2, 3))
    def test_every_group_width_gives_the_bits_of_one_channel_per_thread(
            self, device, dims, dtype):
        for C in CHANNELS:
            problem = make_problem(2, C, 6, 7, 24, 20, **depth_sizes(dims, 5, 3),
                                   dtype=dtype, device=device, seed=C)
            # Destinations fastest at every channel count, and chunks of a
            # tile, so that sums (a float carry in half) span chunks.
            knobs = {"gather": 1, "chunk_points": TILE_POINTS}
            for mode in (BILINEAR, NEAREST):
                assert_pair_bitwise_equal(
                    self, detgrid_backward(*problem, mode, ZEROS, False, **knobs),
                    detgrid_backward(*problem, mode, ZEROS, False, channel_group=1, **knobs),
                    f"C={C} mode={mode}")

    @parametrize("C", (3, 17, 40))
    def test_hot_fold_groups_give_the_serial_folds_bits(self, device, C):
        for dtype in (torch.float32, torch.float64, torch.float16):
            problem = hot_problem(2, C=C, dtype=dtype, device=device, seed=6)
            serial = detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1,
                                      channel_group=1, gather=1)
            for knobs in ({}, {"gather": 1}, {"chunk_points": 3 * TILE_POINTS}):
                assert_pair_bitwise_equal(
                    self, detgrid_backward(*problem, BILINEAR, ZEROS, False, **knobs),
                    serial, f"{dtype} {knobs}")

    def test_unknown_channel_group_is_a_one_line_error(self, device):
        problem = make_problem(1, 2, 4, 4, 4, 4, device=device)
        with self.assertRaisesRegex(
                RuntimeError, "channel_group must be 0 \\(groups of channels\\) or 1 "
                "\\(one channel\\), got 2$"):
            detgrid_backward(*problem, BILINEAR, ZEROS, False, channel_group=2)


class TestChannelMerges(DetgridTestCase):

    def test_a_group_walks_each_sorted_item_once(self, device):
        # 256 points keyed per cell, dense: 256 items.
        c = _counters((1, 3, 8, 8), (16, 16))
        self.assertEqual(c["items_sorted"], 256)
        self.assertEqual(c["channel_merges"], 256)
        self.assertEqual(_counters((1, 3, 8, 8), (16, 16), channel_group=1)["channel_merges"],
                         3 * 256)
        self.assertEqual(_counters((1, 3, 8, 8), (16, 16), level="hot-fold")["channel_merges"],
                         3 * 256)

    def test_groups_are_16_channels_wide_and_8_in_double(self, device):
        for dtype, C, passes in ((torch.float32, 16, 1), (torch.float32, 17, 2),
                                 (torch.float16, 33, 3), (torch.float64, 8, 1),
                                 (torch.float64, 9, 2)):
            c = _counters((2, C, 8, 8), (16, 16), dtype=dtype, gather=1)
            self.assertEqual(c["channel_merges"], passes * c["items_sorted"], f"{dtype} C={C}")
            self.assertEqual(c["elements_swept"], 2 * C * 8 * 8, f"{dtype} C={C}")

    def test_channels_fastest_and_sparse_reduces_walk_once_per_channel(self, device):
        # From 16 channels lanes take channels fastest, a lane per channel.
        c = _counters((1, 20, 8, 8), (16, 16))
        self.assertEqual(c["channel_merges"], 20 * c["items_sorted"])
        # 64 points x 4 taps < 40000 destinations: the sparse reduce.
        c = _counters((1, 5, 200, 200), (8, 8))
        self.assertEqual(c["elements_swept"], 0)
        self.assertEqual(c["channel_merges"], 5 * 256)

    def test_every_chunk_counts_its_own_items(self, device):
        # Four chunks of a tile in half: a float carry between them.
        c = _counters((2, 3, 8, 8), (64, 128), dtype=torch.float16, chunk_points=TILE_POINTS)
        self.assertEqual(c["chunks"], 4)
        self.assertEqual(c["channel_merges"], c["items_sorted"])

    def test_exact_accumulation_counts_none(self, device):
        c = _counters((1, 3, 8, 8), (16, 16), accumulate="exact")
        self.assertEqual(c["channel_merges"], -1)

    def test_bench_rows_below_16_channels_merge_each_item_once(self, device):
        rows = [w for w in workloads.BENCH_WORKLOADS.values()
                if w.output_mask[0] and w.input_shape[1] < 16]
        self.assertGreaterEqual(len(rows), 8)
        for workload in rows:
            c = workloads.full_size_work_counters(workload, "ordered")
            self.assertEqual(c["channel_merges"], c["items_sorted"], workload.name)


instantiate_device_type_tests(TestChannelGroups, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestChannelMerges, globals(), only_for=("cpu",))

if __name__ == "__main__":
    run_tests()
