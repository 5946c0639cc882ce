# Owner(s): ["module: nn"]
"""Tests of `detgrid bench` (detgrid.bench.matrix and the benchmark matrix in
detgrid.bench.workloads) that need no GPU: the workload registry against
shared BENCHMARKS.md, the builders, the cuDNN-route classification, the
summary and targets, the budget guard, the core builds' work counters on
every row (issue 60's acceptance), and a small run on the host builds that
writes JSON, Markdown and a PNG.

Names here avoid the word the device run selects tests by (-k cuda).
"""

import dataclasses
import io
import json
import math
import os
import tempfile
from contextlib import redirect_stdout
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile
from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid import levels, ops
from detgrid.bench import matrix as bench, workloads
from detgrid.kit import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def strict_json(path):
    def reject(token):
        raise ValueError(f"non-standard JSON token {token}")

    with open(path) as f:
        return json.load(f, parse_constant=reject)


def backward_ops_run(fn):
    """fn() and the names of the grid_sampler backward ops it ran (aten's,
    detgrid's), from the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, {e.key for e in prof.key_averages() if "_backward" in e.key
                    and "grid_sampler" in e.key}


def measured_row(name, ratio, *, high=False, large=False, extra=1.0, records=1000,
                 correct=True):
    """A synthetic measured row, as bench_workload makes them."""
    return {"name": name, "status": "measured", "ratio": ratio, "high_collision": high,
            "large_channels": large, "extra_peak_mib": extra, "records": records,
            "memory_bound_mib": bench.MEMORY_BASE_MIB + 16 * records / 2**20,
            "correct": correct}


class TestBenchRegistry(TestCase):
    def test_matrix_has_every_benchmarks_row_and_the_listed_variants(self):
        w = workloads.BENCH_WORKLOADS
        two_d = [x for x in w.values() if x.dim == 2]
        three_d = [x for x in w.values() if x.dim == 3]
        self.assertGreaterEqual(len(two_d), 14)
        self.assertEqual(sorted({x.row for x in two_d}), list(range(16)))
        self.assertEqual(sorted(x.row for x in three_d), [16, 17, 18])
        # Row 0: the degenerate grids the tables have no row for.
        self.assertEqual([x.name for x in two_d if x.row == 0], ["constant_grid"])
        self.assertEqual(len(set(w)), len(w))
        # The variants BENCHMARKS.md asks for: channels_last of #5 and #10, bf16 of #1.
        self.assertEqual({x.row for x in w.values() if x.channels_last}, {5, 10})
        self.assertEqual([x.row for x in w.values() if x.dtype == torch.bfloat16], [1])
        self.assertEqual([x.row for x in w.values() if x.dtype == torch.float16], [15])
        # The GPU check's eight keep their names and definitions.
        self.assertEqual(len(workloads.WORKLOADS), 8)
        for name, x in workloads.WORKLOADS.items():
            self.assertIs(w[name], x)

    def test_full_size_shapes_follow_benchmarks_md(self):
        w = workloads.BENCH_WORKLOADS
        self.assertEqual(w["rtdetr_l40"].shapes(), ((128, 32, 40, 40), (128, 500, 4, 2)))
        self.assertEqual(w["mask2former_l128"].shapes(),
                         ((16, 32, 128, 128), (16, 21504, 4, 2)))
        self.assertEqual(w["rfdetr_deform_attn"].shapes(), ((64, 16, 40, 40), (64, 3900, 2, 2)))
        self.assertEqual(w["raft_corr_l0"].shapes(), ((17112, 1, 46, 62), (17112, 9, 9, 2)))
        self.assertEqual(w["eg3d_triplane_cl"].shapes(),
                         ((12, 32, 256, 256), (12, 1, 196608, 2)))
        self.assertEqual(w["kplanes_proposal"].shapes(), ((1, 8, 128, 128), (1, 1000000, 1, 2)))
        self.assertEqual(w["mask2former_point_loss"].shapes(),
                         ((40, 1, 256, 256), (40, 12544, 1, 2)))
        self.assertEqual(w["stylegan2_ada_augment"].shapes(),
                         ((8, 3, 524, 524), (8, 524, 524, 2)))
        self.assertEqual(w["voxelmorph_warp_3d"].shapes(),
                         ((1, 3, 80, 96, 112), (1, 80, 96, 112, 3)))
        self.assertEqual(w["dvgo_dense_grid_3d"].shapes(),
                         ((1, 12, 160, 160, 160), (1, 1, 1, 1000000, 3)))
        self.assertEqual(w["simplebev_lift_3d"].shapes(),
                         ((6, 128, 1, 56, 100), (6, 200, 8, 200, 3)))
        settings = {name: (x.mode_label, x.padding, x.align_corners, x.output_mask)
                    for name, x in w.items()}
        self.assertEqual(settings["kplanes_proposal"], ("bilinear", "border", True, (True, False)))
        self.assertEqual(settings["stn_mnist"], ("bilinear", "zeros", False, (False, True)))
        self.assertEqual(settings["raft_corr_l3"], ("bilinear", "zeros", True, (True, False)))
        self.assertEqual(settings["voxelmorph_warp_3d"],
                         ("trilinear", "zeros", True, (True, True)))
        self.assertEqual(settings["simplebev_lift_3d"],
                         ("trilinear", "zeros", False, (True, False)))

    def test_builders_give_random_nonzero_data_of_the_right_kind(self):
        for name, w in workloads.BENCH_WORKLOADS.items():
            scale = bench.size_scale(w, "tiny")
            case = w.build("cpu", seed=5, scale=scale)
            in_shape, grid_shape = w.shapes(scale)
            self.assertEqual(tuple(case.input.shape), in_shape, name)
            self.assertEqual(tuple(case.grid.shape), grid_shape, name)
            self.assertEqual(tuple(case.grad_output.shape),
                             in_shape[:2] + grid_shape[1:-1], name)
            for t in (case.input, case.grid, case.grad_output):
                self.assertEqual(t.dtype, w.dtype, name)
            self.assertEqual(case.output_mask, w.output_mask, name)
            # random, never zeros
            for t in (case.input, case.grad_output):
                self.assertGreater(float((t != 0).double().mean()), 0.95, name)
            self.assertTrue(bool(case.grid.isfinite().all()), name)
            self.assertGreater(float(case.grid.double().abs().max()), 0.0, name)
            if w.grid_kind == "constant":  # every point at one place
                self.assertEqual(float(case.grid.double().std(dim=(1, 2)).max()), 0.0, name)
            else:
                self.assertGreater(float(case.grid.double().std()), 0.0, name)
            if w.channels_last:
                self.assertTrue(case.input.is_contiguous(memory_format=torch.channels_last), name)
                if case.input.shape[1] > 1:  # with one channel both layouts coincide
                    self.assertFalse(case.input.is_contiguous(), name)
            if w.expanded_batch and case.input.shape[0] > 1:
                self.assertEqual(case.input.stride(0), 0, name)
            other = w.build("cpu", seed=6, scale=scale)
            self.assertFalse(workloads.bitwise_equal(case.grad_output, other.grad_output), name)

    def test_grid_kinds_land_where_they_should(self):
        g = torch.Generator().manual_seed(0)
        # RAFT window: 9x9 whole-pixel offsets around a centre.
        win = workloads.make_grid("window", 3, 9, 9, (46, 62), True, g)
        px = (win[..., 0] + 1) / 2 * 61
        self.assertEqual(px[:, :, 1:] - px[:, :, :-1], torch.ones(3, 9, 8), atol=1e-4, rtol=0)
        affine = workloads.make_grid("affine", 4, 8, 8, (8, 8), False, g, extent=1.25)
        self.assertLess(float(affine.abs().max()), 1.25 * 1.5 + 0.1)
        clustered = workloads.make_grid("clustered", 2, 1000, 1, (64, 64), False, g)
        self.assertLessEqual(float(clustered.abs().max()), 1.0)
        # 3-D smooth: the identity plus about 1.5 voxels of noise per axis.
        smooth3 = workloads.make_grid_3d("smooth", 2, 8, 10, 12, (16, 20, 24), True, g)
        self.assertEqual(tuple(smooth3.shape), (2, 8, 10, 12, 3))
        ident = workloads.make_grid_3d("smooth", 2, 8, 10, 12, (1e9, 1e9, 1e9), True, g)
        self.assertEqual(ident[0, 0, 0, 0], torch.tensor([-1.0, -1.0, -1.0]), atol=1e-6, rtol=0)
        self.assertEqual(ident[0, -1, -1, -1], torch.tensor([1.0, 1.0, 1.0]), atol=1e-6, rtol=0)
        voxels = (smooth3 - ident) / torch.tensor([2 / 24, 2 / 20, 2 / 16])
        self.assertGreater(float(voxels.std()), 1.2)
        self.assertLess(float(voxels.std()), 1.8)
        with self.assertRaises(ValueError):
            workloads.make_grid_3d("line", 1, 2, 2, 2, (2, 2, 2), True, g)
        # constant: every point a quarter pixel right of and below pixel
        # (0, 0)'s centre, in both conventions.
        for align_corners in (False, True):
            const = workloads.make_grid("constant", 2, 3, 5, (2, 4), align_corners, g)
            size = torch.tensor([4.0, 2.0])  # x over width 4, y over height 2
            px = ((const + 1) / 2 * (size - 1) if align_corners
                  else ((const + 1) * size - 1) / 2)
            self.assertEqual(px, torch.full((2, 3, 5, 2), 0.25), atol=1e-6, rtol=0)

    def test_records_count_points_times_taps_and_zero_without_grad_input(self):
        w = workloads.BENCH_WORKLOADS
        bil = w["rtdetr_l20"].build("cpu", scale=0.1)
        self.assertEqual(workloads.records(bil), bil.grid[..., 0].numel() * 4)
        near = w["liif_nearest"].build("cpu", scale=0.1)
        self.assertEqual(workloads.records(near), near.grid[..., 0].numel())
        cubic = w["rgb_warp_bicubic_fp16"].build("cpu", scale=0.05)
        self.assertEqual(workloads.records(cubic), cubic.grid[..., 0].numel() * 16)
        self.assertEqual(workloads.records(w["monodepth2_grid_only"].build("cpu", scale=0.05)),
                         0)
        tri = w["voxelmorph_warp_3d"].build("cpu", scale=0.05)
        self.assertEqual(workloads.records(tri), tri.grid[..., 0].numel() * 8)
        near3 = dataclasses.replace(w["simplebev_lift_3d"], mode="nearest").build("cpu",
                                                                                 scale=0.05)
        self.assertEqual(workloads.records(near3), near3.grid[..., 0].numel())
        for name, x in w.items():  # the count without building the case
            self.assertEqual(x.records(0.05), workloads.records(x.build("cpu", scale=0.05)),
                             name)

    def test_samples_per_cell_counts_points_per_touched_cell(self):
        # 2 images of 4x4; image 0: 6 points in pixel (1, 2), 2 in (3, 0);
        # image 1: 4 points in (0, 0) and 3 outside the input.
        def at(x, y, size=4):  # pixel centre, align_corners=False
            return [(2 * x + 1) / size - 1, (2 * y + 1) / size - 1]

        pts0 = [at(2, 1)] * 6 + [at(0, 3)] * 2 + [at(0, 3)] * 0
        pts1 = [at(0, 0)] * 4 + [[5.0, 0.0], [0.0, -3.0], [math.nan, 0.0]] + [at(0, 0)]
        grid = torch.tensor([pts0, pts1]).view(2, 8, 1, 2)
        case = workloads.Case("t", torch.randn(2, 1, 8, 1), torch.randn(2, 1, 4, 4), grid,
                              0, 0, False, (True, False))
        stats = workloads.samples_per_cell(case)
        self.assertEqual(stats, {"mean": 13 / 3, "max": 6.0})

    def test_samples_per_cell_counts_points_per_touched_voxel(self):
        # One volume of depth 2, height 4, width 9 (align_corners=True: voxel
        # i of a size-s axis at 2 i / (s - 1) - 1), points per voxel (z, y, x):
        # (1, 3, 8) 3, (0, 0, 5) 2, (0, 0, 6) 1, (1, 0, 1) 2, (1, 1, 1) 1,
        # (0, 0, 0) 1, and one outside. Reading the axes in any other order
        # merges some of these voxels.
        def at(x, y, z):
            return [x / 4 - 1, 2 * y / 3 - 1, 2.0 * z - 1]

        pts = ([at(8, 3, 1)] * 3 + [at(5, 0, 0)] * 2 + [at(6, 0, 0)] + [at(1, 0, 1)] * 2
               + [at(1, 1, 1)] + [at(0, 0, 0)] + [[0.0, 0.0, 3.0]])
        grid = torch.tensor(pts).view(1, 1, 1, 11, 3)
        case = workloads.Case("t", torch.randn(1, 1, 1, 1, 11), torch.randn(1, 1, 2, 4, 9), grid,
                              0, 0, True, (True, False))
        self.assertEqual(workloads.samples_per_cell(case), {"mean": 10 / 6, "max": 3.0})


class TestBenchClassification(TestCase):
    def test_cudnn_route_rows_are_bilinear_zeros_aligned_4d_small_c_not_bf16(self):
        routed = {name for name, w in workloads.BENCH_WORKLOADS.items()
                  if bench.workload_takes_cudnn(w)}
        self.assertEqual(routed, {"raft_corr_l0", "raft_corr_l3", "basicvsr_flow_warp",
                                  "basicvsr_flow_warp_cl", "tensorf_line"})
        ok = dict(mode="bilinear", padding="zeros", align_corners=True,
                  input_shape=(2, 64, 8, 8), dtype=torch.float32)
        self.assertTrue(workloads.takes_cudnn(**ok))
        self.assertTrue(workloads.takes_cudnn(**{**ok, "dtype": torch.float16}))
        self.assertTrue(workloads.takes_cudnn(**{**ok, "dtype": torch.float64}))
        self.assertTrue(workloads.takes_cudnn(**{**ok, "input_shape": (2, 1024, 8, 8)}))
        for change in ({"dtype": torch.bfloat16}, {"input_shape": (2, 1025, 8, 8)},
                       {"align_corners": False}, {"padding": "border"}, {"mode": "nearest"},
                       {"mode": "bicubic"}, {"input_shape": (1, 3, 4, 8, 8)},
                       {"input_shape": (2, 64, 0, 8)}, {"input_shape": (2**16, 64, 32, 32)}):
            self.assertFalse(workloads.takes_cudnn(**{**ok, **change}), change)

    def test_rows_name_the_backward_of_their_rank(self):
        for name, w in workloads.BENCH_WORKLOADS.items():
            row = bench.describe(w)
            self.assertEqual(row["op"], f"grid_sampler_{w.dim}d_backward", name)
            self.assertEqual(row["taps"], {("bilinear", 2): 4, ("nearest", 2): 1,
                                           ("bicubic", 2): 16, ("bilinear", 3): 8,
                                           ("nearest", 3): 1}[(w.mode, w.dim)], name)
        listed = {r["name"]: r for r in bench.listing()}
        self.assertEqual(list(listed), list(workloads.BENCH_WORKLOADS))
        for name in ("voxelmorph_warp_3d", "dvgo_dense_grid_3d", "simplebev_lift_3d"):
            self.assertEqual(listed[name]["stock_op"], "grid_sampler_3d_backward")
            self.assertEqual(listed[name]["taps"], 8)
            self.assertFalse(listed[name]["cudnn_route"])  # cuDNN has no 3-D sampler
        self.assertEqual(listed["simplebev_lift_3d"]["records"], 6 * 200 * 8 * 200 * 8)
        self.assertEqual(listed["voxelmorph_warp_3d"]["records"], 80 * 96 * 112 * 8)
        self.assertEqual(listed["basicvsr_flow_warp"]["stock_op"], "cudnn_grid_sampler_backward")

    def test_in_tree_probe_on_the_host_reports_unpatched(self):
        tree = bench.detect_in_tree("cpu")
        self.assertFalse(tree["patched"])
        self.assertEqual(tree["dims"], [])
        # The probe itself, for each rank: aten's CPU backward is
        # deterministic, so under deterministic mode it runs.
        for dim in (2, 3):
            (patched, _), ops_run = backward_ops_run(lambda: bench._probe_in_tree(dim, "cpu"))
            self.assertTrue(patched, dim)
            self.assertEqual(ops_run, {f"aten::grid_sampler_{dim}d_backward"})

    def test_sizes_cap_shapes_and_full_is_scale_one(self):
        for name, w in workloads.BENCH_WORKLOADS.items():
            self.assertEqual(bench.size_scale(w, "full"), 1.0)
            in_shape, grid_shape = w.shapes(bench.size_scale(w, "tiny"))
            self.assertLessEqual(math.prod(in_shape), bench.SIZES["tiny"][0], name)
            self.assertLessEqual(math.prod(grid_shape[:-1]), bench.SIZES["tiny"][1], name)

    def test_judge_accepts_stock_agreement_or_float64_when_stock_is_worse(self):
        self.assertEqual(bench.judge(1e-6, {"detgrid": 1e-7, "stock": 1e-7}, 1e-4),
                         (True, "stock"))
        self.assertEqual(bench.judge(0.9, {"detgrid": 3e-3, "stock": 0.9}, 5e-2),
                         (True, "float64 (stock is further off)"))
        self.assertFalse(bench.judge(0.9, {"detgrid": 0.9, "stock": 1e-3}, 5e-2)[0])
        self.assertFalse(bench.judge(math.inf, {"detgrid": math.inf, "stock": 0.0}, 1e-4)[0])
        self.assertFalse(bench.judge(2e-4, {"detgrid": 2e-4, "stock": 1e-3}, 1e-4)[0])


class TestBenchSummary(TestCase):
    def test_geomean_and_worst(self):
        rows = [measured_row("a", 0.5), measured_row("b", 2.0), measured_row("c", 4.0),
                {"name": "d", "status": "skipped", "skip_reason": "x"},
                {"name": "e", "status": "error", "error": "boom"}]
        s = bench.summarize(rows, cuda=True)
        self.assertAlmostEqual(s["geomean"], (0.5 * 2.0 * 4.0) ** (1 / 3))
        self.assertEqual((s["worst"], s["worst_workload"]), (4.0, "c"))
        self.assertEqual((s["measured"], s["skipped"], s["errors"]), (3, ["d"], ["e"]))
        self.assertAlmostEqual(bench.geomean([1.0, 4.0]), 2.0)
        self.assertIsNone(bench.geomean([]))
        self.assertIsNone(bench.summarize([], cuda=True)["geomean"])

    def test_targets_met_or_not_on_the_device(self):
        rows = [measured_row("fast_collide", 0.4, high=True),
                measured_row("slow_wide", 0.7, large=True),
                measured_row("plain", 0.9, extra=200.0, records=10)]
        s = bench.summarize(rows, cuda=True)
        met = {t["target"].split(" ")[0]: t for t in s["targets"]}
        self.assertTrue(met["det/stock"]["met"])  # geomean 0.63
        targets = s["targets"]
        self.assertTrue(targets[1]["met"])         # worst 0.9 <= 1.5
        self.assertFalse(targets[2]["met"])        # slow_wide is not 2x faster
        self.assertEqual(targets[2]["failing"], ["slow_wide"])
        self.assertFalse(targets[3]["met"])        # plain adds 200 MiB
        self.assertEqual(targets[3]["failing"], ["plain"])
        self.assertTrue(targets[-1]["met"])        # every row right
        per_row = [bench.row_targets(r, cuda=True) for r in rows]
        self.assertEqual([t["speed_goal"] for t in per_row], [0.5, 0.5, 1.5])
        self.assertEqual([t["met"] for t in per_row], [True, False, False])
        wrong = bench.summarize([measured_row("w", 0.1, correct=False)], cuda=True)
        self.assertFalse(wrong["targets"][-1]["met"])
        self.assertEqual(wrong["incorrect"], ["w"])

    def test_a_build_without_the_cores_bits_is_incorrect(self):
        differs = {**measured_row("d", 0.5), "same_bits": False}
        s = bench.summarize([differs, {**measured_row("e", 0.5), "same_bits": True}], cuda=True)
        self.assertEqual((s["bits_differ"], s["incorrect"]), (["d"], ["d"]))
        self.assertFalse(s["targets"][-1]["met"])

    def test_speed_levels_are_held_to_the_core(self):
        def timed(name, level_vs_core):
            core = {"ms": 1.0, "ratio": 1.0, "ratio_vs_core": 1.0, "equals_core": True}
            level = {"ms": level_vs_core, "ratio": level_vs_core,
                     "ratio_vs_core": level_vs_core, "equals_core": True}
            return {**measured_row(name, 1.0), "same_bits": True,
                    "levels": {levels.CORE: core,
                               **{lv: level for lv in bench.SPEED_LEVELS}}}

        s = bench.summarize([timed("a", 0.5), timed("b", 1.2)], cuda=True)
        for level in bench.SPEED_LEVELS:
            entry = s["levels"][level]
            self.assertAlmostEqual(entry["geomean_vs_core"], (0.5 * 1.2) ** 0.5)
            self.assertEqual((entry["worst_vs_core"], entry["worst_vs_core_workload"]),
                             (1.2, "b"))
            target = next(t for t in s["targets"] if t["target"].startswith(f"{level}/core"))
            self.assertFalse(target["met"])        # b is above 1.05
            self.assertEqual(target["failing"], ["b"])
        ok = bench.summarize([timed("a", 0.9), timed("b", 1.04)], cuda=True)
        for level in bench.SPEED_LEVELS:
            self.assertTrue(next(t for t in ok["targets"]
                                 if t["target"].startswith(f"{level}/core"))["met"])
        self.assertAlmostEqual(ok["levels"][levels.CORE]["geomean"], 1.0)

    def test_targets_are_not_applicable_on_the_host(self):
        rows = [measured_row("a", 5.0, extra=None)]
        s = bench.summarize(rows, cuda=False)
        self.assertEqual([t["met"] for t in s["targets"][:-1]],
                         [bench.CPU_NA] * (len(s["targets"]) - 1))
        self.assertTrue(s["targets"][-1]["met"])  # correctness counts everywhere
        self.assertEqual(bench.row_targets(rows[0], cuda=False)["met"], bench.CPU_NA)

    def test_outputs_without_matplotlib_skip_only_the_png(self):
        result = {"device": "cpu", "device_name": "cpu x", "torch": "t", "torch_cuda": None,
                  "cudnn": None, "git_commit": None, "time_utc": "2026-12-01T10:00:00+00:00",
                  "size": "tiny", "warmup": 1, "reps": 2, "elapsed_s": 1.0,
                  "in_tree": {"patched": False, "dims": [], "reason": "r"}, "workloads": [],
                  "summary": bench.summarize([], cuda=False)}
        with tempfile.TemporaryDirectory() as work, \
                mock.patch.dict("sys.modules", {"matplotlib": None}):
            paths = bench.write_outputs(result, os.path.join(work, "r.json"))
            self.assertIsNone(paths["png"])
            self.assertTrue(os.path.isfile(paths["markdown"]))
            self.assertEqual(strict_json(paths["json"])["device"], "cpu")

    def test_output_paths(self):
        self.assertEqual(bench.sibling_paths("/x/r.json"), ("/x/r.md", "/x/r.png"))
        self.assertEqual(bench.sibling_paths("/x/r"), ("/x/r.md", "/x/r.png"))
        result = {"device": "cuda", "device_name": "NVIDIA H200", "time_utc":
                  "2026-12-01T10:00:00+00:00", "quick": False}
        self.assertEqual(bench.default_out(result),
                         os.path.join("benchmarks", "results", "nvidia-h200-2026-12-01.json"))
        self.assertTrue(bench.default_out({**result, "quick": True}).endswith("-quick.json"))


def table_row(name="mask2former_l128_bf16", **overrides):
    """A measured row with every field the Markdown table reads, CUDA-like."""
    row = {"row": 18, "name": name, "status": "measured", "stock_route": "cudnn",
           "cudnn_route": True, "cudnn_error": None, "stock_ms": 1234.5678, "ratio": 0.4321,
           "variants": {"detgrid": {"median_ms": 533.25}}, "in_tree_ms": 512.75,
           "extra_peak_mib": 1234.5, "memory_bound_mib": 4096.0, "max_rel_diff": 1.2345e-05,
           "correct": True, "correct_by": "stock", "tolerance": 1e-4,
           "targets": {"met": False}}
    row.update(overrides)
    return row


class TestBenchTable(TestCase):
    def test_every_table_line_fits_a_terminal(self):
        longest = max(bench.BENCH_WORKLOADS, key=len)
        rows = [table_row(longest), table_row(longest, correct=False, targets={"met": False}),
                table_row(longest, correct_by="float64", cudnn_error="CUDNN_STATUS_x"),
                table_row(longest, targets={"met": bench.CPU_NA}),
                {"row": 3, "name": longest, "status": "error",
                 "error": "RuntimeError: " + "x" * 400},
                {"row": 4, "name": longest, "status": "skipped", "skip_reason": "y" * 400}]
        table = bench._table(rows)
        rows_and_head = [line for line in table if line.startswith("|")]
        self.assertEqual(len(rows_and_head), 2 + len(rows))
        for line in rows_and_head:
            self.assertLessEqual(len(line), bench.TABLE_WIDTH, line)
        self.assertEqual(len({line.count(" | ") for line in rows_and_head if "---" not in line}),
                         1, "every row has the header's cells")

    def test_table_flags_a_wrong_result_and_a_cudnn_row_timed_on_native(self):
        wrong = bench._row_cells(table_row(correct=False), False, 10)
        self.assertEqual(wrong[-2], "**1.23e-05**")
        self.assertEqual(wrong[-1], "**WRONG**")
        over = bench._row_cells(table_row(extra_peak_mib=5000.0), False, 10)
        self.assertEqual(over[-3], "**5000**")
        self.assertEqual(bench._row_cells(table_row(), False, 10)[-3], "1234.5")
        native = bench._row_cells(table_row(stock_route="native"), False, 10)
        self.assertEqual(native[2], "native*")
        self.assertEqual(bench._row_cells(table_row(), False, 10)[2], "cudnn")
        self.assertEqual(bench._row_cells(table_row(same_bits=False), False, 10)[-1], "**BITS**")

    def test_cpu_smoke_rows_say_n_a(self):
        cells = bench._row_cells(table_row(targets={"met": bench.CPU_NA}), False, 10)
        self.assertEqual(cells[-1], "n/a")

    def test_plot_colours_cpu_runs_grey_and_gpu_runs_by_outcome(self):
        self.assertEqual(bench._bar_color(0.5, smoke=True), bench.SMOKE_COLOR)
        self.assertEqual(bench._bar_color(3.0, smoke=True), bench.SMOKE_COLOR)
        self.assertNotEqual(bench._bar_color(0.5, smoke=False), bench._bar_color(3.0, smoke=False))
        self.assertNotIn(bench.SMOKE_COLOR,
                         {bench._bar_color(0.5, False), bench._bar_color(3.0, False)})


class TestBenchHostRuns(TestCase):
    def test_rotation_copies_cover_twice_the_cache_and_keep_layouts(self):
        w = workloads.BENCH_WORKLOADS
        case = w["positional_table_c1024"].build("cpu", scale=0.2)
        size = workloads.case_bytes(case)
        self.assertEqual(len(workloads.rotation_copies(case, 0)), 1)
        copies = workloads.rotation_copies(case, 10 * size)
        self.assertEqual(len(copies), 20)
        self.assertEqual(len(workloads.rotation_copies(case, size // 10)), 2)
        self.assertEqual(len(workloads.rotation_copies(case, 10 * size, max_copies=4)), 4)
        ptrs = {c.input.data_ptr() for c in copies}
        self.assertEqual(len(ptrs), 20)
        for c in copies:
            self.assertEqual(c.input.stride(0), 0)
            self.assertEqual(c.input, case.input)
            self.assertEqual(c.grid, case.grid)
        cl = w["basicvsr_flow_warp_cl"].build("cpu", scale=0.2)
        for c in workloads.rotation_copies(cl, 4 * workloads.case_bytes(cl)):
            self.assertTrue(c.input.is_contiguous(memory_format=torch.channels_last))

    def test_time_rotating_gives_each_call_the_next_copy(self):
        cases = [workloads.Case(str(i), torch.zeros(1), torch.zeros(1), torch.zeros(1), 0, 0,
                                False, (True, True)) for i in range(3)]
        own = [workloads.Case("own" + c.name, *c.args()[:3], 0, 0, False, (True, True))
               for c in cases]
        seen = []
        order = []
        times = workloads.time_rotating(
            [lambda c: seen.append(("a", c.name)), lambda c: seen.append(("b", c.name))],
            cases, "cpu", warmup=1, reps=2,
            before=[lambda: order.append("pre-a"), None], fn_cases=[None, own])
        self.assertEqual([len(t) for t in times], [2, 2])
        self.assertEqual(seen, [("a", "0"), ("b", "own1"), ("a", "2"), ("b", "own0"),
                                ("a", "1"), ("b", "own2")])
        self.assertEqual(order, ["pre-a"] * 3)
        with self.assertRaises(ValueError):
            workloads.time_rotating([lambda c: None], cases, "cpu", 0, 1, fn_cases=[own[:2]])

    def test_small_run_writes_json_markdown_and_png(self):
        # The bf16 row compares with stock's CPU bf16 backward: --quick keeps
        # its input (5x5) far below where that breaks (detgrid.bench.stock_limits).
        names = ["rtdetr_l20_bf16", "basicvsr_flow_warp", "monodepth2_grid_only",
                 "voxelmorph_warp_3d", "simplebev_lift_3d"]
        with tempfile.TemporaryDirectory() as work:
            out = os.path.join(work, "sub", "cpu.json")
            with mock.patch("builtins.print") as printed:
                rc = cli.main(["bench", "--device", "cpu", "--quick", "--workloads",
                               ",".join(names), "--out", out])
            self.assertEqual(rc, 0)
            # a progress line per workload, as it finishes
            progress = [c.args[0] for c in printed.call_args_list
                        if c.args and str(c.args[0]).startswith("detgrid bench: [")]
            self.assertEqual([line.split(":")[1].strip() for line in progress],
                             [f"[{i}/{len(names)}] {name}" for i, name in enumerate(names, 1)])
            data = strict_json(out)
            with open(os.path.join(work, "sub", "cpu.md")) as f:
                md = f.read()
            png = os.path.join(work, "sub", "cpu.png")
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC)
            # --render redraws both from the JSON alone.
            os.remove(png)
            with mock.patch("builtins.print"):
                self.assertEqual(cli.main(["bench", "--render", out]), 0)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC)
            with open(os.path.join(work, "sub", "cpu.md")) as f:
                self.assertEqual(f.read(), md)
        self.assertEqual(data["device"], "cpu")
        self.assertEqual(data["torch"], torch.__version__)
        self.assertTrue(data["quick"])
        self.assertEqual([r["name"] for r in data["workloads"]], names)
        rows = {r["name"]: r for r in data["workloads"]}
        measured = [rows[n] for n in names]
        for r in measured:
            self.assertEqual(r["status"], "measured", r.get("error"))
            self.assertEqual(r["stock_route"], "native")
            builds = set(levels.CORE_BUILDS) if r["output_mask"][0] else set()
            self.assertEqual(set(r["variants"]), {"native", "detgrid", *builds})
            # every build's counters, of the call as run and at full size
            for field in ("counters", "counters_full_size"):
                self.assertEqual(set(r[field]), set(levels.CORE_BUILDS))
                for counted in r[field].values():
                    self.assertEqual(set(bench.COUNTERS) - set(counted), set())
            for v in r["variants"].values():
                self.assertGreater(v["median_ms"], 0)
                self.assertEqual(v["n"], 20)
            self.assertAlmostEqual(r["ratio"], r["detgrid_ms"] / r["stock_ms"])
            self.assertIsNone(r["extra_peak_mib"])  # measured on the GPU only
            self.assertTrue(r["correct"], r)
            self.assertEqual(r["targets"]["met"], bench.CPU_NA)
            self.assertEqual(r["copies"], 1)
        self.assertTrue(rows["basicvsr_flow_warp"]["cudnn_route"])
        self.assertLess(rows["basicvsr_flow_warp"]["max_rel_diff"], 1e-5)
        self.assertEqual(rows["monodepth2_grid_only"]["records"], 0)
        self.assertIsNone(rows["monodepth2_grid_only"]["rel_diff"]["grad_input"])
        bf16 = rows["rtdetr_l20_bf16"]
        self.assertEqual(bf16["dtype"], "bfloat16")
        self.assertLess(bf16["err_vs_float64"]["detgrid"], bench.TOLERANCE["bfloat16"])
        # The 3-D rows: their own backward, 8 taps per point, voxels.
        for name in names[3:]:
            r = rows[name]
            self.assertEqual((r["dim"], r["op"], r["mode"], r["taps"]),
                             (3, "grid_sampler_3d_backward", "trilinear", 8), name)
            self.assertEqual(len(r["input_shape"]), 5, name)
            self.assertEqual(r["records"], math.prod(r["grid_shape"][:-1]) * 8, name)
            self.assertLess(r["max_rel_diff"], 1e-5, name)
        self.assertIsNotNone(rows["voxelmorph_warp_3d"]["rel_diff"]["grad_grid"])
        self.assertIsNone(rows["simplebev_lift_3d"]["rel_diff"]["grad_grid"])  # input only
        self.assertGreater(rows["simplebev_lift_3d"]["samples_per_cell"], 4)  # zoom-in
        self.assertAlmostEqual(data["geomean"], math.exp(
            sum(math.log(r["ratio"]) for r in measured) / len(measured)))
        self.assertEqual(data["worst"], max(r["ratio"] for r in measured))
        self.assertEqual(data["summary"]["skipped"], [])
        self.assertIn("| # | workload |", md)
        self.assertIn(bench.CPU_NA, md)
        self.assertIn("det/stock geomean <= 1.0", md)
        # What describes a row is in the JSON; the table keeps the measurements.
        self.assertIn("| 16 | voxelmorph_warp_3d | native | ", md)
        voxelmorph = rows["voxelmorph_warp_3d"]
        self.assertEqual((voxelmorph["input_shape"], voxelmorph["grid_shape"]),
                         ([1, 1, 13, 16, 19], [1, 13, 16, 19, 3]))
        self.assertEqual((voxelmorph["dtype"], voxelmorph["layout"], voxelmorph["mode"],
                          voxelmorph["padding"], voxelmorph["align_corners"],
                          voxelmorph["output_mask"]),
                         ("float32", "contiguous", "trilinear", "zeros", True, [True, True]))
        self.assertIn("`aten::grid_sampler_3d_backward`", md)
        self.assertIn("5 rows measured, 0 skipped, 0 errors", md)
        for name in names:
            self.assertIn(name, md)
        # The builds' table: every row that requests grad_input; the counters' table: all.
        builds = md[md.index("## The core's builds"):md.index("## Work counters")]
        counted = md[md.index("## Work counters"):md.index("## Targets")]
        for name in names:
            self.assertEqual(f"| {name} |" in builds, rows[name]["output_mask"][0], name)
            self.assertIn(f"| {name} |", counted)
            if rows[name]["output_mask"][0]:
                self.assertTrue(rows[name]["same_bits"], name)

    def test_three_d_rows_time_the_three_d_backwards(self):
        # Every variant of a 3-D row (stock, detgrid, the float64 judge,
        # in-tree) runs the 3-D op, never the 2-D one.
        w = workloads.BENCH_WORKLOADS["dvgo_dense_grid_3d"]
        row, ops_run = backward_ops_run(
            lambda: bench.bench_workload(w, "cpu", 0.06, warmup=1, reps=2, in_tree=True))
        self.assertEqual(ops_run, {"aten::grid_sampler_3d_backward",
                                   "detgrid::grid_sampler_3d_backward"})
        self.assertEqual(set(row["variants"]),
                         {"native", "detgrid", *levels.CORE_BUILDS, "in_tree"})
        self.assertEqual(row["records"], math.prod(row["grid_shape"][:-1]) * 8)
        self.assertLess(max(v for v in row["in_tree_rel_diff"].values() if v is not None),
                        1e-12)
        self.assertTrue(row["correct"], row)

    def test_half_three_d_row_is_judged_against_float64(self):
        # A float16 variant of a 3-D row: stock (in float16) and detgrid
        # are both measured against stock's 3-D backward in float64.
        w = dataclasses.replace(workloads.BENCH_WORKLOADS["simplebev_lift_3d"],
                                dtype=torch.float16)
        row = bench.bench_workload(w, "cpu", 0.08, warmup=0, reps=2)
        self.assertEqual(row["dtype"], "float16")
        self.assertEqual(row["tolerance"], bench.TOLERANCE["float16"])
        det64 = row["err_vs_float64"]["detgrid"]
        self.assertLess(det64, bench.TOLERANCE["float16"])
        self.assertLessEqual(det64, row["err_vs_float64"]["stock"])
        self.assertTrue(row["correct"], row)
        case = w.build("cpu", 0, 0.08)
        ref64 = workloads.run_stock(dataclasses.replace(
            case, grad_output=case.grad_output.double(), input=case.input.double(),
            grid=case.grid.double()))
        self.assertEqual(det64, workloads.rel_err(workloads.run_detgrid(case)[0], ref64[0]))

    def test_in_tree_is_timed_for_the_ranks_the_probe_found(self):
        tree = {"patched": True, "dims": [3], "reason": "2-D: raises; 3-D: runs"}
        config = bench.BenchConfig(device="cpu", names=["stn_mnist", "voxelmorph_warp_3d"],
                                   size="tiny", warmup=0, reps=2)
        with mock.patch.object(bench, "detect_in_tree", lambda device: tree):
            result = bench.run_bench(config)
        rows = {r["name"]: r for r in result["workloads"]}
        self.assertEqual(set(rows["stn_mnist"]["variants"]), {"native", "detgrid"})
        self.assertEqual(set(rows["voxelmorph_warp_3d"]["variants"]),
                         {"native", "detgrid", *levels.CORE_BUILDS, "in_tree"})
        self.assertIn("in-tree path: 3-D (2-D: raises; 3-D: runs)", bench.markdown(result))

    def test_budget_guard_skips_workloads_once_time_is_up(self):
        ticks = iter([0.0, 0.0] + [100.0] * 20)  # start, first check, then late
        config = bench.BenchConfig(device="cpu", names=["stn_mnist", "liif_nearest",
                                                        "voxelmorph_warp_3d", "tensorf_line"],
                                   size="tiny", warmup=0, reps=2, budget_s=10.0)
        result = bench.run_bench(config, clock=lambda: next(ticks))
        status = [(r["name"], r["status"]) for r in result["workloads"]]
        self.assertEqual(status, [("stn_mnist", "measured"), ("liif_nearest", "skipped"),
                                  ("voxelmorph_warp_3d", "skipped"),
                                  ("tensorf_line", "skipped")])
        rows = result["workloads"]
        for row in rows[1:]:
            self.assertIn("time budget", row["skip_reason"])
        self.assertEqual(result["summary"]["skipped"],
                         ["liif_nearest", "voxelmorph_warp_3d", "tensorf_line"])
        self.assertEqual(result["summary"]["measured"], 1)

    def test_cudnn_and_in_tree_variants_are_timed_where_they_apply(self):
        # The GPU-only variants, exercised on the host: cuDNN stands in as
        # stock's native kernel, the in-tree path is aten's CPU backward
        # under deterministic mode.
        def fake_cudnn(case):
            return torch.ops.aten.grid_sampler_2d_backward(*case.args())

        def fake_run_cudnn(case):
            return workloads.run_stock(case)

        w = workloads.BENCH_WORKLOADS["basicvsr_flow_warp_cl"]
        with mock.patch.object(bench, "cudnn_usable", lambda device: True), \
                mock.patch.object(bench, "_raw_cudnn", fake_cudnn), \
                mock.patch.object(bench, "run_cudnn", fake_run_cudnn):
            row = bench.bench_workload(w, "cpu", 0.2, warmup=1, reps=3, in_tree=True)
        self.assertEqual(row["stock_route"], "cudnn")
        self.assertEqual(set(row["variants"]),
                         {"native", "cudnn", "detgrid", *levels.CORE_BUILDS, "in_tree"})
        self.assertEqual(row["stock_ms"], row["variants"]["cudnn"]["median_ms"])
        self.assertAlmostEqual(row["ratio"], row["detgrid_ms"] / row["stock_ms"])
        self.assertTrue(row["cudnn_inputs_made_contiguous"])
        self.assertLess(max(row["rel_diff_vs_cudnn"].values()), 1e-5)
        self.assertLess(max(row["in_tree_rel_diff"].values()), 1e-12)
        self.assertIn("in_tree_ratio", row)
        self.assertFalse(torch.are_deterministic_algorithms_enabled())

    def test_each_build_of_the_core_is_timed_where_grad_input_is_requested(self):
        self.assertEqual(bench.BUILDS, ("core", "grouped-channels"))
        w = workloads.BENCH_WORKLOADS["rtdetr_l80"]
        row = bench.bench_workload(w, "cpu", 0.05, warmup=1, reps=2)
        # The default backward and every build give the core's bits.
        self.assertTrue(row["detgrid_equals_core"])
        self.assertTrue(row["same_bits"])
        for build in bench.BUILDS:
            timed = row["levels"][build]
            self.assertTrue(timed["equals_core"], build)
            self.assertEqual(timed["ms"], row["variants"][build]["median_ms"])
            self.assertAlmostEqual(timed["ratio"], timed["ms"] / row["stock_ms"])
            self.assertAlmostEqual(timed["ratio_vs_core"],
                                   timed["ms"] / row["levels"]["core"]["ms"])
        self.assertEqual(row["levels"]["core"]["ratio_vs_core"], 1.0)
        grid_only = next(w for w in workloads.BENCH_WORKLOADS.values() if not w.output_mask[0])
        row = bench.bench_workload(grid_only, "cpu", 0.05, warmup=1, reps=2)
        self.assertEqual(set(row["variants"]), {"native", "detgrid"})
        self.assertNotIn("levels", row)
        self.assertNotIn("same_bits", row)

    def test_the_builds_are_run_as_their_level_runs_them(self):
        # _raw_level, the timed call, is detgrid.ops.*_with_options(level=).
        for name in ("rtdetr_l80", "voxelmorph_warp_3d", "stn_mnist"):
            w = workloads.BENCH_WORKLOADS[name]
            case = w.build("cpu", scale=bench.size_scale(w, "tiny"))
            for build in bench.BUILDS:
                raw = bench._raw_level(case, build)
                via_ops = workloads.run_detgrid(case, level=build)
                for got, want in zip(raw, via_ops):
                    self.assertTrue(workloads.bitwise_equal(got, want), (name, build))
                self.assertEqual([g is None for g in raw], [not m for m in case.output_mask])

    def test_a_build_that_moves_a_bit_is_flagged(self):
        real = bench._raw_level

        def off_by_an_ulp(case, level):
            grad_input, grad_grid = real(case, level)
            if level != levels.CORE:
                grad_input = torch.nextafter(grad_input, torch.full_like(grad_input, math.inf))
            return grad_input, grad_grid

        w = workloads.BENCH_WORKLOADS["rtdetr_l80"]
        with mock.patch.object(bench, "_raw_level", off_by_an_ulp):
            row = bench.bench_workload(w, "cpu", 0.05, warmup=0, reps=1)
        self.assertTrue(row["correct"])  # within tolerance of stock
        self.assertTrue(row["detgrid_equals_core"])
        self.assertTrue(row["levels"]["core"]["equals_core"])
        for level in bench.SPEED_LEVELS:
            self.assertFalse(row["levels"][level]["equals_core"])
        self.assertFalse(row["same_bits"])
        row["targets"] = bench.row_targets(row, cuda=False)
        self.assertEqual(bench.summarize([row], cuda=False)["incorrect"], ["rtdetr_l80"])

    def test_row_counters_are_work_counters_of_each_build(self):
        w = workloads.BENCH_WORKLOADS["mask2former_l32"]
        scale = bench.size_scale(w, "tiny")
        row = bench.bench_workload(w, "cpu", scale, warmup=0, reps=1)
        case = w.build("cpu", scale=scale)
        for build in bench.BUILDS:
            self.assertEqual(row["counters"][build], workloads.work_counters(case, build))
            self.assertEqual(row["counters_full_size"][build],
                             workloads.full_size_work_counters(w, build))
            # the call as run is counted with its data; at full size, from its shapes
            self.assertGreater(row["counters"][build]["longest_fold"], 0)
            self.assertEqual(row["counters_full_size"][build]["longest_fold"], -1)
            self.assertEqual(row["counters_full_size"][build]["records"], w.records())

    def test_failing_cudnn_leaves_native_stock_as_the_baseline(self):
        def broken(case):
            raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED")

        w = workloads.BENCH_WORKLOADS["basicvsr_flow_warp"]
        with mock.patch.object(bench, "cudnn_usable", lambda device: True), \
                mock.patch.object(bench, "run_cudnn", broken):
            row = bench.bench_workload(w, "cpu", 0.2, warmup=0, reps=2)
        self.assertEqual(row["stock_route"], "native")
        self.assertIn("CUDNN_STATUS_NOT_SUPPORTED", row["cudnn_error"])
        self.assertEqual(set(row["variants"]), {"native", "detgrid", *levels.CORE_BUILDS})

    def test_unknown_workload_is_refused(self):
        with self.assertRaises(ValueError):
            bench.resolve_names(["rtdetr_l80", "nope"])
        self.assertEqual(bench.resolve_names(["all"]), list(workloads.BENCH_WORKLOADS))
        with mock.patch("builtins.print"):
            self.assertEqual(cli.main(["bench", "--device", "cpu", "--workloads", "nope"]), 2)

    def test_listing_names_each_rows_op_and_taps(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(cli.main(["bench", "--list"]), 0)
        lines = {line.split()[1]: line for line in out.getvalue().splitlines()}
        self.assertEqual(list(lines), list(workloads.BENCH_WORKLOADS))
        bev = lines["simplebev_lift_3d"]
        self.assertTrue(bev.startswith("#18 "))
        for part in ("(6, 128, 1, 56, 100)", "trilinear/zeros/ac=False", " 8 taps/point",
                     "15,360,000 records", "stock aten::grid_sampler_3d_backward"):
            self.assertIn(part, bev)
        self.assertIn("stock aten::cudnn_grid_sampler_backward", lines["tensorf_line"])
        self.assertNotIn("skipped", out.getvalue())


class TestBenchCounters(TestCase):
    """The core builds' work counters on the benchmark rows (issue 60's
    acceptance) and `detgrid bench --counters`."""

    def test_every_benchmark_row_launches_at_most_five_kernels_per_chunk(self):
        # Issue 60: at every build, a chunk's records, its sort, the runs'
        # starts (unique_by_key), the stored partials and the run sums.
        for r in bench.counter_rows():
            w = workloads.BENCH_WORKLOADS[r["name"]]
            for build, counted in r["counters"].items():
                where = (r["name"], build)
                if not w.output_mask[0]:  # the grid gradient alone: one launch, no chunk
                    self.assertEqual((counted["launches"], counted["chunks"]), (1, 0), where)
                    continue
                self.assertGreater(counted["chunks"], 0, where)
                self.assertLessEqual(counted["launches_per_chunk"], 5, where)
                self.assertGreaterEqual(counted["launches"], 5 * counted["chunks"], where)

    def test_the_constant_grid_folds_at_most_4096_terms_in_one_thread_at_every_build(self):
        # Issue 60 (and 33): a million points on one place of a 2x2 input.
        # A chunk of 2^19 records holds 2^17 points, so each pixel's run in
        # it is 2^17 records: 256 summed by the run's first partial, then its
        # 511 stored partials, in one thread (per channel) at every build.
        (row,) = bench.counter_rows(["constant_grid"], data=True)
        for build, counted in row["counters"].items():
            self.assertLessEqual(counted["longest_fold"], 4096, build)
            self.assertEqual(counted["longest_fold"], 256 + (2**17 - 256) // 256, build)
            self.assertEqual(counted["chunks"], 8, build)
        # From the shapes alone the fold is not counted.
        (shapes_only,) = bench.counter_rows(["constant_grid"])
        for counted in shapes_only["counters"].values():
            self.assertEqual(counted["longest_fold"], -1)

    def test_counter_rows_count_every_build_of_every_workload_at_full_size(self):
        rows = bench.counter_rows()
        self.assertEqual([r["name"] for r in rows], list(workloads.BENCH_WORKLOADS))
        for r in rows:
            w = workloads.BENCH_WORKLOADS[r["name"]]
            self.assertEqual(list(r["counters"]), list(levels.CORE_BUILDS))
            self.assertEqual((tuple(r["input_shape"]), tuple(r["grid_shape"])), w.shapes())
            for build, counted in r["counters"].items():
                self.assertEqual(counted, workloads.full_size_work_counters(w, build))
                self.assertEqual(counted["records"], r["records"], r["name"])
                # every record is sorted, one item each
                self.assertEqual(counted["items_sorted"], r["records"], r["name"])
            # A speed level moves no launch, sort or buffer; it starts fewer
            # run-sum threads where a group holds several channels.
            core = r["counters"][levels.CORE]
            for level in bench.SPEED_LEVELS:
                counted = r["counters"][level]
                for field in ("launches", "chunks", "launches_per_chunk", "items_sorted",
                              "key_bytes", "workspace_bytes"):
                    self.assertEqual(counted[field], core[field], (r["name"], level, field))
                self.assertLessEqual(counted["threads"], core["threads"], (r["name"], level))

    def test_counters_with_data_count_the_runs_of_each_build(self):
        # rtdetr_l20 at full size: 32 channels, so grouped-channels reads each
        # record once per group of 4 where the core reads it once per channel.
        (row,) = bench.counter_rows(["rtdetr_l20"], data=True)
        core, grouped = row["counters"]["core"], row["counters"]["grouped-channels"]
        self.assertEqual(row["input_shape"][1], 32)
        self.assertGreater(core["reduce_items"], 0)
        self.assertGreater(core["record_visits"], core["records"])  # once per channel
        self.assertEqual(grouped["reduce_items"] * 4, core["reduce_items"])
        self.assertEqual(grouped["record_visits"] * 4, core["record_visits"])
        self.assertEqual(grouped["longest_fold"], core["longest_fold"])
        case = workloads.BENCH_WORKLOADS["rtdetr_l20"].build("cpu")
        self.assertEqual(core, ops.work_counters(*case.args(), level="core"))

    def test_counters_flag_prints_every_workload_at_every_build(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(cli.main(["bench", "--counters"]), 0)
        text = out.getvalue()
        table = [line for line in text.splitlines() if line.startswith("| ")]
        head = table[0].strip("| ").split(" | ")
        self.assertEqual([line.split(" | ")[1] for line in table[1:]],
                         list(workloads.BENCH_WORKLOADS))
        rows = {r["name"]: r for r in bench.counter_rows()}
        column = {name: head.index(name) for name in ("launches", "threads", "record visits")}
        for line in table[1:]:
            cells = line.strip("| ").split(" | ")
            counters = rows[cells[1]]["counters"]
            launches = {f"{c['launches']:,}" for c in counters.values()}
            self.assertEqual(cells[column["launches"]], launches.pop())  # the same at each
            threads = [f"{counters[b]['threads']:,}" for b in levels.CORE_BUILDS]
            self.assertEqual(cells[column["threads"]],
                             threads[0] if len(set(threads)) == 1 else " / ".join(threads))
            # From the shapes alone: not counted, but by a grid-only call, which reduces nothing.
            grad_input = workloads.BENCH_WORKLOADS[cells[1]].output_mask[0]
            self.assertEqual(cells[column["record visits"]], "-" if grad_input else "0")
        self.assertIn(f"Two values in a cell: {' / '.join(levels.CORE_BUILDS)}", text)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(cli.main(["bench", "--counters", "--workloads", "tensorf_line"]), 0)
        self.assertEqual([line.split(" | ")[1] for line in out.getvalue().splitlines()
                          if line.startswith("| ")][1:], ["tensorf_line"])


if __name__ == "__main__":
    run_tests()
