# Owner(s): ["module: nn"]
"""Golden digests of the host executor: the bits it gave when the table was
written are the bits it must give now (tests/golden/corpus.py builds the
cases and their inputs; tests/golden/digests.json holds the SHA-256 of
grad_input and grad_grid per case). A change meant for speed changes no
digest; a change meant to change results rewrites the table, on purpose:
  python tests/golden/corpus.py          (rewrite)
  python tests/golden/corpus.py --check  (compare, naming every case that differs)

The tests also pin what the corpus covers, so that it cannot shrink
silently, and the input generator, so that the inputs (and so the digests)
do not move with torch's random generators."""

import hashlib

import numpy as np
import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from golden import corpus
from golden.corpus import CASES, CASES_BY_NAME

GOLDEN = corpus.load()


def _tricubic(case):
    return case.dims == 3 and case.mode == "bicubic"


def _names(predicate):
    return sorted(case.name for case in CASES if predicate(case))


class TestGoldenDigests(TestCase):

    @parametrize("name", sorted(CASES_BY_NAME), name_fn=lambda name: name)
    def test_host_executor_bits_equal_golden_digest(self, name):
        case = CASES_BY_NAME[name]
        self.assertIn(name, GOLDEN, f"{name}: no entry in digests.json; rewrite the table")
        expected = {k: GOLDEN[name][k] for k in ("grad_input", "grad_grid")}
        self.assertEqual(corpus.compute(case), expected,
                         msg=f"{name} ({case.description}): digests differ from the table")

    def test_whole_corpus_matches_with_one_and_two_threads(self):
        threads = torch.get_num_threads()
        self.addCleanup(torch.set_num_threads, threads)
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            differ = [case.name for case in CASES
                      if corpus.compute(case) != {k: GOLDEN[case.name][k]
                                                  for k in ("grad_input", "grad_grid")}]
            self.assertEqual(differ, [], msg=f"{num_threads} threads")

    @parametrize("index_bits", (32, 64))
    @parametrize("key_bits", (32, 64))
    def test_every_key_and_index_width_gives_the_golden_bits(self, key_bits, index_bits):
        # The pipeline picks int32 keys and int32 index math where they fit;
        # forcing each of the four combinations runs the other instantiations
        # of the same code, which must not move a bit. 3-D bicubic sampling
        # is built with 64-bit index math only: index_bits=32 is refused
        # there, in one line.
        cases = [case for case in CASES
                 if index_bits == 64 or not _tricubic(case)]
        differ = [case.name for case in cases
                  if corpus.compute(case, key_bits=key_bits, index_bits=index_bits)
                  != {k: GOLDEN[case.name][k] for k in ("grad_input", "grad_grid")}]
        self.assertEqual(differ, [])
        if index_bits == 32:
            tricubic = [case for case in CASES if _tricubic(case)]
            self.assertGreaterEqual(len(tricubic), 10)
            for case in tricubic:
                with self.assertRaisesRegex(
                        RuntimeError, "^grid_sampler_3d_backward \\(deterministic\\): "
                        "index_bits=32, but 3-D bicubic sampling runs with 64-bit index "
                        "math only$"):
                    corpus.compute(case, key_bits=key_bits, index_bits=index_bits)

    @parametrize("keying,gather", [(1, 0), (0, 1), (0, 2), (1, 2)],
                 name_fn=lambda keying, gather: f"keying{keying}_gather{gather}")
    def test_every_keying_and_thread_order_gives_the_golden_bits(self, keying, gather):
        # Bilinear and trilinear sampling sort one key per point (its cell)
        # where the reduction is dense and merge the neighbouring cells per
        # destination; keying=1 sorts one key per tap instead. The dense
        # reduce takes destinations fastest below 16 channels (every case
        # here); gather=2 takes channels fastest, reading a channels-last
        # copy of each chunk's grad_output where its channel stride is not 1.
        # Every combination must give every case's golden bits.
        per_cell = [case for case in CASES if case.keying == "cell"]
        self.assertGreaterEqual(len(per_cell), 30)
        differ = [case.name for case in CASES
                  if corpus.compute(case, keying=keying, gather=gather)
                  != {k: GOLDEN[case.name][k] for k in ("grad_input", "grad_grid")}]
        self.assertEqual(differ, [])

    def test_one_key_per_point_covers_every_padding_rank_and_grid_kind(self):
        per_cell = [case for case in CASES if case.keying == "cell"]
        self.assertEqual({(c.dims, c.padding) for c in per_cell},
                         {(d, p) for d in (2, 3) for p in corpus.PADDINGS})
        self.assertEqual({c.align_corners for c in per_cell}, {False, True})
        self.assertEqual({c.grid for c in per_cell}, set(corpus.GRID_KINDS))
        self.assertEqual({c.dtype for c in per_cell}, set(corpus.DTYPES))
        self.assertTrue(any(c.num_chunks > 1 and c.dtype in corpus.REDUCED_DTYPES
                            for c in per_cell))

    def test_keying_restated_by_the_corpus_is_the_executors(self):
        # The counting executor runs the pipeline's own plan: one sort item
        # per point where the corpus says "cell", one per record elsewhere.
        for case in CASES:
            if case.reduction == "none":
                continue
            grad_output, inp, grid = corpus.make_inputs(case)
            counters = ops.work_counters(
                grad_output, inp, grid, corpus.MODES[case.mode],
                corpus.PADDINGS[case.padding], case.align_corners,
                list(case.output_mask), chunk_points=case.chunk_points)
            items_per_point = 1 if case.keying == "cell" else case.taps
            self.assertEqual(counters["items_sorted"], case.points * items_per_point,
                             msg=case.name)
            self.assertEqual(counters["chunks"], case.num_chunks, msg=case.name)

    def test_table_has_exactly_the_corpus_cases_with_current_descriptions(self):
        self.assertEqual(sorted(GOLDEN), sorted(CASES_BY_NAME),
                         msg="digests.json and the corpus list different cases")
        for case in CASES:
            self.assertEqual(GOLDEN[case.name]["description"], case.description,
                             msg=f"{case.name}: description in digests.json is stale")
            for key in ("grad_input", "grad_grid"):
                self.assertTrue(
                    GOLDEN[case.name][key] == corpus.NONE_DIGEST
                    or (len(GOLDEN[case.name][key]) == 64
                        and int(GOLDEN[case.name][key], 16) >= 0),
                    f"{case.name}: {key} is not a hex SHA-256")

    def test_table_file_is_in_canonical_form(self):
        with open(corpus.DIGESTS_PATH) as f:
            self.assertEqual(f.read(), corpus.dumps(GOLDEN))

    def test_masked_out_outputs_have_the_none_digest(self):
        for case in CASES:
            entry = GOLDEN[case.name]
            for key, wanted in zip(("grad_input", "grad_grid"), case.output_mask):
                self.assertEqual(entry[key] == corpus.NONE_DIGEST, not wanted,
                                 msg=f"{case.name}: {key}")

    def test_knobs_reach_the_op(self):
        # compute(case, **knobs) hands knobs to the _with_options op: an
        # invalid chunk size is refused there, an equivalent one changes no bit.
        case = CASES_BY_NAME["chunks_2d_bilinear_dense_float32"]
        with self.assertRaisesRegex(RuntimeError, "chunk_points must be"):
            corpus.compute(case, chunk_points=100)
        self.assertEqual(corpus.compute(case, chunk_points=8192, grain_size=5),
                         {k: GOLDEN[case.name][k] for k in ("grad_input", "grad_grid")})


