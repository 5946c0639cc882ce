# Owner(s): ["module: nn"]
"""The chunk limits the kernel's numbering relies on, at their boundary.

A chunk's record ids (point * taps + tap) are int32 in the sort payloads and
uint32 in the fold's tile ends, whose "exhausted" marker is 2^32 - 1; dense
tables number cells in int32. The pipeline keeps every chunk within 2^31 - 1
records (GridSamplerDeterministicPipeline.cuh, kMaxChunkRecords): a requested
chunk one tile beyond it is refused, the largest one within it gives the
default's bits, and the default chunk of a problem of 2^32 points stays
within it (meta tensors: nothing is allocated)."""

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid_testing import (
    BICUBIC,
    BILINEAR,
    NEAREST,
    TAPS_PER_POINT,
    TILE_POINTS,
    ZEROS,
    assert_pair_bitwise_equal,
    detgrid_backward,
    make_problem,
    mode_name,
)

MAX_CHUNK_RECORDS = 2 ** 31 - 1


def largest_chunk(taps):
    """The most points, in whole tiles, whose records fit MAX_CHUNK_RECORDS."""
    return MAX_CHUNK_RECORDS // taps // TILE_POINTS * TILE_POINTS


class TestChunkLimits(TestCase):
    @parametrize("mode", (BILINEAR, NEAREST, BICUBIC), name_fn=mode_name)
    def test_largest_chunk_is_accepted_and_one_tile_more_refused(self, mode):
        problem = make_problem(1, 2, 5, 6, 7, 8, dtype=torch.float32)
        points = largest_chunk(TAPS_PER_POINT[mode])
        assert_pair_bitwise_equal(
            self,
            detgrid_backward(*problem, mode, ZEROS, False, chunk_points=points),
            detgrid_backward(*problem, mode, ZEROS, False),
            f"{mode_name(mode)}, {points} points per chunk")
        with self.assertRaisesRegex(RuntimeError, r"chunk_points \* taps < 2\^31"):
            detgrid_backward(*problem, mode, ZEROS, False, chunk_points=points + TILE_POINTS)

    @parametrize("mode", (BILINEAR, NEAREST, BICUBIC), name_fn=mode_name)
    def test_default_chunks_of_a_huge_problem_stay_within_int32_records(self, mode):
        # 2^32 points (16 x 2^28 records for bicubic): many chunks, each within the limit.
        grid_hw = (2 ** 16, 2 ** 16)
        grad_output = torch.empty((1, 1, *grid_hw), device="meta")
        inp = torch.empty((1, 1, 64, 64), device="meta")
        grid = torch.empty((1, *grid_hw, 2), device="meta")
        c = ops.work_counters(grad_output, inp, grid, mode, ZEROS, False, [True, True])
        points_per_chunk = -(-c["points"] // c["chunks"])
        self.assertGreater(c["chunks"], 1)
        self.assertLessEqual(points_per_chunk * TAPS_PER_POINT[mode], MAX_CHUNK_RECORDS)


instantiate_parametrized_tests(TestChunkLimits)

if __name__ == "__main__":
    run_tests()
