# Owner(s): ["module: nn"]
"""Fused fills: the point pass zero-fills a dense chunk's segment table and,
up to 64 channels, copies the chunk's grad_output channels last, where the
stack's earlier levels launch both on their own (separate_fills=1). Every
chunk must see a clean table and its own copy, so the bits are the same."""

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests

from detgrid import ops
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


def _launches_per_chunk(input_shape, grid_spatial, **knobs):
    return ops.work_counters(*meta_problem(input_shape, grid_spatial), BILINEAR, ZEROS, False,
                             [True, False], **knobs)["launches_per_chunk"]


class TestFusedFills(DetgridTestCase):

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims", (2, 3))
    def test_fused_fills_give_the_bits_of_separate_launches(self, device, dims, dtype):
        # Channels fastest, so that grad_output (channel stride > 1) is
        # copied: by the point pass up to 64 channels, on its own beyond.
        # Chunks of a tile: every chunk's table and copy are filled anew.
        for C in (16, 17, 64, 65):
            problem = make_problem(2, C, 6, 7, 24, 20, **depth_sizes(dims, 5, 3),
                                   dtype=dtype, device=device, seed=C)
            for mode in (BILINEAR, NEAREST):
                knobs = {"gather": 2, "chunk_points": TILE_POINTS}
                assert_pair_bitwise_equal(
                    self, detgrid_backward(*problem, mode, ZEROS, False, **knobs),
                    detgrid_backward(*problem, mode, ZEROS, False, separate_fills=1, **knobs),
                    f"C={C} mode={mode}")

    def test_hot_fold_marks_the_table_the_point_pass_cleared(self, device):
        # The hot fold's launch marks the segment table that the point pass
        # zero-filled, chunk by chunk: an entry left from an earlier chunk
        # (a hot key's {end, ~begin}) would make an untouched key hot.
        problem = hot_problem(2, C=3, device=device, seed=7)
        for knobs in ({}, {"chunk_points": 3 * TILE_POINTS}):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*problem, BILINEAR, ZEROS, False, **knobs),
                detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1,
                                 separate_fills=1, **knobs), str(knobs))

    @parametrize("dims", (2, 3))
    def test_a_one_point_last_chunk_gives_the_bits_of_one_chunk(self, device, dims):
        # A dense table of 4096 cells and a last chunk of one point, whose
        # table the executor's zero fill clears rather than its one thread
        # (test_work_counters): the bits of one chunk, and of separate fills.
        side = 63 if dims == 2 else 15
        problem = make_problem(1, 2, side, side, 1, TILE_POINTS + 1,
                               **depth_sizes(dims, side, 1), device=device, seed=dims)
        expected = detgrid_backward(*problem, BILINEAR, ZEROS, False)
        for knobs in ({}, {"separate_fills": 1}):
            assert_pair_bitwise_equal(
                self, detgrid_backward(*problem, BILINEAR, ZEROS, False,
                                       chunk_points=TILE_POINTS, **knobs),
                expected, str(knobs))

    def test_a_dense_chunk_launches_neither_fill(self, device):
        # point pass, sort, mark segments, reduce
        self.assertEqual(_launches_per_chunk((1, 3, 8, 8), (16, 16)), 4)
        # + the table's zero fill
        self.assertEqual(_launches_per_chunk((1, 3, 8, 8), (16, 16), separate_fills=1), 5)
        # 64 channels, channels fastest: the point pass copies grad_output.
        self.assertEqual(_launches_per_chunk((1, 64, 8, 8), (16, 16)), 4)
        # 65: the copy is a launch of its own.
        self.assertEqual(_launches_per_chunk((1, 65, 8, 8), (16, 16)), 5)
        self.assertEqual(_launches_per_chunk((1, 64, 8, 8), (16, 16), separate_fills=1), 6)
        self.assertEqual(_launches_per_chunk((1, 64, 8, 8), (16, 16), level="channel-groups"),
                         6)

    def test_unknown_separate_fills_is_a_one_line_error(self, device):
        problem = make_problem(1, 2, 4, 4, 4, 4, device=device)
        with self.assertRaisesRegex(
                RuntimeError, "separate_fills must be 0 \\(in the point pass\\) or 1 "
                "\\(launches of their own\\), got 2$"):
            detgrid_backward(*problem, BILINEAR, ZEROS, False, separate_fills=2)


instantiate_device_type_tests(TestFusedFills, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