class TestGoldenCorpusCoverage(TestCase):
    """What the corpus claims to cover, checked on the case list (and, for
    record counts and non-finite values, on the generated inputs)."""

    def test_corpus_has_at_least_120_cases(self):
        self.assertGreaterEqual(len(CASES), 120)

    def test_every_mode_padding_align_corners_in_both_ranks(self):
        present = {(c.dims, c.mode, c.padding, c.align_corners) for c in CASES}
        for dims in (2, 3):
            for mode in corpus.MODES:
                for padding in corpus.PADDINGS:
                    for align in (False, True):
                        self.assertIn((dims, mode, padding, align), present)

    def test_every_dtype_in_both_ranks_and_both_reductions(self):
        present = {(c.dims, c.dtype, c.reduction) for c in CASES}
        for dims in (2, 3):
            for dtype in corpus.DTYPES:
                for reduction in ("dense", "sparse"):
                    self.assertIn((dims, dtype, reduction), present)

    def test_both_reductions_for_every_sampler(self):
        present = {(c.dims, c.mode, c.reduction) for c in CASES}
        for dims in (2, 3):
            for mode in corpus.MODES:
                for reduction in ("dense", "sparse"):
                    self.assertIn((dims, mode, reduction), present)

    def test_names_saying_dense_or_sparse_are_right(self):
        # The executor's rule restated in Case.reduction; names that claim a
        # reduction must match it.
        for case in CASES:
            for reduction in ("dense", "sparse"):
                if f"_{reduction}" in case.name:
                    self.assertEqual(case.reduction, reduction, msg=case.name)
                    self.assertIn(f"{reduction} reduction", case.description)

    def test_several_chunks_dense_and_sparse_in_every_dtype_and_rank(self):
        multi = [c for c in CASES if c.num_chunks > 1 and c.reduction != "none"]
        present = {(c.dims, c.dtype, c.reduction) for c in multi}
        for dtype in corpus.DTYPES:
            for reduction in ("dense", "sparse"):
                self.assertIn((2, dtype, reduction), present)
        for dtype in ("float32",) + corpus.REDUCED_DTYPES:
            for reduction in ("dense", "sparse"):
                self.assertIn((3, dtype, reduction), present)
        self.assertEqual({c.chunk_points for c in multi} >= {4096, 8192}, True)
        # 8192-point chunks with more than one chunk, reduced precision too.
        self.assertTrue(any(c.chunk_points == 8192 and c.dtype in corpus.REDUCED_DTYPES
                            for c in multi))
        self.assertTrue(any(c.num_chunks >= 3 for c in multi))

    def test_channels_last_and_zero_stride_grad_output(self):
        channels_last = {(c.dims, c.reduction) for c in CASES if c.layout == "channels_last"}
        grad_outputs = {(c.dims, c.grad_output) for c in CASES}
        for dims in (2, 3):
            for reduction in ("dense", "sparse"):
                self.assertIn((dims, reduction), channels_last)
            for kind in ("expanded", "expanded_channel"):
                self.assertIn((dims, kind), grad_outputs)
        self.assertTrue(_names(lambda c: c.grid_layout == "strided"))
        case = CASES_BY_NAME["layout_expanded_grad_output_2d_bilinear_float32_dense"]
        grad_output, inp, _ = corpus.make_inputs(case)
        self.assertEqual(grad_output.stride(), (0,) * grad_output.dim())
        case = CASES_BY_NAME["layout_channels_last_3d_bilinear_float64_dense"]
        grad_output, inp, _ = corpus.make_inputs(case)
        self.assertTrue(inp.is_contiguous(memory_format=torch.channels_last_3d))
        self.assertFalse(inp.is_contiguous())
        self.assertTrue(grad_output.is_contiguous(memory_format=torch.channels_last_3d))

    def test_both_output_masks_and_the_full_one_in_both_ranks(self):
        present = {(c.dims, c.output_mask) for c in CASES}
        for dims in (2, 3):
            for mask in ((True, False), (False, True), (True, True)):
                self.assertIn((dims, mask), present)

    def test_non_default_grain_sizes(self):
        self.assertGreaterEqual(len({c.grain_size for c in CASES} - {0}), 3)

    def test_nan_and_inf_grid_coordinates_with_every_padding(self):
        for dims in (2, 3):
            for padding in corpus.PADDINGS:
                names = [c.name for c in CASES if c.dims == dims and c.padding == padding
                         and c.grid == "nonfinite"]
                self.assertTrue(names, (dims, padding))
                for name in names:
                    grid = corpus.make_inputs(CASES_BY_NAME[name])[2].double()
                    self.assertTrue(grid.isnan().any(), name)
                    self.assertTrue(grid.isposinf().any(), name)
                    self.assertTrue(grid.isneginf().any(), name)

    @staticmethod
    def _hot_destination(case):
        """(records, first point, last point) of the destination that most
        points certainly reach: for bilinear the NW corner of their cell, for
        nearest their pixel, counting only finite points well inside the
        image and away from cell edges (so that rounding cannot move them)."""
        grid = corpus.make_inputs(case)[2].double().numpy().reshape(case.N, -1, case.dims)
        keys = np.zeros(grid.shape[:2], dtype=np.int64)
        ok = np.ones(grid.shape[:2], dtype=bool)
        stride = 1
        for axis, size in enumerate(reversed(case.in_size)):
            x = grid[..., axis]
            pixel = ((x + 1) / 2 * (size - 1) if case.align_corners
                     else ((x + 1) * size - 1) / 2)
            if case.mode == "nearest":
                index, frac = np.floor(pixel + 0.5), pixel + 0.5 - np.floor(pixel + 0.5)
            else:
                index, frac = np.floor(pixel), pixel - np.floor(pixel)
            ok &= (np.isfinite(pixel) & (index >= 0) & (index <= size - 2)
                   & (frac > 0.01) & (frac < 0.99))
            keys += np.where(ok, index, 0).astype(np.int64) * stride
            stride *= size
        keys += np.arange(case.N)[:, None] * stride
        point = np.arange(case.points).reshape(case.N, -1)
        keys, point = keys[ok], point[ok]
        values, counts = np.unique(keys, return_counts=True)
        hot = values[np.argmax(counts)]
        return int(counts.max()), int(point[keys == hot].min()), int(point[keys == hot].max())

    def test_destinations_with_more_than_256_records_across_tiles(self):
        self.assertEqual(corpus.RECORDS_PER_PARTIAL, 256)
        crossing = []
        keyings = set()
        for case in CASES:
            if case.name.startswith("hot_") and case.mode in ("bilinear", "nearest"):
                records, first, last = self._hot_destination(case)
                self.assertGreater(records, corpus.RECORDS_PER_PARTIAL, case.name)
                if first // corpus.TILE_POINTS != last // corpus.TILE_POINTS:
                    crossing.append((case.dims, case.reduction, case.num_chunks))
                    keyings.add((case.mode, case.keying))
        self.assertIn((2, "sparse", 1), crossing)
        self.assertIn((3, "dense", 1), crossing)
        # The merge of neighbouring cells (one key per point) cuts partials
        # at the same records as one key per tap.
        self.assertIn(("bilinear", "cell"), keyings)
        # and one whose records also straddle a chunk boundary
        self.assertTrue(any(dims == 2 and chunks > 1 for dims, _, chunks in crossing))
        # Multi-chunk zoom cases: hot destinations in reduced precision, so
        # the float carry holds long sums.
        for name in ("chunks_2d_bilinear_dense_float16", "chunks_2d_bilinear_sparse_bfloat16",
                     "chunks_3d_bilinear_sparse_float16"):
            self.assertGreater(self._hot_destination(CASES_BY_NAME[name])[0], 1000, name)

    def test_grid_kinds(self):
        self.assertEqual({c.grid for c in CASES}, set(corpus.GRID_KINDS))
        # exact grids: every special pixel coordinate normalizes exactly
        case = CASES_BY_NAME["exact_2d_bilinear_zeros_align0_float32"]
        grid = corpus.make_inputs(case)[2]
        for axis, size in enumerate(reversed(case.in_size)):
            pixel = ((grid[..., axis].double() + 1) * size - 1) / 2
            self.assertTrue(bool(((pixel * 2).frac() == 0).all()), axis)


