# Owner(s): ["module: nn"]
"""Stock's CPU float16/bfloat16 2-D backward is wrong beyond 2^15 - 1
elements of offset per input plane and crashes from about 400x400
(detgrid.bench.stock_limits): the limit's arithmetic, and that bench and the GPU
check's CPU timing never hand stock such an input. Nothing here runs stock
beyond the limit."""

from unittest import mock

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid.bench import matrix as bench, workloads
from detgrid.kit import gpucheck
from detgrid.bench.stock_limits import (
    STOCK_CPU_HALF_MAX_PLANE_OFFSET,
    largest_plane_offset,
    stock_cpu_backward_is_reliable,
    stock_cpu_workload_is_reliable,
)

HALF = (torch.float16, torch.bfloat16)


def _meta(shape, dtype, memory_format=torch.contiguous_format):
    return torch.empty(shape, dtype=dtype, device="meta", memory_format=memory_format)


class TestStockLimits(TestCase):
    @parametrize("dtype", HALF, name_fn=lambda d: str(d).split(".")[1])
    def test_limit_falls_where_stock_goes_wrong(self, dtype):
        # Measured on torch 2.13: right at the first shape of each pair,
        # wrong at the second.
        for right, wrong in (((1, 1, 181, 181), (1, 1, 182, 182)),
                             ((1, 1, 128, 256), (1, 1, 128, 257))):
            self.assertTrue(stock_cpu_backward_is_reliable(_meta(right, dtype)), right)
            self.assertFalse(stock_cpu_backward_is_reliable(_meta(wrong, dtype)), wrong)

    def test_channels_last_multiplies_the_offsets_by_the_channels(self):
        cl = torch.channels_last
        self.assertEqual(largest_plane_offset(_meta((1, 8, 64, 64), torch.half, cl)),
                         STOCK_CPU_HALF_MAX_PLANE_OFFSET - 7)
        self.assertTrue(stock_cpu_backward_is_reliable(_meta((1, 8, 64, 64), torch.half, cl)))
        self.assertFalse(stock_cpu_backward_is_reliable(_meta((1, 16, 64, 64), torch.half, cl)))

    def test_single_and_double_precision_and_3d_are_not_limited(self):
        for dtype in (torch.float32, torch.float64):
            self.assertTrue(stock_cpu_backward_is_reliable(_meta((1, 1, 500, 500), dtype)))
        self.assertTrue(stock_cpu_backward_is_reliable(_meta((1, 1, 40, 40, 40), torch.half)))

    def test_workload_check_follows_its_scale_and_layout(self):
        warp = workloads.BENCH_WORKLOADS["rgb_warp_bicubic_fp16"]  # 224x224 at full size
        self.assertFalse(stock_cpu_workload_is_reliable(warp, 1.0))
        self.assertTrue(stock_cpu_workload_is_reliable(warp, 0.5))
        # The CPU bench's own sizes stay below the limit.
        for size in ("tiny", "small"):
            for workload in workloads.BENCH_WORKLOADS.values():
                self.assertTrue(stock_cpu_workload_is_reliable(
                    workload, bench.size_scale(workload, size)), (workload.name, size))


class TestStockIsNeverAskedBeyondTheLimit(TestCase):
    def test_cpu_bench_skips_a_half_row_beyond_the_limit(self):
        config = bench.BenchConfig(device="cpu", names=["rgb_warp_bicubic_fp16"], scale=1.0,
                                   warmup=0, reps=1)
        with mock.patch.object(bench, "bench_workload",
                               side_effect=AssertionError("stock would run")):
            result = bench.run_bench(config)
        (row,) = result["workloads"]
        self.assertEqual(row["status"], "skipped")
        self.assertIn("detgrid.bench.stock_limits", row["skip_reason"])

    def test_cpu_timing_of_the_gpu_check_skips_a_half_row_beyond_the_limit(self):
        with mock.patch.object(gpucheck, "time_workload",
                               side_effect=AssertionError("stock would run")):
            result = gpucheck.run_timing("cpu", ["rgb_warp_bicubic_fp16"], scale=1.0)
        (row,) = result["rows"]
        self.assertIn("detgrid.bench.stock_limits", row["skipped"])


instantiate_parametrized_tests(TestStockLimits)

if __name__ == "__main__":
    run_tests()
