# Owner(s): ["module: nn"]
"""The float carry of Half and BFloat16 sums over several chunks stays within
the 64 MiB workspace.

Half and BFloat16 gradients are summed in float. Where an element's records
span chunks, its running sum waits between them in a float carry; the
carry takes at most half the workspace (kCarryBytes, 32 MiB: 8 Mi floats),
and where grad_input's float sums need more, they are made block by block
(whole rows (n, c) of grad_input, or runs of one row's columns where a row
alone does not fit), each block re-running the point passes and sorts of its
images' chunks. The canonical order does not depend on the blocks, so every
layout gives the bits of one chunk without a carry."""

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid_testing import assert_bitwise_equal, detgrid_backward, make_problem, meta_problem

BILINEAR, ZEROS = 0, 0
MIB = 2 ** 20
CARRY_ELEMENTS = 32 * MIB // 4  # kCarryBytes of float sums
CHUNK_POINTS = 4096
GRID_SIDE = 128  # 16384 points: four chunks of CHUNK_POINTS


class TestFloatCarry(TestCase):

    @parametrize("dtype", (torch.float16, torch.bfloat16), name_fn=lambda d: str(d)[6:])
    def test_workspace_holds_the_carry_of_a_grad_input_over_64_mib(self, dtype):
        # 64 channels of 512 x 1024: grad_input is 64 MiB in the dtype and
        # would need a 128 MiB float carry; 1200 x 1200 points take several
        # chunks.
        problem = meta_problem((1, 64, 512, 1024), (1200, 1200), dtype)
        c = ops.work_counters(*problem, BILINEAR, ZEROS, False, [True, True])
        self.assertGreater(c["chunks"], 1)
        self.assertLessEqual(c["workspace_bytes"] + c["sort_scratch_bytes"], 64 * MIB - MIB)

    @parametrize(
        "layout,input_shape",
        (("rows_sparse", (1, 9, 1024, 1024)),  # 9 rows of 1 Mi: two blocks
         ("columns_sparse", (1, 1, 4096, 2100))),  # one row past the carry
        name_fn=lambda layout, shape: layout)
    def test_blocks_of_the_carry_give_the_bits_of_one_chunk(self, layout, input_shape):
        n, c, h, w = input_shape
        self.assertGreater(n * c * h * w, CARRY_ELEMENTS, "precondition: blocks")
        self.assert_blocks_give_the_bits_of_one_chunk(input_shape)

    def test_blocks_of_the_carry_give_the_bits_of_one_chunk_rows_dense(self):
        # A dense layout past the carry takes 4096 channels of 48 x 48 (2209
        # cells), a minute of the host's time; capped at 3 rows, the carry
        # makes the same blocks of whole rows of 8 channels.
        rows = 3 * 48 * 48
        shape = (1, 8, 48, 48)
        self.assertEqual(self.chunks(shape, carry_elements=rows), 3 * 4, "precondition: blocks")
        self.assertGreater(self.chunks((1, 4096, 48, 48)), 4, "the same at full size")
        self.assert_blocks_give_the_bits_of_one_chunk(shape, carry_elements=rows)

    def test_unknown_carry_elements_is_a_one_line_error(self):
        args = make_problem(1, 1, 8, 8, 4, 4, dtype=torch.float16, seed=5)
        with self.assertRaisesRegex(
                RuntimeError, "carry_elements must be 0 \\(as planned\\) or positive, got -1$"):
            detgrid_backward(*args, BILINEAR, ZEROS, False, carry_elements=-1)

    @staticmethod
    def chunks(input_shape, **knobs):
        """Chunks run, counting each block's again, at CHUNK_POINTS."""
        problem = meta_problem(input_shape, (GRID_SIDE, GRID_SIDE), torch.float16)
        return ops.work_counters(*problem, BILINEAR, ZEROS, False, [True, True],
                                 chunk_points=CHUNK_POINTS, **knobs)["chunks"]

    def assert_blocks_give_the_bits_of_one_chunk(self, input_shape, **knobs):
        n, c, h, w = input_shape
        args = make_problem(n, c, h, w, GRID_SIDE, GRID_SIDE, dtype=torch.float16,
                            seed=5, grid_range=1.0)
        one_chunk = detgrid_backward(*args, BILINEAR, ZEROS, False,
                                     chunk_points=GRID_SIDE * GRID_SIDE)
        blocks = detgrid_backward(*args, BILINEAR, ZEROS, False, chunk_points=CHUNK_POINTS,
                                  **knobs)
        assert_bitwise_equal(self, blocks[0], one_chunk[0], "grad_input")
        assert_bitwise_equal(self, blocks[1], one_chunk[1], "grad_grid")


instantiate_parametrized_tests(TestFloatCarry)

if __name__ == "__main__":
    run_tests()