class TestGoldenGenerator(TestCase):
    """The inputs come from numpy's PCG64 bit stream and IEEE arithmetic
    alone: these constants hold on any torch."""

    def test_seed_is_sha256_of_the_case_name(self):
        self.assertEqual(corpus.seed_of("matrix_2d_bilinear_zeros_align0_float32_dense"),
                         9463952438327132855)

    def test_draws_are_pcg64_raw_outputs(self):
        draws = corpus.Draws(20240601)
        self.assertEqual([int(x) for x in draws.raw(3)],
                         [14606525003716441270, 10715116236421299223, 7652839370049166271])
        draws = corpus.Draws(20240601)
        self.assertEqual([float(x).hex() for x in draws.uniform(3)],
                         ['0x1.95699a3452c26p-1', '0x1.29677ae44dd2fp-1',
                          '0x1.a8d163713b9e6p-2'])
        draws = corpus.Draws(20240601)
        self.assertEqual([float(x).hex() for x in draws.signed(3, -6, 6)],
                         ['0x1.2ad33468a584cp+5', '0x1.4b3bd7226e978p-8',
                          '-0x1.5cba723b11868p-3'])
        draws = corpus.Draws(20240601)
        self.assertEqual(draws.integers(5, 0, 15).tolist(), [11, 8, 6, 14, 2])

    def test_uniform_draws_equal_numpy_generator_random(self):
        draws = corpus.Draws(7)
        reference = np.random.Generator(np.random.PCG64(7)).random(1000)
        self.assertTrue(np.array_equal(draws.uniform(1000), reference))

    def test_inputs_of_pinned_cases_have_fixed_bits(self):
        # grad_output, input, grid
        pinned = {
            "matrix_2d_bilinear_zeros_align0_float32_dense": [
                "9e0de281913f45a940e6cd4a5f63c84d8f142ec94e64a82215ddb561775e6803",
                "47ae563f5e219a9e30e7a7efa8592a55f82c35ac10f06a55ed3e0b9fcfb9250a",
                "700b83f210189271e2ccf57eb0608d0c8225d0fac0cf4a299b32a0dcd077bfb0"],
            "dtype_3d_bilinear_border_uniform_bfloat16": [
                "6ec6f58da9ad5be123457adf0d800abb0a3cb5ad052d7366ccb80d5332b236e8",
                "8fd97fa0dacc921f60c0e158191b25e7b034060f9660ffb28a35feff1dbb5bbc",
                "f335c6ffe95ee7d7ef8561f3753fba037fae11228ea05861f56482ff8e3824dd"],
            "exact_2d_nearest_border_align0_float16": [
                "8dc16ae6f45a32a83b86c9ba58ef4c26108e9715b6bce3d9f4287b941ef2de24",
                "f0328a76faaa12a8ad04df595b00c729d026c06884bba9c8c432ff273d20ba21",
                "662099f8e869de1eb32a154c2336aab1e3d512deeb7c60855172d942f87c000c"],
        }
        for name, digests in pinned.items():
            inputs = corpus.make_inputs(CASES_BY_NAME[name])
            self.assertEqual([corpus.tensor_digest(t) for t in inputs], digests, msg=name)

    def test_inputs_ignore_torch_random_state(self):
        case = CASES_BY_NAME["chunks_2d_bilinear_sparse_float16"]
        torch.manual_seed(0)
        first = corpus.make_inputs(case)
        state = torch.get_rng_state()
        torch.manual_seed(12345)
        second = corpus.make_inputs(case)
        torch.set_rng_state(state)
        self.assertEqual([corpus.tensor_digest(t) for t in first],
                         [corpus.tensor_digest(t) for t in second])

    def test_digest_is_sha256_of_contiguous_raw_bytes(self):
        t = torch.tensor([[1.0, -0.0], [float("nan"), 2.0]], dtype=torch.float32)
        expected = corpus.tensor_digest(t)
        self.assertEqual(corpus.tensor_digest(t.t().contiguous().t()), expected)
        self.assertEqual(expected, hashlib.sha256(
            np.array([1.0, -0.0, np.nan, 2.0], dtype="<f4").tobytes()).hexdigest())
        self.assertEqual(corpus.digest(None, t),
                         {"grad_input": corpus.NONE_DIGEST, "grad_grid": expected})
        self.assertNotEqual(corpus.tensor_digest(t.to(torch.float16)),
                            corpus.tensor_digest(t.to(torch.bfloat16)))


instantiate_parametrized_tests(TestGoldenDigests)

if __name__ == "__main__":
    run_tests()
