# Owner(s): ["module: nn"]
"""The builds of the core (detgrid.levels.CORE_BUILDS) through detgrid.ops,
where their plan meets its limits: a chunk ends at CORE_CHUNK_RECORDS records
(a last chunk of one point, a problem of 2^32 points), Half and BFloat16 sums
over several chunks wait in a float scratch and are rounded once, a thread of
grouped-channels takes up to four channels of a run (channel counts around
the group, runs long enough for stored partials), pixels no tap reaches stay
+0, and a pixel with thousands of records is summed in bounded partials.
Every build gives the same bits under every launch shape of the host build
(tests/test_golden.py and tests/test_core_golden.py pin them on the golden
corpus; tests/test_core.py runs the core's own kernels)."""

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests

import stock_reference as ref
from detgrid import levels, ops
from detgrid.bench import workloads
from detgrid_testing import (
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    NEAREST,
    PADDINGS,
    REDUCED_DTYPES,
    SAMPLERS,
    ZEROS,
    DetgridTestCase,
    assert_pair_bitwise_equal,
    assert_within_rounding_of_exact,
    depth_sizes,
    detgrid_backward,
    dims_name,
    make_problem,
    make_zoom_problem,
    meta_problem,
    padding_name,
    sampler_name,
    snapped_grid,
    stock_backward,
    taps_per_point,
)

MIB = 1 << 20
# The workspace of a chunk (GridSamplerDeterministic.cu, kMaxChunkRecords).
CHUNK_WORKSPACE = 64 * MIB
# Launch shapes of the host build, (block_size, max_blocks): its own, small
# blocks on a small grid, one thread a block.
LAUNCHES = ((0, 0), (32, 3), (1, 7))
# Channel counts around grouped-channels' group of four: less than one, one,
# one and a remainder, whole groups, and more.
CHANNELS = (1, 3, 4, 5, 8, 9, 17)


def counters(problem, mode, level=levels.TOP, padding=ZEROS):
    return ops.work_counters(*problem, mode, padding, False, [True, True], level=level)


