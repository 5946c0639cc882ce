# Owner(s): ["module: nn"]
"""accumulate="exact" (aten_kernels/extension/exact/, an extension-only
prototype): grad_input's terms are summed exactly, in integers, and rounded
once. Its promises, tested here against the host executor (and on CUDA
where detgrid has CUDA kernels):

- the sorted ("exact") and atomic ("exact_atomic") variants give the same
  bits as each other under every knob, chunk size, block of images and
  thread count;
- where every term is above the floor of ExactSum.cuh's contract, an
  element is the correctly rounded exact sum of its terms (checked with
  Python fractions), which the ordered fold is not;
- terms below the floor are rounded to it by the stated rule;
- NaN and Inf propagate as a float sum's do, and an exact sum does not
  overflow on the way to a representable result;
- the grid gradient is the ordered path's, bit for bit.
"""

import math
from fractions import Fraction

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid_testing import (
    ALL_DTYPES,
    BICUBIC,
    BILINEAR,
    NEAREST,
    PADDINGS,
    REDUCED_DTYPES,
    SAMPLERS,
    TILE_POINTS,
    ZEROS,
    DetgridTestCase,
    assert_bitwise_equal,
    assert_pair_bitwise_equal,
    detgrid_backward,
    dims_name,
    make_zoom_problem,
    padding_name,
    sampler_name,
)

EXACT_VARIANTS = ("exact", "exact_atomic")

# Precision (significand bits), smallest and largest normal exponents.
FORMATS = {
    torch.float16: (11, -14, 15),
    torch.bfloat16: (8, -126, 127),
    torch.float32: (24, -126, 127),
    torch.float64: (53, -1022, 1023),
}

# 32-bit words of an exact sum (ExactSum.cuh's Format): its fixed point has
# 32 * words bits below the bound.
WORDS = {torch.float16: 3, torch.bfloat16: 3, torch.float32: 3, torch.float64: 5}

# Knobs that change no bit, each with the variants it applies to.
KNOB_SETTINGS = (
    dict(chunk_points=TILE_POINTS),
    dict(keying=1),
    dict(index_bits=64),
    dict(gather=1),
    dict(gather=2),
)


def round_to_dtype(x, dtype):
    """The Fraction x rounded to nearest (ties to even) in dtype, as a
    Python float (which holds every value of the four dtypes exactly)."""
    precision, min_exponent, max_exponent = FORMATS[dtype]
    if x == 0:
        return 0.0
    sign = -1.0 if x < 0 else 1.0
    magnitude = abs(x)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    last = max(exponent, min_exponent) - (precision - 1)
    scaled = magnitude / Fraction(2) ** last
    kept = math.floor(scaled)
    rest = scaled - kept
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and kept % 2 == 1):
        kept += 1
    if kept * Fraction(2) ** last >= Fraction(2) ** (max_exponent + 1):
        return sign * math.inf
    return sign * math.ldexp(kept, last)


def pixel_center_problem(dims, dtype, device, *, points=4096, channels=2,
                         low=-20, high=20, seed=0):
    """Nearest sampling with every point exactly on a pixel center of a
    3 x 5 (3 x 3 x 5) input, align_corners=True, so every weight is 1 and
    every term is its grad_output value; grad_output spans 2^low .. 2^high
    with both signs. Returns (grad_output, input, grid, pixel of each
    point)."""
    sizes = (3, 3, 5)[-dims:]
    gen = torch.Generator().manual_seed(seed)
    pixel = torch.randint(0, math.prod(sizes), (points,), generator=gen)
    coords = []
    rest = pixel.clone()
    for size in reversed(sizes):  # the grid's order: x first
        coords.append(-1.0 + 2.0 * (rest % size).double() / (size - 1))
        rest = rest // size
    out_size = (1,) * (dims - 1) + (points,)
    grid = torch.stack(coords, dim=-1).reshape(1, *out_size, dims)
    magnitude = torch.exp2(torch.randint(low, high + 1, (1, channels, points),
                                         generator=gen).double())
    sign = torch.randint(0, 2, (1, channels, points), generator=gen).double() * 2 - 1
    mantissa = 1 + torch.rand(1, channels, points, generator=gen, dtype=torch.float64)
    grad_output = (sign * mantissa * magnitude).reshape(1, channels, *out_size)
    inp = torch.randn(1, channels, *sizes, generator=gen, dtype=torch.float64)
    return (grad_output.to(device=device, dtype=dtype), inp.to(device=device, dtype=dtype),
            grid.to(device=device, dtype=dtype), pixel)


