# Owner(s): ["module: nn"]
"""The hot fold: destinations one of whose keys holds more than 4096 records
in a chunk (4096 / 2^dims where records are keyed by cell).

A dense chunk folds each destination's records in one thread, in sorted
order. Where one pixel takes most of a chunk's records (a collapsed flow
field, an untrained spatial transformer) that thread would add a million of
them in sequence while the rest of the GPU waits. Instead, the tiles of such
a destination are folded in parallel first, into the same 256-record
partials the serial fold forms, and one thread per element then adds the
stored partials in the same order (GridSamplerDeterministicPipeline.cuh,
HotFold). These tests pin the bits to the serial fold's (serial_fold=1)
wherever the hot fold runs, and bound the longest fold on a constant grid."""

import math

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests

from detgrid import ops
from detgrid.bench import workloads
from detgrid_testing import (
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    PADDINGS,
    REDUCED_DTYPES,
    SAMPLERS,
    TILE_POINTS,
    ZEROS,
    DetgridTestCase,
    assert_pair_bitwise_equal,
    detgrid_backward,
    padding_name,
    pixel_to_grid,
    sampler_name,
)

HOT_RECORDS = 4096  # a destination with more records in a chunk is hot


def hot_problem(dims, C=3, dtype=torch.float32, device="cpu", seed=0):
    """Two images of 8192 points on an 8 x 8 (x 8) input, 90% of them within
    a third of a pixel of one place: every tap of theirs lands on a pixel
    that takes more than 7000 records, whatever the mode. The other points
    are spread over the input; the grad outputs span several binades, so
    that the order of the sums shows in the bits."""
    gen = torch.Generator().manual_seed(seed)
    in_size = (8,) * dims
    out_size = (2, 64, 64) if dims == 3 else (64, 128)
    points = 2 * math.prod(out_size)
    hot = torch.rand(points, generator=gen, dtype=torch.float64) < 0.9
    # [2.05, 2.35): one nearest pixel, one bilinear and bicubic cell.
    near = 2.05 + 0.3 * torch.rand(points, dims, generator=gen, dtype=torch.float64)
    anywhere = torch.rand(points, dims, generator=gen, dtype=torch.float64) * 7
    pixels = torch.where(hot.unsqueeze(1), near, anywhere)
    grid = pixel_to_grid(pixels, 8, False).reshape(2, *out_size, dims)
    inp = torch.randn(2, C, *in_size, generator=gen, dtype=torch.float64)
    scale = torch.exp2(torch.randint(-6, 7, (2, C, *out_size), generator=gen)
                       .to(torch.float64))
    grad_output = torch.randn(2, C, *out_size, generator=gen, dtype=torch.float64) * scale
    return tuple(t.to(device=device, dtype=dtype) for t in (grad_output, inp, grid))


def line_problem(C=48, pixels=16, tiles=16, seed=5):
    """tensorf's line at a small size: one image of `tiles` tiles of points
    spread evenly down a column of `pixels` pixels, so that every pixel is
    hot (about 8000 records) and has records in every tile (about 500)."""
    gen = torch.Generator().manual_seed(seed)
    points = tiles * TILE_POINTS
    y = torch.rand(points, generator=gen, dtype=torch.float64) * (pixels - 1)
    x = torch.zeros(points, dtype=torch.float64)
    grid = torch.stack([pixel_to_grid(x, 1, False), pixel_to_grid(y, pixels, False)], -1)
    inp = torch.randn(1, C, pixels, 1, generator=gen)
    grad_output = torch.randn(1, C, points, 1, generator=gen)
    return grad_output, inp, grid.reshape(1, points, 1, 2).float()


def longest_fold(problem, mode, padding, **options):
    return ops.work_counters(*(t.cpu() for t in problem), mode, padding, False,
                             [True, True], **options)["longest_fold"]


def constant_grid(points_per_side, in_size, device="cpu"):
    """Every point a quarter pixel right of and below pixel (0, 0)'s centre."""
    x = pixel_to_grid(0.25, in_size, False)
    return torch.full((1, points_per_side, points_per_side, 2), x, device=device)


