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

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS = 0
MIB = 2 ** 20


def _meta_problem(input_shape, grid_spatial, dtype=torch.float32):
    n, c = input_shape[:2]
    dims = len(input_shape) - 2
    inp = torch.empty(input_shape, dtype=dtype, device="meta")
    grid = torch.empty((n, *grid_spatial, dims), dtype=dtype, device="meta")
    grad_output = torch.empty((n, c, *grid_spatial), dtype=dtype, device="meta")
    return grad_output, inp, grid


def _counters(input_shape, grid_spatial, mode=BILINEAR, mask=(True, True),
              dtype=torch.float32, **knobs):
    return ops.work_counters(*_meta_problem(input_shape, grid_spatial, dtype), mode, ZEROS,
                             False, list(mask), **knobs)


class TestWorkCounters(TestCase):

    def test_dense_bilinear_call_counts_by_hand(self):
        # 256 points x 4 taps = 1024 records >= 64 destinations: dense.
        c = _counters((1, 3, 8, 8), (16, 16))
        self.assertEqual(c["points"], 256)
        self.assertEqual(c["records"], 1024)
        self.assertEqual(c["items_sorted"], 1024)
        self.assertEqual(c["chunks"], 1)
        # point pass, sort, two zero fills of the segment bounds, mark
        # segments, reduce
        self.assertEqual(c["launches_per_chunk"], 6)
        self.assertEqual(c["launches"], 6)
        self.assertEqual(c["key_bits"], 7)  # keys 0..64 (64 marks "nowhere")
        self.assertEqual(c["key_bytes"], 4)
        # keys in/out, ids in (+1) and out, weights, per-point offsets
        self.assertEqual(c["workspace_bytes"],
                         2 * 1024 * 4 + (1025 + 1024) * 4 + 1024 * 4 + 256 * 4)

    def test_sparse_bilinear_call_counts_by_hand(self):
        # 64 points x 4 taps = 256 records < 40000 destinations: sparse.
        c = _counters((1, 1, 200, 200), (8, 8))
        self.assertEqual(c["items_sorted"], 256)
        self.assertEqual(c["chunks"], 1)
        # point pass, sort, heads, scan, run starts, reduce; plus the zero
        # fill of grad_input before the first chunk
        self.assertEqual(c["launches_per_chunk"], 6)
        self.assertEqual(c["launches"], 7)
        self.assertEqual(c["key_bits"], 16)  # keys 0..40000
        self.assertEqual(c["workspace_bytes"],
                         2 * 256 * 4 + (257 + 256) * 4 + 256 * 4 + 64 * 4 + 4)

    def test_grid_gradient_alone_sorts_nothing(self):
        c = _counters((2, 3, 8, 8), (16, 16), mask=(False, True))
        self.assertEqual(c["records"], 0)
        self.assertEqual(c["items_sorted"], 0)
        self.assertEqual(c["chunks"], 0)
        self.assertEqual(c["launches"], 1)  # the point pass
        self.assertEqual(c["workspace_bytes"], 0)

    def test_chunks_of_a_reduced_precision_call_add_a_float_carry(self):
        # 3 chunks of 4096 points; sparse (10^4 destinations > 16384 records
        # is false: 100 x 100 = 10^4 <= 16384, so dense).
        c = _counters((1, 2, 100, 100), (96, 128), dtype=torch.float16, chunk_points=4096)
        self.assertEqual(c["chunks"], 3)
        self.assertEqual(c["items_sorted"], 96 * 128 * 4)
        self.assertEqual(c["launches"], 3 * 6)
        records = 4096 * 4
        own = 2 * records * 4 + (2 * records + 1) * 4 + records * 4 + 4096 * 4
        self.assertEqual(c["workspace_bytes"], own + 2 * 100 * 100 * 4)

    def test_sparse_float_carry_is_rounded_out_once(self):
        c = _counters((1, 1, 300, 300), (64, 128), dtype=torch.bfloat16, chunk_points=4096)
        self.assertEqual(c["chunks"], 2)
        # zero fill, 2 chunks of 6, the rounding of the carry into grad_input
        self.assertEqual(c["launches"], 1 + 2 * 6 + 1)

    @parametrize("dims,mode,taps", [(2, BILINEAR, 4), (2, NEAREST, 1), (2, BICUBIC, 16),
                                    (3, BILINEAR, 8), (3, NEAREST, 1), (3, BICUBIC, 64)],
                 name_fn=lambda dims, mode, taps: f"{dims}d_{taps}_taps")
    def test_items_sorted_are_points_times_taps(self, dims, mode, taps):
        shape = (2, 3) + (5,) * dims
        c = _counters(shape, (6,) * dims, mode=mode)
        self.assertEqual(c["items_sorted"], 2 * 6 ** dims * taps)
        self.assertEqual(c["items_sorted"], c["records"])

    def test_meta_and_real_tensors_count_the_same(self):
        torch.manual_seed(0)
        inp = torch.randn(2, 3, 9, 7)
        grid = torch.rand(2, 5, 6, 2) * 2 - 1
        grad_output = torch.randn(2, 3, 5, 6)
        real = ops.work_counters(grad_output, inp, grid, BICUBIC, ZEROS, True, [True, True])
        meta = ops.work_counters(grad_output.to("meta"), inp.to("meta"), grid.to("meta"),
                                 BICUBIC, ZEROS, True, [True, True])
        self.assertEqual(real, meta)

    @parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    def test_workspace_is_bounded_whatever_the_input_size(self, dtype):
        # Our buffers stay within 64 MiB with 32-bit keys (CUB's sort scratch
        # comes on top: about one more key and id per record of a chunk), and
        # do not grow with the problem once it fills a chunk. Full precision
        # keeps its sums in grad_input; a Half/BFloat16 float carry is
        # counted apart below.
        for dims in (2, 3):
            for mode in (BILINEAR, NEAREST, BICUBIC):
                sizes = []
                for side in (2048, 4096) if dims == 2 else (160, 200):
                    c = _counters((2, 4) + (side,) * dims, (side,) * dims, mode=mode,
                                  dtype=dtype)
                    own = c["workspace_bytes"]
                    if dtype in (torch.float16, torch.bfloat16) and c["chunks"] > 1:
                        own -= 2 * 4 * side ** dims * 4  # the float carry of grad_input
                    self.assertLessEqual(own, 64 * MIB, msg=f"{dims}d mode {mode} {side}")
                    sizes.append(own)
                self.assertEqual(sizes[0], sizes[1], msg=f"{dims}d mode {mode}")

    def test_keys_are_32_bit_until_destinations_reach_2_to_31(self):
        self.assertEqual(_counters((1, 1, 32768, 65535), (4, 4))["key_bytes"], 4)
        self.assertEqual(_counters((1, 1, 32768, 65536), (4, 4))["key_bytes"], 8)

    def test_forced_widths(self):
        self.assertEqual(_counters((1, 1, 8, 8), (4, 4), key_bits=64)["key_bytes"], 8)
        with self.assertRaisesRegex(RuntimeError, "key_bits=32, but this problem needs 64 bits"):
            _counters((1, 1, 32768, 65536), (4, 4), key_bits=32)
        with self.assertRaisesRegex(RuntimeError, "index_bits must be 0 \\(automatic\\), 32 or 64"):
            _counters((1, 1, 8, 8), (4, 4), index_bits=16)


instantiate_parametrized_tests(TestWorkCounters)

if __name__ == "__main__":
    run_tests()