def exact_sums(grad_output, pixel, pixels, dtype):
    """Per (channel, pixel), the correctly rounded exact sum of the
    grad_output values of the points on that pixel."""
    values = grad_output.double().cpu().reshape(grad_output.shape[1], -1)
    sums = [[Fraction(0)] * pixels for _ in range(values.shape[0])]
    for c in range(values.shape[0]):
        for p, v in zip(pixel.tolist(), values[c].tolist()):
            sums[c][p] += Fraction(v)
    return torch.tensor([[round_to_dtype(s, dtype) for s in row] for row in sums],
                        dtype=torch.float64)


def backward(problem, mode, padding=ZEROS, align_corners=False, **options):
    grad_output, inp, grid = problem[:3]
    return detgrid_backward(grad_output, inp, grid, mode, padding, align_corners, **options)


def zoom_problem(dims, dtype, device, channels=3):
    # More points than a tile, so chunk_points=4096 makes several chunks.
    if dims == 2:
        return make_zoom_problem(2, channels, 24, 30, 70, 70, dtype=dtype,
                                 device=device, seed=4)
    return make_zoom_problem(2, channels, 10, 12, 40, 40, D=6, out_D=4, dtype=dtype,
                             device=device, seed=4)


class TestExactAccumulation(DetgridTestCase):

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_exact_variants_give_the_same_bits_under_every_knob(self, device, dims,
                                                                mode, dtype):
        problem = zoom_problem(dims, dtype, device)
        expected = backward(problem, mode, accumulate="exact")
        for accumulate in EXACT_VARIANTS:
            for knobs in ({},) + KNOB_SETTINGS:
                got = backward(problem, mode, accumulate=accumulate, **knobs)
                assert_pair_bitwise_equal(self, got, expected, f"{accumulate} {knobs}")

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_grid_gradient_is_the_ordered_paths(self, device, dims, mode, dtype):
        problem = zoom_problem(dims, dtype, device)
        ordered = backward(problem, mode)
        for accumulate in EXACT_VARIANTS:
            both = backward(problem, mode, accumulate=accumulate)
            assert_bitwise_equal(self, both[1], ordered[1], f"{accumulate} grad_grid")

    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_exact_sums_are_no_less_accurate_than_the_ordered_sums(self, device, dims):
        # float32 against the float64 backward of the same inputs: both sum
        # the same rounded terms, the exact sums without further rounding.
        problem = zoom_problem(dims, torch.float32, device, channels=17)
        oracle = backward([t.double() for t in problem], BILINEAR)[0]
        ordered_error = (backward(problem, BILINEAR)[0].double() - oracle).abs().max()
        for accumulate in EXACT_VARIANTS:
            got = backward(problem, BILINEAR, accumulate=accumulate)[0]
            self.assertLessEqual((got.double() - oracle).abs().max(), ordered_error)

    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims", (2, 3), name_fn=dims_name)
    def test_nearest_sums_are_the_correctly_rounded_exact_sums(self, device, dims, dtype):
        # Binades within the floor of every dtype's fixed point (float64:
        # 2^-30 .. 2^30 uses 61 + 53 of its 160 bits; Half's own range is
        # narrower).
        low, high = {torch.float16: (-14, 10), torch.float64: (-30, 30)}.get(dtype, (-20, 20))
        *problem, pixel = pixel_center_problem(dims, dtype, device, low=low, high=high)
        pixels = problem[1][0, 0].numel()
        expected = exact_sums(problem[0], pixel, pixels, dtype)
        for accumulate in EXACT_VARIANTS:
            grad_input, _ = backward(problem, NEAREST, align_corners=True,
                                     accumulate=accumulate)
            got = grad_input.double().cpu().reshape(expected.shape)
            self.assertTrue(torch.equal(got, expected),
                            f"{accumulate}: {int((got != expected).sum())} of "
                            f"{expected.numel()} sums are not the correctly rounded ones")
        if dtype in (torch.float32, torch.float64):
            ordered, _ = backward(problem, NEAREST, align_corners=True)
            self.assertFalse(torch.equal(ordered.double().cpu().reshape(expected.shape),
                                         expected),
                             "the ordered fold rounded every sum correctly: the test "
                             "problem no longer tells the two apart")

    def test_terms_below_the_floor_round_to_a_multiple_of_the_unit(self, device):
        # 2-D, float32: one term of 2^10 sets the bound, top = 11 + 2 + 1 =
        # 14, so the unit is 2^(14 - 96) = 2^-82. On another pixel, four
        # terms of 3 * 2^-84 (three quarters of a unit) each round to one
        # unit: the sum is 4 * 2^-82 = 2^-80, where the exact one is
        # 3 * 2^-82.
        *problem, pixel = pixel_center_problem(2, torch.float32, device, points=5,
                                               channels=1)
        pixel[:] = torch.tensor([0, 1, 1, 1, 1])
        grid = problem[2].clone()
        grid[0, 0, :, 0] = torch.tensor([-1.0, -0.5, -0.5, -0.5, -0.5])
        grid[0, 0, :, 1] = -1.0
        grad_output = torch.tensor([2.0 ** 10] + [3 * 2.0 ** -84] * 4,
                                   device=device).reshape(1, 1, 1, 5)
        for accumulate in EXACT_VARIANTS:
            grad_input, _ = detgrid_backward(grad_output, problem[1], grid.to(device),
                                             NEAREST, ZEROS, True, accumulate=accumulate)
            self.assertEqual(grad_input[0, 0, 0, 0].item(), 2.0 ** 10)
            self.assertEqual(grad_input[0, 0, 0, 1].item(), 2.0 ** -80)

    @parametrize("accumulate", EXACT_VARIANTS)
    def test_a_sum_does_not_overflow_on_the_way_to_a_representable_result(
            self, device, accumulate):
        # 2^127 + 2^127 - 2^127 is 2^127 exactly; a float fold overflows to
        # Inf after the first addition. 2^127 + 2^127 alone is beyond
        # float32: +Inf.
        *problem, _ = pixel_center_problem(2, torch.float32, device, points=5,
                                           channels=1)
        grid = problem[2].clone()
        grid[0, 0, :, 0] = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0])
        grid[0, 0, :, 1] = -1.0
        big = 2.0 ** 127
        grad_output = torch.tensor([big, big, -big, big, big],
                                   device=device).reshape(1, 1, 1, 5)
        grad_input, _ = detgrid_backward(grad_output, problem[1], grid.to(device),
                                         NEAREST, ZEROS, True, accumulate=accumulate)
        self.assertEqual(grad_input[0, 0, 0, 0].item(), big)
        self.assertEqual(grad_input[0, 0, 0, 4].item(), math.inf)
        ordered, _ = detgrid_backward(grad_output, problem[1], grid.to(device),
                                      NEAREST, ZEROS, True)
        self.assertEqual(ordered[0, 0, 0, 0].item(), math.inf)

    @parametrize("dtype", ALL_DTYPES)
    def test_nan_and_inf_propagate_as_in_a_float_sum(self, device, dtype):
        # Pixels 0..3 receive +Inf, -Inf, both, and NaN beside finite terms.
        *problem, pixel = pixel_center_problem(2, dtype, device, points=512,
                                               channels=1, low=-4, high=4)
        grad_output = problem[0].clone()
        flat = grad_output.view(-1)
        inf = math.inf
        for value, target in ((inf, 0), (-inf, 1), (inf, 2), (-inf, 2), (math.nan, 3)):
            points = (pixel == target).nonzero().flatten()
            flat[points[len(points) // 2]] = value
        ordered, _ = backward((grad_output,) + tuple(problem[1:]), NEAREST,
                              align_corners=True)
        for accumulate in EXACT_VARIANTS:
            got, _ = backward((grad_output,) + tuple(problem[1:]), NEAREST,
                              align_corners=True, accumulate=accumulate)
            got, want = got.double().cpu().flatten(), ordered.double().cpu().flatten()
            self.assertTrue(torch.equal(got.isnan(), want.isnan()), accumulate)
            self.assertTrue(torch.equal(got.isposinf(), want.isposinf()), accumulate)
            self.assertTrue(torch.equal(got.isneginf(), want.isneginf()), accumulate)
            self.assertEqual(got[:4].isfinite().sum().item(), 0)
            finite = want.isfinite()
            self.assertEqual(got[finite], want[finite], atol=1e-2, rtol=1e-2)

    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    @parametrize("padding", PADDINGS, name_fn=padding_name)
    def test_hostile_grids_give_the_ordered_paths_zeros(self, device, dims, mode, padding):
        # NaN, +-Inf and huge coordinates contribute nothing (invariant (c));
        # the exact sums of what remains match the ordered ones closely.
        problem = list(zoom_problem(dims, torch.float32, device))
        grid = problem[2].clone()
        flat = grid.view(-1, dims)
        for i, value in enumerate((math.nan, math.inf, -math.inf, 1e30, -1e38, 6e4)):
            flat[i::7, i % dims] = value
        problem[2] = grid
        ordered = backward(problem, mode, padding)
        expected = backward(problem, mode, padding, accumulate="exact")
        self.assertTrue(expected[0].isfinite().all())
        self.assertEqual(expected[0], ordered[0], atol=1e-4, rtol=1e-5)
        assert_pair_bitwise_equal(
            self, backward(problem, mode, padding, accumulate="exact_atomic"), expected,
            "atomic vs sorted")

    @parametrize("dtype", (torch.float32, torch.float64) + REDUCED_DTYPES)
    def test_blocks_of_images_give_the_bits_of_one_image_at_a_time(self, device, dtype):
        # Two images whose slices (28 or 44 bytes an element) pass 64 MiB
        # together: two blocks, each summed and rounded on its own. The same
        # images one call at a time fit one block each.
        grad_output, inp, grid = make_zoom_problem(2, 8, 512, 640, 16, 16, dtype=dtype,
                                                   device=device, seed=9)
        counters = ops.work_counters(grad_output, inp, grid, BILINEAR, ZEROS, False,
                                     [True, True], accumulate="exact")
        image_slices = inp[0].numel() * (8 * WORDS[dtype] + 4)
        self.assertGreater(image_slices, 64 << 20)
        self.assertLess(counters["workspace_bytes"], 2 * image_slices,
                        "the slices no longer hold one image at a time")
        for accumulate in EXACT_VARIANTS:
            both = backward((grad_output, inp, grid), BILINEAR, accumulate=accumulate)
            for n in range(2):
                one = backward((grad_output[n:n + 1], inp[n:n + 1], grid[n:n + 1]),
                               BILINEAR, accumulate=accumulate)
                assert_bitwise_equal(self, both[0][n:n + 1], one[0], f"{accumulate} image {n}")

    @parametrize("accumulate", EXACT_VARIANTS)
    def test_blocks_of_channels_give_the_bits_of_one_channel_at_a_time(self, device,
                                                                     accumulate):
        # One image whose channel planes take 72 MB of slices each: blocks
        # of one channel plane; the grid gradient is computed in the first.
        grad_output, inp, grid = make_zoom_problem(1, 3, 1600, 1600, 24, 24,
                                                   device=device, seed=10)
        self.assertGreater(inp[0, 0].numel() * 28, 64 << 20)
        both = backward((grad_output, inp, grid), BILINEAR, accumulate=accumulate)
        for c in range(3):
            one = backward((grad_output[:, c:c + 1], inp[:, c:c + 1], grid), BILINEAR,
                           accumulate=accumulate)
            assert_bitwise_equal(self, both[0][:, c:c + 1], one[0], f"channel {c}")
        ordered = backward((grad_output, inp, grid), BILINEAR)
        assert_bitwise_equal(self, both[1], ordered[1], "grad_grid")

    def test_unknown_accumulation_is_refused_in_one_line(self, device):
        problem = zoom_problem(2, torch.float32, device)
        with self.assertRaisesRegex(RuntimeError, r"^[^\n]*ACCUMULATE_MODES[^\n]*$"):
            backward(problem, BILINEAR, accumulate="fast")
        with self.assertRaisesRegex(RuntimeError,
                                    r"^[^\n]*accumulate must be 0 \(ordered\), 1 \(exact\) "
                                    r"or 2 \(exact, atomic\), got 3[^\n]*$"):
            backward(problem, BILINEAR, accumulate=3)
        with self.assertRaisesRegex(RuntimeError,
                                    r"^[^\n]*sorts 32-bit keys: key_bits must be 0 or 32, "
                                    r"got 64[^\n]*$"):
            backward(problem, BILINEAR, accumulate="exact", key_bits=64)


class TestExactAccumulationOnHost(DetgridTestCase):

    @parametrize("accumulate", EXACT_VARIANTS)
    def test_exact_sums_do_not_depend_on_the_thread_count(self, accumulate):
        problem = zoom_problem(2, torch.float32, "cpu")
        threads = torch.get_num_threads()
        self.addCleanup(torch.set_num_threads, threads)
        torch.set_num_threads(1)
        expected = backward(problem, BICUBIC, accumulate=accumulate)
        for count in (2, 3, 4):
            torch.set_num_threads(count)
            for grain_size in (1, 7, 0):
                got = backward(problem, BICUBIC, accumulate=accumulate,
                               grain_size=grain_size)
                assert_pair_bitwise_equal(self, got, expected,
                                          f"{count} threads, grain {grain_size}")


    @parametrize("dtype", ALL_DTYPES)
    @parametrize("dims,mode", SAMPLERS, name_fn=sampler_name)
    def test_weights_stay_within_the_scales_bound(self, dims, mode, dtype):
        # The scale assumes |weight| <= 2^dims (ExactSum.cuh, 1.). Widths
        # past 2048 (Half) and 256 (BFloat16) are where their tap positions
        # round, and a bilinear axis weight reaches 2.
        sizes = (3001, 2049, 4099)[-dims:]
        gen = torch.Generator().manual_seed(1)
        grid = (torch.rand(200_000, dims, generator=gen, dtype=torch.float64) * 2.2 - 1.1)
        largest = 0.0
        for padding in PADDINGS:
            for align_corners in (False, True):
                _, _, weight = torch.ops.detgrid._point_taps(
                    grid.to(dtype), list(sizes), mode, padding, align_corners)
                largest = max(largest, weight.abs().max().item())
        self.assertLessEqual(largest, 2.0 ** dims)
        if dtype == torch.float16 and mode == BILINEAR:
            self.assertEqual(largest, 2.0 ** dims, "Half no longer reaches the bound")


class TestExactWorkCounters(DetgridTestCase):

    def _counters(self, shape_in, shape_grid, mode=BILINEAR, output_mask=(True, True),
                  **options):
        inp = torch.empty(shape_in, device="meta")
        grid = torch.empty(shape_grid, device="meta")
        grad_output = torch.empty(shape_in[:2] + shape_grid[1:-1], device="meta")
        return ops.work_counters(grad_output, inp, grid, mode, ZEROS, False,
                                 list(output_mask), **options)

    def test_the_atomic_variant_sorts_nothing_and_counts_its_atomics(self):
        shape_in, shape_grid = (2, 3, 64, 64), (2, 100, 100, 2)
        atomic = self._counters(shape_in, shape_grid, accumulate="exact_atomic")
        self.assertEqual(atomic["items_sorted"], 0)
        points = 2 * 100 * 100
        prepass_threads = 2 * 3 * math.ceil(100 * 100 / 64)
        # Two words a float term spans at most, per record and channel.
        self.assertEqual(atomic["atomics"], points * 4 * 3 * 2 + prepass_threads)
        sorted_exact = self._counters(shape_in, shape_grid, accumulate="exact")
        ordered = self._counters(shape_in, shape_grid)
        self.assertEqual(sorted_exact["items_sorted"], ordered["items_sorted"])
        self.assertEqual(sorted_exact["atomics"], prepass_threads)
        self.assertEqual(ordered["atomics"], 0)

    def test_slices_take_28_bytes_an_element_within_64_mib(self):
        # float32: 3 words of int64 and 4 bytes of flags per element; a batch
        # whose slices pass 64 MiB takes blocks of whole images.
        small = self._counters((2, 3, 64, 64), (2, 100, 100, 2),
                               accumulate="exact_atomic", keying=1)
        ordered = self._counters((2, 3, 64, 64), (2, 100, 100, 2), keying=1)
        elements = 2 * 3 * 64 * 64
        self.assertGreaterEqual(small["workspace_bytes"] - elements * 28, 0)
        self.assertLess(small["workspace_bytes"], ordered["workspace_bytes"] + elements * 28)
        big = self._counters((64, 8, 256, 256), (64, 4, 4, 2), accumulate="exact_atomic")
        image = 8 * 256 * 256 * 28
        self.assertLessEqual(big["workspace_bytes"], (64 << 20) + (1 << 20))
        self.assertGreaterEqual(big["workspace_bytes"], (64 << 20) // image * image)

    def test_more_destinations_than_32_bit_keys_hold_is_refused_in_one_line(self):
        # 2^31 destinations: "nowhere", the key after the last one, would
        # be 2^31. The grid gradient alone sorts nothing and passes.
        shape_in, shape_grid = (1, 1, 1 << 16, 1 << 15), (1, 1, 4, 2)
        with self.assertRaisesRegex(RuntimeError, r"^[^\n]*sorts 32-bit keys, but this "
                                                  r"problem has 2147483648[^\n]*$"):
            self._counters(shape_in, shape_grid, accumulate="exact")
        grid_only = self._counters(shape_in, shape_grid, accumulate="exact",
                                   output_mask=(False, True))
        self.assertEqual(grid_only["items_sorted"], 0)

    def test_more_terms_per_element_than_the_slices_hold_is_refused_in_one_line(self):
        # Bicubic: 16 terms a point; 2^27 points of one image could put 2^31
        # on one element, one more than 2^31 - 1; 2^26 points fit.
        with self.assertRaisesRegex(RuntimeError, r"^[^\n]*at most 2\^31 - 1 terms[^\n]*$"):
            self._counters((1, 1, 8, 8), (1, 1 << 13, 1 << 14, 2), mode=BICUBIC,
                           accumulate="exact")
        self._counters((1, 1, 8, 8), (1, 1 << 13, 1 << 13, 2), mode=BICUBIC,
                       accumulate="exact")


instantiate_device_type_tests(TestExactAccumulation, globals(), only_for=("cpu", "cuda"))
instantiate_parametrized_tests(TestExactAccumulationOnHost)

if __name__ == "__main__":
    run_tests()