class TestHotFold(DetgridTestCase):

    @parametrize("padding", PADDINGS, name_fn=padding_name)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_hot_fold_gives_the_serial_folds_bits(self, device, dims, mode, padding):
        problem = hot_problem(dims, device=device)
        # Not vacuous: the serial fold runs hot destinations' records in
        # one thread, the hot fold never more than 4096 of anything.
        serial = longest_fold(problem, mode, padding, serial_fold=1)
        self.assertGreater(serial, HOT_RECORDS)
        if (dims, mode) == (3, BICUBIC):
            # Tricubic sampling runs with 64-bit index math only, and the
            # hot fold with 32-bit indices only: its hot destinations fold
            # serially (same bits, checked below).
            self.assertEqual(longest_fold(problem, mode, padding), serial)
        else:
            self.assertLessEqual(longest_fold(problem, mode, padding), HOT_RECORDS)
        hot = detgrid_backward(*problem, mode, padding, False)
        serial = detgrid_backward(*problem, mode, padding, False, serial_fold=1)
        assert_pair_bitwise_equal(self, hot, serial)

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims", (2, 3))
    def test_hot_fold_gives_the_serial_folds_bits_in_every_dtype(self, device, dims, dtype):
        problem = hot_problem(dims, dtype=dtype, device=device, seed=1)
        assert_pair_bitwise_equal(
            self, detgrid_backward(*problem, BILINEAR, ZEROS, False),
            detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1))

    @parametrize("knobs", (
        # keyed per tap rather than per cell
        {"keying": 1},
        # threads take destinations fastest; channels fastest
        {"gather": 1}, {"gather": 2},
        # a tile per chunk: no destination has more than 4096 records
        {"chunk_points": TILE_POINTS},
        # three tiles per chunk, the chunks straddling the images
        {"chunk_points": 3 * TILE_POINTS},
    ), name_fn=lambda knobs: "_".join(f"{k}{v}" for k, v in knobs.items()))
    @parametrize("C", (1, 3, 17))
    def test_hot_fold_gives_the_serial_folds_bits_under_every_plan(self, device, C, knobs):
        for dtype in (torch.float32,) + REDUCED_DTYPES:  # the float carry too
            problem = hot_problem(2, C=C, dtype=dtype, device=device, seed=2)
            assert_pair_bitwise_equal(
                self, detgrid_backward(*problem, BILINEAR, ZEROS, False, **knobs),
                detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1, **knobs),
                f"{dtype} {knobs}")

    def test_destinations_whose_units_overflow_the_pool_fold_serially_with_the_same_bits(
            self, device):
        # 100 channels, and a chunk as large as the problem, so the pool has
        # no spare workspace to grow into: the chunk's dead keys (64 KiB)
        # hold the running sums of its 64 possible hot destinations and 96
        # units of partials, so the first hot destinations (about 30 units
        # each) store theirs and the others fold their records in one
        # thread each.
        problem = hot_problem(2, C=100, device=device, seed=4)
        knobs = {"chunk_points": 4 * TILE_POINTS}
        self.assertGreater(longest_fold(problem, BILINEAR, ZEROS, **knobs), HOT_RECORDS)
        assert_pair_bitwise_equal(
            self, detgrid_backward(*problem, BILINEAR, ZEROS, False, **knobs),
            detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1, **knobs))

    @parametrize("chunk_points", (None, 16 * TILE_POINTS),
                 name_fn=lambda c: "default_chunk" if c is None else "chunk_is_the_problem")
    def test_pixels_hot_in_every_tile_take_units_per_record_not_per_tile(
            self, device, chunk_points):
        # 16 hot pixels x 16 tiles: 256 groups of about 2 partials each. At a
        # tile's 16 partial slots per group they would take 4096 units, where
        # the dead keys (256 KiB, less the running sums) hold about 1000 at
        # 48 channels; sized per record they take 16 x (16 + 32) = 768, which
        # fit even where the chunk leaves no spare workspace.
        problem = line_problem()
        knobs = {} if chunk_points is None else {"chunk_points": chunk_points}
        self.assertGreater(longest_fold(problem, BILINEAR, ZEROS, serial_fold=1), 8000)
        self.assertLessEqual(longest_fold(problem, BILINEAR, ZEROS, **knobs), 1024)
        problem = tuple(t.to(device) for t in problem)
        assert_pair_bitwise_equal(
            self, detgrid_backward(*problem, BILINEAR, ZEROS, False, **knobs),
            detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1, **knobs))

    def test_constant_grid_folds_at_most_8192_in_sequence(self, device):
        # 1024 x 1024 points on a 2 x 2 input: each pixel takes one record
        # of every point (issue 33).
        grid = constant_grid(1024, 2, device)
        gen = torch.Generator().manual_seed(3)
        inp = torch.randn(1, 3, 2, 2, generator=gen).to(device)
        grad_output = torch.randn(1, 3, 1024, 1024, generator=gen).to(device)
        problem = (grad_output, inp, grid)
        # 256 tiles of 16 partials each (4096 records per tile).
        self.assertEqual(longest_fold(problem, BILINEAR, ZEROS), 4096)
        self.assertEqual(longest_fold(problem, BILINEAR, ZEROS, serial_fold=1), 1024 * 1024)
        assert_pair_bitwise_equal(
            self, detgrid_backward(*problem, BILINEAR, ZEROS, False),
            detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1))

    def test_tensorf_line_at_full_size_folds_at_most_1024_in_sequence(self, device):
        # BENCHMARKS #11: a million points down a column of 300 pixels, each
        # pixel hot with about 6,900 records spread over all 245 tiles (73,500
        # groups of about 27). Slotted per tile, its partials overflowed the
        # pool and every pixel folded its records serially.
        case = workloads.BENCH_WORKLOADS["tensorf_line"].build(scale=1.0)
        counters = workloads.work_counters(case)
        self.assertLessEqual(counters["longest_fold"], 1024)
        # Not vacuous: a pixel is the nearest of 3,333 points on average,
        # and takes taps of about twice as many, which the serial fold would
        # add in one thread.
        self.assertGreater(workloads.samples_per_cell(case)["mean"], 3000)
        self.assertLessEqual(counters["workspace_bytes"] + counters["sort_scratch_bytes"],
                             64 << 20)

    def test_hot_fold_launches_only_where_a_chunk_can_have_a_hot_destination(self, device):
        def launches(points, **knobs):
            grid = constant_grid(points, 2)
            meta = [t.to("meta") for t in (torch.empty(1, 3, points, points),
                                           torch.empty(1, 3, 2, 2), grid)]
            return ops.work_counters(*meta, BILINEAR, ZEROS, False, [True, False],
                                     **knobs)["launches_per_chunk"]

        # 32 x 32 points keyed per cell: 1024 records, no cell can hold
        # more than 4096 / 4.
        self.assertEqual(launches(32), 4)
        # 33 x 33: a sum over the slots numbers the hot groups' partials,
        # then one launch marks the segments, in place of the plain marking,
        # and stores the partials; the reduce adds them.
        self.assertEqual(launches(33), 4 + 1)
        self.assertEqual(launches(33, serial_fold=1), 4)

    def test_hot_fold_copies_grad_output_where_no_other_launch_does(self, device):
        # From 16 channels the reduce reads a channels-last copy of
        # grad_output. Above 64 channels (or with separate fills) the point
        # pass does not make it, and in a chunk with a hot key the hot
        # fold's launch does, its stores reading grad_output itself.
        def launches(problem, **knobs):
            return ops.work_counters(*(t.to("meta") for t in problem), BILINEAR, ZEROS,
                                     False, [True, False], **knobs)["launches_per_chunk"]

        for C, knobs, fills in ((65, {}, 0), (16, {"separate_fills": 1}, 1)):
            problem = hot_problem(2, C=C, device=device, seed=8)
            hot = detgrid_backward(*problem, BILINEAR, ZEROS, False, **knobs)
            serial = detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=1,
                                      **knobs)
            assert_pair_bitwise_equal(self, hot, serial, f"C={C} {knobs}")
            # point pass, sort, copy, mark segments, reduce
            self.assertEqual(launches(problem, serial_fold=1, **knobs), 5 + fills)
            # point pass, sort, sum over the slots, hot fold (the copy in
            # it), reduce
            self.assertEqual(launches(problem, **knobs), 5 + fills)

    def test_unknown_serial_fold_is_a_one_line_error(self, device):
        problem = hot_problem(2, device=device)
        with self.assertRaisesRegex(
                RuntimeError, "serial_fold must be 0 \\(hot destinations in parallel\\) or 1, got 2$"):
            detgrid_backward(*problem, BILINEAR, ZEROS, False, serial_fold=2)


instantiate_device_type_tests(TestHotFold, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