class TestBuildsAgree(DetgridTestCase):

    def assert_every_build_gives_the_defaults_bits(self, device, problem, mode, padding,
                                                   what):
        """Every build and (on CPU) launch shape gives the default's bits;
        returns the default's gradients."""
        default = detgrid_backward(*problem, mode, padding, False)
        launches = LAUNCHES if device == "cpu" else ((0, 0),)
        for level in levels.CORE_BUILDS:
            for block_size, max_blocks in launches:
                assert_pair_bitwise_equal(
                    self, detgrid_backward(*problem, mode, padding, False, level=level,
                                           block_size=block_size, max_blocks=max_blocks),
                    default, f"{what}: {level}, launch {block_size, max_blocks}")
        return default

    @parametrize("dtype", (torch.float64, torch.float16), name_fn=lambda d: str(d)[6:])
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_a_chunk_ends_at_its_record_limit(self, device, dims, mode, dtype):
        # CORE_CHUNK_RECORDS records fill one chunk; one point more opens a
        # second chunk of that point's records alone. Both give every build's
        # bits and the reference's float64 sums.
        taps = taps_per_point(mode, dims)
        for points, chunks in ((ops.CORE_CHUNK_RECORDS // taps, 1),
                               (ops.CORE_CHUNK_RECORDS // taps + 1, 2)):
            problem = make_problem(1, 2, 5, 6, 1, points, dtype=dtype, device=device,
                                   seed=points, **depth_sizes(dims, 4, 1))
            self.assertEqual(counters([t.to("meta") for t in problem], mode)["chunks"],
                             chunks)
            grad_input, _ = self.assert_every_build_gives_the_defaults_bits(
                device, problem, mode, ZEROS, f"{points} points")
            on_cpu = [t.cpu() for t in problem]
            want, _ = ref.backward(*on_cpu, mode, ZEROS, False)
            if dtype == torch.float64:
                self.assertEqual(grad_input.cpu(), want, atol=1e-12, rtol=1e-12)
            else:
                assert_within_rounding_of_exact(self, grad_input, want, on_cpu, mode, ZEROS,
                                                False)

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_every_channel_count_gives_the_cores_bits(self, device, dims, dtype):
        # grouped-channels walks a run's records once per group of four
        # channels, each channel's sum in the core's order: runs longer than a
        # partial (stored partials) and channel counts around the group.
        for C in CHANNELS:
            if dims == 2:
                problem = make_zoom_problem(2, C, 6, 7, 40, 48, dtype=dtype, device=device,
                                            seed=C)
            else:
                problem = make_zoom_problem(1, C, 5, 6, 24, 24, D=4, out_D=4, dtype=dtype,
                                            device=device, seed=C)
            for mode in (BILINEAR, NEAREST, BICUBIC):
                self.assert_every_build_gives_the_defaults_bits(
                    device, problem, mode, ZEROS, f"C={C} mode={mode}")
            if device == "cpu":
                fold = counters(problem, BILINEAR, level=levels.CORE)["longest_fold"]
                self.assertGreater(fold, ops.CORE_PARTIAL_RECORDS, f"C={C}")


class TestChunkLimits(DetgridTestCase):

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_a_problem_of_2_to_the_32_points_takes_whole_chunks_within_the_workspace(
            self, device, dims, mode):
        # Shapes alone (meta tensors): every chunk but the last holds exactly
        # CORE_CHUNK_RECORDS records, and the workspace stays within a chunk's.
        grid_spatial = (2 ** 16, 2 ** 16) if dims == 2 else (2 ** 10, 2 ** 11, 2 ** 11)
        problem = meta_problem((1, 1) + (16,) * dims, grid_spatial)
        for level in levels.CORE_BUILDS:
            c = counters(problem, mode, level)
            self.assertEqual(c["points"], 2 ** 32)
            self.assertEqual(c["records"], 2 ** 32 * taps_per_point(mode, dims))
            self.assertEqual(c["items_sorted"], c["records"])
            self.assertEqual(c["chunks"], -(-c["records"] // ops.CORE_CHUNK_RECORDS))
            self.assertLessEqual(c["workspace_bytes"], CHUNK_WORKSPACE)

    @parametrize("dtype", ALL_DTYPES)
    def test_reduced_precision_sums_over_chunks_take_a_float_scratch(self, device, dtype):
        # 64 channels of 512 x 1024 over several chunks: Half and BFloat16
        # grad_input waits in a float per element beside the chunks'
        # workspace; float and double sum into grad_input itself.
        problem = meta_problem((1, 64, 512, 1024), (1200, 1200), dtype)
        c = counters(problem, BILINEAR)
        self.assertGreater(c["chunks"], 1)
        scratch = 4 * 64 * 512 * 1024 if dtype in REDUCED_DTYPES else 0
        self.assertGreaterEqual(c["workspace_bytes"], scratch)
        self.assertLessEqual(c["workspace_bytes"] - scratch, CHUNK_WORKSPACE)

    @parametrize("dtype", REDUCED_DTYPES, name_fn=lambda d: str(d)[6:])
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_reduced_precision_is_rounded_once_over_several_chunks(self, device, dims,
                                                                   dtype):
        # The float scratch is rounded to the dtype once, at the end, so the
        # result is the float32 result rounded. On half pixels of power-of-two
        # sizes the dtype's weights and bilinear terms are float32's (see
        # snapped_grid).
        if dims == 2:
            problem = make_problem(40, 2, 64, 64, 64, 64, device=device, seed=5)
        else:
            problem = make_problem(1, 2, 32, 64, 24, 24, D=32, out_D=128, device=device,
                                   seed=5)
        grad_output, inp, grid = problem
        grid = snapped_grid(grid, inp.shape[2:], 2)
        reduced = [t.to(dtype) for t in (grad_output, inp, grid)]
        self.assertGreater(counters([t.to("meta") for t in reduced], BILINEAR)["chunks"], 1)
        got, _ = detgrid_backward(*reduced, BILINEAR, ZEROS, False)
        full, _ = detgrid_backward(*(t.float() for t in reduced), BILINEAR, ZEROS, False)
        self.assertTrue(torch.equal(got, full.to(dtype)))


class TestUntouchedPixels(DetgridTestCase):

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("align_corners", (False, True))
    def test_few_points_on_a_large_input_agree_with_stock(self, device, dims, mode, padding,
                                                          align_corners):
        # A 4 x 5 grid on a 40 x 50 input (2 x 4 x 5 on 3 x 40 x 50 in
        # 3-D): most pixels receive nothing.
        grad_output, inp, grid = make_problem(2, 3, 40, 50, 4, 5, device=device, seed=11,
                                              **depth_sizes(dims, 3, 2))
        got = detgrid_backward(grad_output, inp, grid, mode, padding, align_corners)
        expected = stock_backward(grad_output.cpu(), inp.cpu(), grid.cpu(), mode, padding,
                                  align_corners)
        self.assertEqual(got[0].cpu(), expected[0], atol=1e-12, rtol=1e-12)
        self.assertEqual(got[1].cpu(), expected[1], atol=1e-12, rtol=1e-12)

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_untouched_pixels_are_positive_zero(self, device, dims):
        grad_output, inp, grid = make_problem(1, 2, 64, 64, 2, 2, device=device, seed=2,
                                              grid_range=0.5, **depth_sizes(dims, 16, 1))
        grad_input, _ = detgrid_backward(grad_output, inp, grid, NEAREST, ZEROS, False)
        touched = (grad_input != 0).any(dim=1)
        # Nearest: exactly one pixel per point, the rest are +0.0.
        self.assertLessEqual(int(touched.sum()), 4)
        untouched = grad_input.movedim(1, -1)[~touched]
        self.assertTrue(torch.equal(untouched, torch.zeros_like(untouched)))
        self.assertFalse(torch.signbit(untouched).any())


class TestLongRuns(DetgridTestCase):

    def test_tensorf_line_at_full_size_is_summed_in_bounded_partials(self, device):
        # BENCHMARKS #11: a million points down a column of 300 pixels, each
        # pixel with about 6,900 records: the run's first partial, then its
        # stored partials, so that no thread adds more than a few hundred terms.
        if device != "cpu":
            self.skipTest("longest_fold is counted by the host build")
        case = workloads.BENCH_WORKLOADS["tensorf_line"].build(scale=1.0)
        for level in levels.CORE_BUILDS:
            c = workloads.work_counters(case, level)
            self.assertLessEqual(c["longest_fold"], ops.core_longest_fold(8000), level)
            self.assertLessEqual(c["workspace_bytes"], CHUNK_WORKSPACE, level)
        # Not vacuous: a pixel is the nearest of 3,333 points on average, and
        # takes taps of about twice as many, which one thread would add in turn.
        self.assertGreater(workloads.samples_per_cell(case)["mean"], 3000)
        self.assertGreater(ops.core_longest_fold(8000), ops.CORE_PARTIAL_RECORDS)
        self.assertLess(ops.core_longest_fold(8000), 300)


instantiate_device_type_tests(TestBuildsAgree, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestChunkLimits, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestUntouchedPixels, globals(), only_for=("cpu", "cuda"))
instantiate_device_type_tests(TestLongRuns, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
