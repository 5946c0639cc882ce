"""`detgrid bench`: the benchmark matrix of shared BENCHMARKS.md, timed.

Per workload (detgrid.bench.workloads.BENCH_WORKLOADS) the backward variants run
in one process, interleaved rep by rep on rotating copies of the inputs:

- stock native: torch.ops.aten.grid_sampler_2d_backward, or for the 3-D
  rows (#16-#18) grid_sampler_3d_backward (atomicAdd on CUDA);
- stock cuDNN: torch.ops.aten.cudnn_grid_sampler_backward, for the rows that
  take cuDNN in real life (bilinear, zeros, align_corners=True, 4-D,
  C <= 1024, not bf16), when CUDA and cuDNN are there (cuDNN has no 3-D
  grid sampler);
- detgrid: detgrid.ops.grid_sampler_2d_backward / grid_sampler_3d_backward,
  the default deterministic backward (the whole stack's grad_input,
  detgrid.levels.TOP, and the grid gradient's grad_grid; its CUDA build, or
  on the CPU its host build), timed under
  torch.use_deterministic_algorithms(True), the only mode in which
  detgrid.enable() routes to it (the stock variants run outside it, their
  own mode);
- each build of the core (detgrid.levels.CORE_BUILDS: the core, then each
  speed level with the stack's diffs up to it), what
  detgrid.ops.*_with_options(level=) runs: that build's grad_input
  (torch.ops.detgrid._core_grad_input) and the grid gradient's grad_grid, on
  the rows that request grad_input (the builds differ only there). Row field
  levels = {build: {ms, ratio, ratio_vs_core, equals_core}}, the last
  whether its grad_input and grad_grid have the core's bits, as the default
  backward's must too (detgrid_equals_core);
- in-tree: on a torch carrying the ATen change for that rank (detected per
  rank: under torch.use_deterministic_algorithms(True) the stock CUDA
  backward does not raise), aten's own backward in deterministic mode.

Each row gets the median ms per variant, ratio = detgrid / stock where stock
is the route stock really takes (cuDNN where it applies, else native), the
extra peak memory over that stock run (CUDA only), the records count,
max |det - stock| / max |stock| per gradient, flagged past a dtype
tolerance so that a fast wrong kernel cannot win, and every core build's
exact work counters (detgrid.ops.work_counters): of the call as run
(counters; on the CPU with the fields that where the points land decides)
and of the workload at full size from its shapes (counters_full_size).
Functions return data; detgrid.kit.cli prints. counter_rows
(`detgrid bench --counters`) gives every workload's counters at full size
at each build, from the shapes alone, on any machine. The CPU run (the host
build vs stock CPU on small shapes) is a smoke test of this harness, not a
performance claim.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from detgrid import levels
from detgrid.bench import stock_limits
from detgrid.bench.workloads import (BENCH_WORKLOADS, DIMS, Case, Gradients, Workload,
                                     backward_name, bitwise_equal, case_bytes, contiguous_case,
                                     dtype_name, full_size_case, peak_bytes, records, rel_err,
                                     rotation_copies, run_cudnn, run_in_tree, run_stock,
                                     samples_per_cell, synchronize, takes_cudnn, time_rotating,
                                     work_counters)

# The core's builds the bench times and counts, the core first.
BUILDS = levels.CORE_BUILDS
# The speed levels among them, each timed against the core.
SPEED_LEVELS = BUILDS[1:]
# The work counters the tables show per build (detgrid.ops.WORK_COUNTER_FIELDS
# but key_bits); the JSON has them all.
COUNTERS = ("launches", "chunks", "launches_per_chunk", "items_sorted", "key_bytes",
            "workspace_bytes", "threads", "longest_fold", "reduce_items", "record_visits")

# max |det - stock| / max |stock| per gradient beyond which a row is flagged.
# Stock accumulates float16/bfloat16 grad_input in that type (atomics on
# CUDA), detgrid in float: their difference is mostly stock's rounding.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}

# Targets (issue 8): benchmarks, not tests.
GEOMEAN_GOAL = 1.0         # det/stock geometric mean over the measured rows
WORST_GOAL = 1.5           # det/stock of every row
SPEEDUP_GOAL = 0.5         # det/stock of high-collision and large-C rows (2x faster)
HIGH_COLLISION = 16.0      # grid points per touched input cell, mean (samples_per_cell)
LARGE_CHANNELS = 256
MEMORY_BASE_MIB = 64.0     # extra peak memory allowed: 64 MiB + 16 B per record
MEMORY_PER_RECORD = 16
LEVEL_GEOMEAN_GOAL = 1.0   # a speed level / the core, geometric mean over the rows
LEVEL_WORST_GOAL = 1.05    # a speed level / the core, every row
CPU_NA = "n/a (CPU smoke run)"

# Cache to defeat by rotating input copies when the device does not say.
DEFAULT_L2_BYTES = 60 * 2**20
MAX_COPIES = 128

# Sizes: None is full scale; else caps (input elements, grid points) that
# pick a per-workload scale (see size_scale).
SIZES: Dict[str, Optional[Tuple[int, int]]] = {
    "full": None,
    "small": (1 << 21, 1 << 17),
    "tiny": (1 << 15, 1 << 12),
}


@dataclasses.dataclass
class BenchConfig:
    device: str = "cuda"
    names: Optional[Sequence[str]] = None    # None: every workload
    size: str = "full"                       # a key of SIZES
    scale: Optional[float] = None            # overrides size: one scale for all
    warmup: int = 5
    reps: int = 25
    seed: int = 0
    budget_s: Optional[float] = None         # start no workload after this
    quick: bool = False


def default_config(device: str, quick: bool = False) -> BenchConfig:
    """CUDA: full scale, 5 warm-up + 25 timed calls, 420 s budget (the whole
    run fits one 8-minute device call); --quick there: small shapes. CPU:
    small shapes; --quick: tiny shapes, 2 + 20 calls (< 60 s on 2 cores)."""
    if torch.device(device).type == "cuda":
        return BenchConfig(device=device, size="small" if quick else "full", warmup=5,
                           reps=25, budget_s=420.0, quick=quick)
    return BenchConfig(device=device, size="tiny" if quick else "small",
                       warmup=2 if quick else 3, reps=20, budget_s=420.0, quick=quick)


# --------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------


def workload_takes_cudnn(workload: Workload, scale: float = 1.0) -> bool:
    """Whether stock takes cuDNN for this workload on a CUDA machine with cuDNN."""
    in_shape, grid_shape = workload.shapes(scale)
    return takes_cudnn(workload.mode, workload.padding, workload.align_corners, in_shape,
                       workload.dtype, math.prod(grid_shape))


def cudnn_usable(device: str) -> bool:
    return (torch.device(device).type == "cuda" and torch.backends.cudnn.is_available()
            and torch.backends.cudnn.enabled)


def detect_in_tree(device: str) -> Dict[str, Any]:
    """Which ranks' backwards this torch carries in-tree: {"patched": any,
    "dims": [2 and/or 3], "reason": ...}. Probed per rank on CUDA: under
    deterministic algorithms, stock's backward with grad_input does not
    raise (detgrid's own override switched off meanwhile)."""
    if torch.device(device).type != "cuda":
        return {"patched": False, "dims": [],
                "reason": "CPU: stock's CPU backward is deterministic anyway"}
    from detgrid import switch

    was_enabled = switch.is_enabled("cuda")
    if was_enabled:
        switch.disable(["cuda"])
    try:
        probes = {dim: _probe_in_tree(dim, device) for dim in DIMS}
    finally:
        if was_enabled:
            switch.enable(["cuda"])
    dims = [dim for dim, (patched, _) in probes.items() if patched]
    reason = "; ".join(f"{dim}-D: {why}" for dim, (_, why) in probes.items())
    return {"patched": bool(dims), "dims": dims, "reason": reason}


def _probe_in_tree(dim: int, device: str) -> Tuple[bool, str]:
    """Whether the dim-D backward runs in deterministic mode, and why not."""
    g = torch.Generator().manual_seed(0)
    inp = torch.randn(1, 2, *(4,) * dim, generator=g).to(device)
    grid = (torch.rand(1, *(8,) * dim, dim, generator=g) * 2 - 1).to(device)
    grad = torch.randn(1, 2, *(8,) * dim, generator=g).to(device)
    try:
        run_in_tree(Case(f"probe_{dim}d", grad, inp, grid, 0, 0, False, (True, True)))
        synchronize(device)
        return True, "stock CUDA backward runs under deterministic mode"
    except RuntimeError as e:
        if "deterministic" in str(e):
            return False, "stock CUDA backward raises under deterministic mode (unpatched torch)"
        return False, f"probe failed: {type(e).__name__}: {str(e)[:200]}"


def size_scale(workload: Workload, size: str) -> float:
    """1.0 for "full"; else the largest scale (steps of 0.85) whose input
    elements and grid points stay under the size's caps."""
    caps = SIZES[size]
    if caps is None:
        return 1.0
    max_input, max_points = caps
    scale = 1.0
    for _ in range(200):
        in_shape, grid_shape = workload.shapes(scale)
        if math.prod(in_shape) <= max_input and math.prod(grid_shape[:-1]) <= max_points:
            break
        scale *= 0.85
    return scale


# --------------------------------------------------------------------------
# One workload
# --------------------------------------------------------------------------


# The timed calls: the ops themselves, no wrapper around them (case.op picks
# the 2-D or 3-D backward).
def _raw_stock(case: Case) -> Any:
    return getattr(torch.ops.aten, case.op)(*case.args())


def _raw_cudnn(case: Case) -> Any:
    return torch.ops.aten.cudnn_grid_sampler_backward(case.input, case.grid, case.grad_output)


def _raw_detgrid(case: Case) -> Any:  # what detgrid.ops.grid_sampler_{2d,3d}_backward call
    return getattr(torch.ops.detgrid, case.op)(*case.args())


def _raw_level(case: Case, level: str) -> Any:
    """What detgrid.ops.grid_sampler_{2d,3d}_backward_with_options(level=level) calls:
    the grad_input of the core's build ``level`` and the grid gradient's grad_grid, each
    where the mask asks for it."""
    grad_output, inp, grid, mode, padding, align_corners, mask = case.args()
    grad_input = grad_grid = None
    if mask[0]:
        grad_input = torch.ops.detgrid._core_grad_input(grad_output, inp, grid, mode, padding,
                                                        align_corners, level=level)
    if mask[1]:
        grad_grid = torch.ops.detgrid._grid_gradient(grad_output, inp, grid, mode, padding,
                                                     align_corners)
    return grad_input, grad_grid


def _raw_aten(case: Case) -> Any:  # in deterministic mode: the in-tree kernel
    return getattr(torch.ops.aten, case.op)(*case.args())


def _deterministic(on: bool) -> Callable[[], None]:
    return lambda: torch.use_deterministic_algorithms(on)


def describe(workload: Workload, case: Optional[Case] = None,
             scale: float = 1.0) -> Dict[str, Any]:
    """The row's static part: what the workload is."""
    in_shape, grid_shape = workload.shapes(scale)
    if case is not None:
        in_shape, grid_shape = tuple(case.input.shape), tuple(case.grid.shape)
    return {
        "name": workload.name,
        "row": workload.row,
        "source": workload.source,
        "load": workload.load,
        "dim": workload.dim,
        "op": backward_name(workload.dim),
        "taps": workload.taps,
        "scale": scale,
        "input_shape": list(in_shape),
        "grid_shape": list(grid_shape),
        "dtype": dtype_name(workload.dtype),
        "layout": workload.layout,
        "mode": workload.mode_label,
        "padding": workload.padding,
        "align_corners": workload.align_corners,
        "output_mask": list(workload.output_mask),
        "cudnn_route": workload.dim == 2 and takes_cudnn(
            workload.mode, workload.padding, workload.align_corners, in_shape, workload.dtype,
            math.prod(grid_shape)),
    }


def listing() -> List[Dict[str, Any]]:
    """Every workload at full size as describe() gives it, plus the stock
    op it is timed against (cuDNN's where stock takes it on CUDA with
    cuDNN) and its records."""
    rows = []
    for workload in BENCH_WORKLOADS.values():
        row = describe(workload)
        row["stock_op"] = "cudnn_grid_sampler_backward" if row["cudnn_route"] else row["op"]
        row["records"] = workload.records()
        rows.append(row)
    return rows


def build_counters(case: Case) -> Dict[str, Dict[str, int]]:
    """{build: detgrid.ops.work_counters of the case at that build} for every
    build of the core (BUILDS): on the CPU with the fields that where the
    points land decides, from the shapes alone on any other device."""
    return {build: work_counters(case, build) for build in BUILDS}


def counter_rows(names: Optional[Sequence[str]] = None,
                 data: bool = False) -> List[Dict[str, Any]]:
    """Per workload at full size (every one by default): its shapes, records
    and every core build's exact work counters (build_counters). From the
    shapes alone by default: nothing is allocated or run, so any machine
    gives them, and longest_fold, reduce_items and record_visits are -1 (not
    counted). With data, the workload's inputs are built at full size on the
    CPU (seed 0) and the host builds count those fields too: minutes for the
    whole matrix, and the memory of its largest row (simplebev_lift_3d, about
    2 GB)."""
    rows = []
    for name in resolve_names(names):
        workload = BENCH_WORKLOADS[name]
        case = workload.build("cpu") if data else full_size_case(workload)
        in_shape, grid_shape = workload.shapes()
        rows.append({"name": name, "row": workload.row, "input_shape": list(in_shape),
                     "grid_shape": list(grid_shape), "records": workload.records(),
                     "counters": build_counters(case)})
    return rows


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f}"


def _count(value: int) -> str:
    return "-" if value < 0 else f"{value:,}"


# counters_table's heads of the COUNTERS that its cells do not name as they are.
_COUNTER_HEADS = {"launches_per_chunk": "per chunk", "items_sorted": "items sorted",
                  "key_bytes": "key B", "workspace_bytes": "workspace MiB",
                  "longest_fold": "longest fold", "reduce_items": "reduce items",
                  "record_visits": "record visits"}


def counters_table(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The rows' build counters (row field counters: {build: work_counters})
    as Markdown lines, one line per row that has them, then the legend. A
    cell holds one value where every build counts the same, else each
    build's in BUILDS order."""
    head = ["#", "workload", "C", "records"] + [_COUNTER_HEADS.get(f, f) for f in COUNTERS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "counters" not in r:
            continue
        cells = [str(r["row"]), r["name"], str(r["input_shape"][1]), f"{r['records']:,}"]
        for field in COUNTERS:
            fmt = _mib if field == "workspace_bytes" else _count
            values = [fmt(r["counters"][build][field]) for build in BUILDS]
            cells.append(values[0] if len(set(values)) == 1 else " / ".join(values))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [
        "",
        f"Two values in a cell: {' / '.join(BUILDS)} (`detgrid.levels.CORE_BUILDS`); one: "
        "the same at every build. `detgrid.ops.work_counters(..., level=)`: what the CUDA "
        "build launches, sorts and allocates, counted by its host build. launches: kernel "
        "launches, a CUB call as one, the grid gradient's one included; per chunk: "
        "grad_input's launches over its chunks (one sort each); key B: bytes per sort key; "
        "workspace: the peak of detgrid's buffers and CUB's temporary storage; threads: "
        "those grad_input's kernels start; longest fold: the most terms one thread adds in "
        "sequence; reduce items: run-sum items with work (a run of one grad_input position "
        "and a group of channels); record visits: reads of a record by the run sums and "
        "stored partials. -: where the points land decides it, and the counts came from the "
        "shapes alone.",
    ]


def counters_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """counter_rows as a Markdown table and its legend."""
    return "\n".join(counters_table(rows)) + "\n"


def _stats(ms: Sequence[float]) -> Dict[str, Any]:
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
            "n": len(ms)}


def _same_bits(a: Gradients, b: Gradients) -> bool:
    """Whether both gradients (None where not asked for) have the same bits."""
    return all(bitwise_equal(x, y) for x, y in zip(a, b))


def _rel_diffs(got: Gradients, ref: Gradients) -> Dict[str, Optional[float]]:
    return {"grad_input": rel_err(got[0], ref[0]), "grad_grid": rel_err(got[1], ref[1])}


def _judged(diffs: Dict[str, Optional[float]], dtype: str) -> List[Optional[float]]:
    """The differences a row is judged on. For float16 and bfloat16 with
    grad_input asked for, grad_input's only: their grid gradient has no
    reference that is both independent and the same function. Stock's own
    accumulates in the dtype, and float64 stock computes coordinates in
    float64, while stock's forward (and detgrid) rounds them to the dtype, so
    where the dtype rounds a coordinate onto a cell boundary the one-sided
    derivatives differ by a whole term. tests/test_agreement.py checks that
    gradient against the float64 gradient of the dtype's own function."""
    if dtype in ("float16", "bfloat16") and diffs["grad_input"] is not None:
        return [diffs["grad_input"]]
    return list(diffs.values())


def _max_or_none(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _upcast(case: Case) -> Case:
    return dataclasses.replace(case, grad_output=case.grad_output.double(),
                               input=case.input.double(), grid=case.grid.double())


def judge(vs_stock: Optional[float], vs_float64: Dict[str, Optional[float]],
          tolerance: float) -> Tuple[bool, str]:
    """Whether detgrid's result is right, and by what: within tolerance of
    stock; or, where stock itself is further off (float16/bfloat16 stock
    accumulates in that type), within tolerance of float64 stock and no
    further from it than stock. NaN/inf differences are never right."""
    if vs_stock is not None and vs_stock <= tolerance:
        return True, "stock"
    det, stock = vs_float64.get("detgrid"), vs_float64.get("stock")
    if det is not None and det <= tolerance and (stock is None or det <= stock):
        return True, "float64 (stock is further off)"
    return False, "none"


def _ratio(ms: float, base: float) -> Optional[float]:
    return ms / base if base > 0 else None


def bench_workload(workload: Workload, device: str, scale: float, warmup: int, reps: int,
                   seed: int = 0, in_tree: bool = False,
                   cache_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Times, checks and counts one workload; returns its row (see module doc)."""
    t0 = time.monotonic()
    cuda = torch.device(device).type == "cuda"
    case = workload.build(device, seed, scale)
    row = describe(workload, case, scale)
    row["status"] = "measured"
    use_cudnn = row["cudnn_route"] and cudnn_usable(device)
    row["stock_route"] = "cudnn" if use_cudnn else "native"
    row["records"] = records(case)
    # Exact work counts at every build: of the case as run, and of the
    # workload at full size from its shapes, which is what a GPU run does.
    row["counters"] = build_counters(case)
    row["counters_full_size"] = build_counters(full_size_case(workload))
    density = samples_per_cell(case)
    row["samples_per_cell"] = density["mean"]
    row["samples_per_cell_max"] = density["max"]
    row["high_collision"] = bool(case.output_mask[0] and density["mean"] >= HIGH_COLLISION)
    row["large_channels"] = bool(case.output_mask[0] and case.input.shape[1] >= LARGE_CHANNELS)

    # Correctness first (also the first warm-up): detgrid against stock
    # native (the same math), and against float64 stock for context.
    stock_out = run_stock(case)
    from detgrid.bench.workloads import run_detgrid  # loads the extension

    det_out = run_detgrid(case)
    synchronize(device)
    row["rel_diff"] = _rel_diffs(det_out, stock_out)
    row["max_rel_diff"] = _max_or_none(_judged(row["rel_diff"], row["dtype"]))
    row["tolerance"] = TOLERANCE[row["dtype"]]
    ref64 = run_stock(_upcast(case))
    row["err_vs_float64"] = {
        "detgrid": _max_or_none(_judged(_rel_diffs(det_out, ref64), row["dtype"])),
        "stock": _max_or_none(_judged(_rel_diffs(stock_out, ref64), row["dtype"])),
    }
    del ref64
    row["correct"], row["correct_by"] = judge(row["max_rel_diff"], row["err_vs_float64"],
                                              row["tolerance"])
    cudnn_case = contiguous_case(case) if use_cudnn else None
    if use_cudnn:
        row["cudnn_inputs_made_contiguous"] = not (case.input.is_contiguous()
                                                   and case.grid.is_contiguous())
        try:
            cudnn_out = run_cudnn(cudnn_case)
            synchronize(device)
            row["rel_diff_vs_cudnn"] = _rel_diffs(det_out, cudnn_out)
            del cudnn_out
        except RuntimeError as e:  # keep the row: stock native is then the baseline
            use_cudnn, cudnn_case = False, None
            row["stock_route"] = "native"
            row["cudnn_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    # The core's builds, where they differ (grad_input requested): every one,
    # and the default backward, must give the core's bits.
    with_builds = case.output_mask[0]
    if with_builds:
        core_out = _raw_level(case, levels.CORE)
        row["detgrid_equals_core"] = _same_bits(det_out, core_out)
        row["levels"] = {levels.CORE: {"equals_core": True}, **{
            level: {"equals_core": _same_bits(_raw_level(case, level), core_out)}
            for level in SPEED_LEVELS}}
        row["same_bits"] = row["detgrid_equals_core"] and all(
            v["equals_core"] for v in row["levels"].values())
        del core_out
    if in_tree:
        tree_out = run_in_tree(case)
        row["in_tree_rel_diff"] = _rel_diffs(tree_out, stock_out)
        # the in-tree kernel is the core: the same bits as detgrid's
        row["in_tree_equals_detgrid"] = _same_bits(tree_out, det_out)
        del tree_out
    del stock_out, det_out

    # Timing: every variant on rotating copies (> 2x the cache between two
    # uses of one copy on CUDA; one copy on the CPU), interleaved.
    if cache_bytes is None:
        cache_bytes = l2_bytes(device) if cuda else 0
    copies = rotation_copies(case, cache_bytes, MAX_COPIES)
    row["copies"] = len(copies)
    row["copy_mib"] = case_bytes(case) / 2**20
    variants: List[Tuple[str, Callable[[Case], Any], Sequence[Case], bool]] = [
        ("native", _raw_stock, copies, False)]
    if use_cudnn:
        cudnn_copies = [contiguous_case(c) for c in copies]
        variants.append(("cudnn", _raw_cudnn, cudnn_copies, False))
    variants.append(("detgrid", _raw_detgrid, copies, True))
    if with_builds:
        variants += [(build, functools.partial(_raw_level, level=build), copies, False)
                     for build in BUILDS]
    if in_tree:
        variants.append(("in_tree", _raw_aten, copies, True))
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        times = time_rotating([fn for _, fn, _, _ in variants], copies, device, warmup, reps,
                              before=[_deterministic(det) for *_, det in variants],
                              fn_cases=[own for _, _, own, _ in variants])
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)
    row["variants"] = {name: _stats(ms) for (name, *_), ms in zip(variants, times)}
    ms = {name: v["median_ms"] for name, v in row["variants"].items()}
    row["stock_ms"] = ms[row["stock_route"]]
    row["detgrid_ms"] = ms["detgrid"]
    row["ratio"] = _ratio(ms["detgrid"], row["stock_ms"])
    if with_builds:
        for build in BUILDS:
            row["levels"][build].update(ms=ms[build], ratio=_ratio(ms[build], row["stock_ms"]),
                                        ratio_vs_core=_ratio(ms[build], ms[levels.CORE]))
    if in_tree:
        row["in_tree_ms"] = ms["in_tree"]
        row["in_tree_ratio"] = _ratio(ms["in_tree"], row["stock_ms"])

    # Peak memory of one call beyond what was allocated before (CUDA only).
    stock_fn = (lambda: run_cudnn(cudnn_case)) if use_cudnn else (lambda: run_stock(case))
    stock_peak = peak_bytes(stock_fn, device)
    det_peak = peak_bytes(lambda: run_detgrid(case), device)
    row["peak_mib"] = {"stock": None if stock_peak is None else stock_peak / 2**20,
                       "detgrid": None if det_peak is None else det_peak / 2**20}
    if in_tree:
        tree_peak = peak_bytes(lambda: run_in_tree(case), device)
        row["peak_mib"]["in_tree"] = None if tree_peak is None else tree_peak / 2**20
    row["extra_peak_mib"] = (None if stock_peak is None or det_peak is None
                             else (det_peak - stock_peak) / 2**20)
    row["memory_bound_mib"] = MEMORY_BASE_MIB + MEMORY_PER_RECORD * row["records"] / 2**20
    row["warmup"], row["reps"] = warmup, reps
    row["seconds"] = time.monotonic() - t0
    return row


def l2_bytes(device: str) -> int:
    if torch.device(device).type != "cuda":
        return 0
    size = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0)
    return int(size) if size else DEFAULT_L2_BYTES


# --------------------------------------------------------------------------
# Targets and summary
# --------------------------------------------------------------------------


def speed_goal(row: Dict[str, Any]) -> float:
    """The det/stock a row must reach: 0.5 (2x faster) for high-collision
    and C >= 256 rows, else the worst-row bound 1.5."""
    return SPEEDUP_GOAL if row.get("high_collision") or row.get("large_channels") else WORST_GOAL


def row_targets(row: Dict[str, Any], cuda: bool) -> Dict[str, Any]:
    """Per-row target checks: speed and memory (met / not met, or n/a on
    the CPU) and correctness (on every device)."""
    goal = speed_goal(row)
    out: Dict[str, Any] = {"speed_goal": goal, "correct": row["correct"]}
    if not cuda:
        out["speed"] = out["memory"] = out["met"] = CPU_NA
        return out
    out["speed"] = row["ratio"] is not None and row["ratio"] <= goal
    out["memory"] = (row["extra_peak_mib"] is not None
                     and row["extra_peak_mib"] <= row["memory_bound_mib"])
    out["met"] = bool(out["speed"] and out["memory"] and row["correct"])
    return out


def geomean(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def level_summary(rows: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per build of the core, over the measured rows that time it: the geomean
    of build / stock and, for a speed level, the geomean and worst of build /
    core and the row of the worst."""
    timed = [r for r in rows if r.get("status") == "measured" and "levels" in r]
    out: Dict[str, Dict[str, Any]] = {}
    for build in BUILDS:
        entry: Dict[str, Any] = {"geomean": geomean([r["levels"][build]["ratio"]
                                                     for r in timed])}
        if build != levels.CORE:
            vs_core = [(r["levels"][build]["ratio_vs_core"], r["name"]) for r in timed
                       if r["levels"][build]["ratio_vs_core"] is not None]
            worst = max(vs_core, default=(None, None))
            entry.update(geomean_vs_core=geomean([v for v, _ in vs_core]),
                         worst_vs_core=worst[0], worst_vs_core_workload=worst[1])
        out[build] = entry
    return out


def summarize(rows: Sequence[Dict[str, Any]], cuda: bool) -> Dict[str, Any]:
    """Geomean and worst det/stock over the measured rows, the builds' ratios,
    and the targets. A row is incorrect where its result is past tolerance
    or where a build, or the default backward, does not give the core's
    bits."""
    measured = [r for r in rows if r.get("status") == "measured" and r.get("ratio") is not None]
    ratios = [r["ratio"] for r in measured]
    worst = max(measured, key=lambda r: r["ratio"]) if measured else None
    fast_rows = [r for r in measured if r["high_collision"] or r["large_channels"]]
    bits_differ = [r["name"] for r in measured if r.get("same_bits") is False]
    summary: Dict[str, Any] = {
        "geomean": geomean(ratios),
        "worst": worst["ratio"] if worst else None,
        "worst_workload": worst["name"] if worst else None,
        "measured": len(measured),
        "skipped": [r["name"] for r in rows if r.get("status") == "skipped"],
        "errors": [r["name"] for r in rows if r.get("status") == "error"],
        "bits_differ": bits_differ,
        "incorrect": [r["name"] for r in measured
                      if not r["correct"] or r["name"] in bits_differ],
        "levels": level_summary(measured),
    }
    tree = [r["in_tree_ratio"] for r in measured if r.get("in_tree_ratio") is not None]
    if tree:
        summary["in_tree_geomean"] = geomean(tree)
        summary["in_tree_worst"] = max(tree)

    def met(ok: bool) -> Any:
        return ok if cuda else CPU_NA

    over_memory = [r["name"] for r in measured
                   if r["extra_peak_mib"] is not None
                   and r["extra_peak_mib"] > r["memory_bound_mib"]]
    slow_fast_rows = [r["name"] for r in fast_rows if r["ratio"] > SPEEDUP_GOAL]
    targets = [
        {"target": "det/stock geomean <= 1.0", "value": summary["geomean"],
         "met": met(summary["geomean"] is not None and summary["geomean"] <= GEOMEAN_GOAL)},
        {"target": "det/stock worst <= 1.5", "value": summary["worst"],
         "met": met(summary["worst"] is not None and summary["worst"] <= WORST_GOAL)},
        {"target": "high-collision (>= 16 samples/cell) and C >= 256 rows >= 2x faster "
                   "(det/stock <= 0.5)",
         "value": {r["name"]: r["ratio"] for r in fast_rows},
         "met": met(bool(fast_rows) and not slow_fast_rows), "failing": slow_fast_rows},
        {"target": "added peak memory <= 64 MiB + 16 B per record",
         "value": max((r["extra_peak_mib"] for r in measured
                       if r["extra_peak_mib"] is not None), default=None),
         "met": met(bool(measured) and all(r["extra_peak_mib"] is not None
                                           for r in measured) and not over_memory),
         "failing": over_memory},
    ]
    for level in SPEED_LEVELS:
        entry = summary["levels"][level]
        slower = [r["name"] for r in measured if "levels" in r
                  and (r["levels"][level]["ratio_vs_core"] or 0) > LEVEL_WORST_GOAL]
        targets.append({
            "target": f"{level}/core geomean <= 1.0, no row above 1.05",
            "value": {"geomean": entry["geomean_vs_core"], "worst": entry["worst_vs_core"]},
            "met": met(entry["geomean_vs_core"] is not None
                       and entry["geomean_vs_core"] <= LEVEL_GEOMEAN_GOAL and not slower),
            "failing": slower})
    targets.append(
        {"target": "every row right: within its dtype tolerance of stock, or of float64 "
                   "where stock is further off, and the core's bits at every build (not a "
                   "speed target)",
         "value": summary["incorrect"],
         "met": bool(measured) and not summary["incorrect"]})
    summary["targets"] = targets
    return summary


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def environment(device: str) -> Dict[str, Any]:
    cuda = torch.device(device).type == "cuda"
    env: Dict[str, Any] = {
        "device": device,
        "device_name": (torch.cuda.get_device_name(torch.device(device)) if cuda
                        else f"cpu {platform.machine()} ({os.cpu_count()} cores)"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": (torch.backends.cudnn.version() if cudnn_usable(device) else None),
        "threads": torch.get_num_threads(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if cuda:
        p = torch.cuda.get_device_properties(torch.device(device))
        env.update({"capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
                    "l2_bytes": l2_bytes(device)})
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        proc = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        env["git_commit"] = proc.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    return env


def resolve_names(names: Optional[Sequence[str]]) -> List[str]:
    """Workload names in matrix order; raises ValueError on an unknown name."""
    if not names or list(names) == ["all"]:
        return list(BENCH_WORKLOADS)
    unknown = [n for n in names if n not in BENCH_WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; known: "
                         f"{', '.join(BENCH_WORKLOADS)}")
    return list(dict.fromkeys(names))


def _bench_row(workload, config: BenchConfig, cuda: bool, tree: Dict[str, Any],
               elapsed_s: Callable[[], float]) -> Dict[str, Any]:
    """One workload's row: measured, or skipped (budget, stock limits), or an error."""
    scale = config.scale if config.scale is not None else size_scale(workload, config.size)
    if config.budget_s is not None and elapsed_s() > config.budget_s:
        row = describe(workload, None, scale)
        row.update(status="skipped", skip_reason=f"time budget: --budget-s "
                   f"{config.budget_s:g} spent before it started")
        return row
    if not cuda and not stock_limits.stock_cpu_workload_is_reliable(workload, scale):
        row = describe(workload, None, scale)
        row.update(status="skipped", skip_reason=stock_limits.SKIP_REASON)
        return row
    try:
        return bench_workload(workload, config.device, scale, config.warmup, config.reps,
                              config.seed, in_tree=workload.dim in tree["dims"])
    except Exception as e:  # a row, not a crash: the rest still runs
        row = describe(workload, None, scale)
        row.update(status="error", error=f"{type(e).__name__}: {str(e)[:500]}")
        return row


def run_bench(config: BenchConfig, clock: Callable[[], float] = time.monotonic,
              on_row: Optional[Callable[[int, int, Dict[str, Any]], None]] = None
              ) -> Dict[str, Any]:
    """Runs the matrix; returns {"device", "torch", "workloads": [rows],
    "geomean", "worst", "summary", ...}. Rows never vanish: a workload not
    run is a row with status "skipped" (time budget) or "error".
    on_row(done, total, row) is called as each row is finished (progress)."""
    device = config.device
    cuda = torch.device(device).type == "cuda"
    names = resolve_names(config.names)
    start = clock()
    env = environment(device)
    tree = detect_in_tree(device)
    rows: List[Dict[str, Any]] = []
    for name in names:
        row = _bench_row(BENCH_WORKLOADS[name], config, cuda, tree, lambda: clock() - start)
        if cuda:
            torch.cuda.empty_cache()
        rows.append(row)
        if on_row:
            on_row(len(rows), len(names), row)
    for row in rows:
        if row["status"] == "measured":
            row["targets"] = row_targets(row, cuda)
    summary = summarize(rows, cuda)
    return {
        **env,
        "levels": list(BUILDS),
        "quick": config.quick,
        "size": config.size if config.scale is None else f"scale {config.scale:g}",
        "warmup": config.warmup,
        "reps": config.reps,
        "seed": config.seed,
        "budget_s": config.budget_s,
        "in_tree": tree,
        "elapsed_s": clock() - start,
        "geomean": summary["geomean"],
        "worst": summary["worst"],
        "summary": summary,
        "workloads": rows,
    }


# --------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def default_out(result: Dict[str, Any], directory: str = os.path.join("benchmarks", "results")
                ) -> str:
    """benchmarks/results/<device-name-slug>-<date>[-quick].json"""
    name = result["device_name"]
    if result["device"] == "cpu" or str(result["device"]).startswith("cpu"):
        name = f"cpu {platform.machine()}"
    date = result["time_utc"][:10]
    suffix = "-quick" if result.get("quick") else ""
    return os.path.join(directory, f"{slug(name)}-{date}{suffix}.json")


def sibling_paths(out: str) -> Tuple[str, str]:
    """FILE.json -> (FILE.md, FILE.png)."""
    stem = out[:-5] if out.endswith(".json") else out
    return stem + ".md", stem + ".png"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits}f}".rstrip(
            "0").rstrip(".")
    return str(value)


def _shape(shape: Sequence[int]) -> str:
    return "×".join(str(d) for d in shape)


def _in_tree_dims(tree: Dict[str, Any]) -> str:
    return ", ".join(f"{dim}-D" for dim in tree["dims"]) or "no"


TABLE_WIDTH = 120  # the widest a row of the Markdown table may be: a terminal's
REASON_WIDTH = 50  # of a skip or error reason in the table (whole in the JSON)


def _row_cells(r: Dict[str, Any], has_tree: bool, width: int) -> List[str]:
    """One workload's table cells: times, ratio, memory, correctness; what
    describes the row (shapes, dtype, modes, mask, records, samples per cell,
    the goal) is in the JSON and `detgrid bench --list`."""
    cells = [str(r["row"]), r["name"]]
    if r["status"] != "measured":
        why = str(r.get("skip_reason") or r.get("error"))
        if len(why) > REASON_WIDTH:
            why = why[:REASON_WIDTH - 1] + "…"
        return cells + [f"{r['status']}: {why}"] + [""] * (width - len(cells) - 1)
    route = r["stock_route"]
    if r.get("cudnn_error") or (r["cudnn_route"] and route != "cudnn"):
        route += "*"
    extra = _fmt(r["extra_peak_mib"])
    if r["extra_peak_mib"] is not None and r["extra_peak_mib"] > r["memory_bound_mib"]:
        extra = f"**{extra}**"
    diff = _fmt(r["max_rel_diff"])
    if not r["correct"]:
        diff = f"**{diff}**"
    elif r["correct_by"] != "stock":
        diff += " †"
    met = r["targets"]["met"]
    met = "n/a" if met == CPU_NA else met if isinstance(met, str) else ("yes" if met else "**no**")
    if not r["correct"]:
        met = "**WRONG**"
    elif r.get("same_bits") is False:
        met = "**BITS**"
    cells += [route, _fmt(r["stock_ms"]), _fmt(r["variants"]["detgrid"]["median_ms"])]
    if has_tree:
        cells.append(_fmt(r.get("in_tree_ms")))
    return cells + [_fmt(r["ratio"]), extra, diff, met]


def _table(rows: List[Dict[str, Any]]) -> List[str]:
    """The workload table, each line at most TABLE_WIDTH characters for
    ordinary names and numbers, then its legend."""
    has_tree = any(r.get("in_tree_ms") is not None for r in rows)
    head = ["#", "workload", "stock", "stock ms", "det ms"] + (["in-tree ms"] if has_tree else [])
    head += ["det/stock", "extra MiB", "max rel diff", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_row_cells(r, has_tree, len(head))) + " |" for r in rows]
    return lines + [
        "",
        "stock: the route stock takes (* a cuDNN row timed on native: no cuDNN here, or it "
        "failed, see the JSON). extra MiB in bold: over the row's bound. max rel diff in bold: "
        "past the dtype's tolerance, a WRONG result; † stock was off, right against float64. "
        "met: the row's speed and memory goals (CPU: n/a, a smoke run); BITS: a build of the "
        "core, or det, does not give the core's bits. Shapes, dtype, layout, "
        "modes, mask, records, samples per cell, bounds and goals: the JSON, and "
        "`detgrid bench --list`.",
    ]


def _level_table(rows: List[Dict[str, Any]]) -> List[str]:
    """Per measured row that times the builds: each build's ms, each speed
    level's time over the core's, whether they and det give the core's
    bits; then the legend."""
    head = (["#", "workload"] + [f"{build} ms" for build in BUILDS]
            + [f"{level}/core" for level in SPEED_LEVELS] + ["core's bits"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "measured" or "levels" not in r:
            continue
        timed = r["levels"]
        cells = [str(r["row"]), r["name"]] + [_fmt(timed[build]["ms"]) for build in BUILDS]
        cells += [_fmt(timed[level]["ratio_vs_core"]) for level in SPEED_LEVELS]
        lines.append("| " + " | ".join(cells + [_fmt(r["same_bits"])]) + " |")
    return lines + [
        "",
        "ms: median of each build as `detgrid.ops.*_with_options(level=)` runs it (its "
        "grad_input, the grid gradient's grad_grid), on the rows that request grad_input. "
        "core's bits: every build and det give the core's grad_input and grad_grid bit for bit.",
    ]


def markdown(result: Dict[str, Any]) -> str:
    """The result as a Markdown report: header, table, targets, notes."""
    cuda = result["device"] != "cpu"
    s = result["summary"]
    lines = [
        f"# detgrid bench: {result['device_name']}",
        "",
        f"torch {result['torch']} (CUDA {result['torch_cuda']}, cuDNN {result['cudnn']}), "
        f"commit {result.get('git_commit')}, {result['time_utc']}; sizes: {result['size']}; "
        f"{result['warmup']} warm-up + {result['reps']} timed calls per variant, interleaved, "
        f"median; in-tree path: {_in_tree_dims(result['in_tree'])} "
        f"({result['in_tree']['reason']}); {result['elapsed_s']:.1f} s.",
        "",
    ]
    if not cuda:
        lines += ["**CPU smoke run**: the host builds vs stock CPU on small shapes. It tests "
                  "the harness; its times are not a performance claim.", ""]
    lines += _table(result["workloads"])
    lines += ["", f"det/stock geomean {_fmt(s['geomean'])}, worst {_fmt(s['worst'])} "
              f"({s['worst_workload']}); {s['measured']} rows measured, "
              f"{len(s['skipped'])} skipped, {len(s['errors'])} errors."]
    if "in_tree_geomean" in s:
        lines.append(f"in-tree/stock geomean {_fmt(s['in_tree_geomean'])}, worst "
                     f"{_fmt(s['in_tree_worst'])}.")
    lines += ["", "## The core's builds", ""] + _level_table(result["workloads"])
    lines += ["", "; ".join(f"{build}/stock geomean {_fmt(entry['geomean'])}"
                            + (f", {build}/core geomean {_fmt(entry['geomean_vs_core'])}, worst "
                               f"{_fmt(entry['worst_vs_core'])}"
                               if "geomean_vs_core" in entry else "")
                            for build, entry in s["levels"].items()) + "."]
    lines += ["", "## Work counters of the calls as run", ""] + counters_table(
        [r for r in result["workloads"] if r["status"] == "measured"])
    lines += ["", "## Targets (benchmarks, not tests)", "", "| target | value | met |",
              "|---|---|---|"]
    for t in s["targets"]:
        value = t["value"]
        if isinstance(value, dict):
            value = ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()) or "-"
        elif isinstance(value, list):
            value = ", ".join(value) or "none"
        else:
            value = _fmt(value)
        met = t["met"] if isinstance(t["met"], str) else ("yes" if t["met"] else "**no**")
        if t.get("failing") and not isinstance(t["met"], str):
            met += " (failing: " + ", ".join(t["failing"]) + ")"
        lines.append(f"| {t['target']} | {value} | {met} |")
    lines += [
        "",
        "## Method",
        "",
        "- stock = the route stock takes: cuDNN (`aten::cudnn_grid_sampler_backward`, on "
        "contiguous copies made outside the timed region; it computes both gradients) for "
        "bilinear · zeros · align_corners=True · 4-D · C ≤ 1024 · not bf16 on CUDA with cuDNN; "
        "else native `aten::grid_sampler_2d_backward`, or `aten::grid_sampler_3d_backward` for "
        "the 3-D rows (5-D input; cuDNN has no 3-D grid sampler). det = `detgrid.ops."
        "grid_sampler_2d_backward` / `grid_sampler_3d_backward`, the default deterministic "
        "backward (the whole stack's grad_input, the grid gradient's grad_grid); in-tree = "
        "aten's backward under deterministic mode on a torch patched for that rank.",
        "- builds: each build of the core (`detgrid.levels.CORE_BUILDS`) as "
        "`detgrid.ops.*_with_options(level=)` runs it, on the rows that request grad_input; "
        "a speed level is timed against the core on the same inputs, and every build and "
        "det must give the core's bits.",
        "- work counters: `detgrid.ops.work_counters(..., level=)` of each call as run (on the "
        "CPU with the fields where the points land decides; the JSON's counters_full_size: "
        "the workload at full size from its shapes).",
        "- timing: CUDA events around each call (launch gaps included), the host clock on the "
        "CPU; variants interleaved call by call; every call takes the next of several input "
        "copies, enough that more than twice the L2 cache is touched before a copy is reused "
        "(one copy on the CPU).",
        "- extra MiB: `torch.cuda.max_memory_allocated` over one det call minus over one "
        "stock call (CUDA only); bound 64 MiB + 16 B per record; records = grid points × "
        "taps (bilinear 4, bicubic 16, nearest 1; 3-D: trilinear 8, nearest 1) when grad_input "
        "is asked for.",
        "- max rel diff: max over gradients of max|det − stock native| / max|stock native|; "
        "tolerance float32 1e-4, float64 1e-10, float16 1e-2, bfloat16 5e-2. Past it a row is "
        "still right only if det is within the tolerance of stock run in float64 and closer "
        "to it than stock (stock accumulates half types in that type); else it is flagged. "
        "float16 and bfloat16 rows are judged on grad_input (their coordinates are rounded to "
        "the dtype, as stock's forward does, which float64 stock does not).",
        "- samples/cell: grid points per touched input cell or voxel (the nearest, mean); "
        "≥ 16 is high-collision; goal ≤ 0.5 for those and for C ≥ 256, else ≤ 1.5.",
    ]
    return "\n".join(lines) + "\n"


SMOKE_COLOR = "0.65"  # grey: a CPU run's times are no win or loss


def _bar_color(ratio: float, smoke: bool) -> str:
    """Green where detgrid is faster, red where slower; grey for a CPU smoke
    run, whose small shapes and noisy host clock make no claim either way."""
    if smoke:
        return SMOKE_COLOR
    return "#2a9d55" if ratio <= 1.0 else "#d1495b"


def plot(result: Dict[str, Any], path: str) -> str:
    """A bar plot of det/stock per workload (log scale, 1.0 line) to path (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["workloads"]
    smoke = result["device"] == "cpu"
    names = [r["name"] for r in rows]
    ratios = [r.get("ratio") if r["status"] == "measured" else None for r in rows]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.42 * len(rows) + 2), 5.2))
    xs = list(range(len(rows)))
    shown = [v for v in ratios if v]
    lo = min(shown + [0.5]) / 1.6
    hi = max(shown + [2.0]) * 1.6
    for x, r, v in zip(xs, rows, ratios):
        if not v:
            ax.text(x, lo * 1.15, r["status"], rotation=90, ha="center", va="bottom",
                    fontsize=7, color="0.45")
            continue
        hatch = "xx" if not r["correct"] else None
        ax.bar(x, v, color=_bar_color(v, smoke), hatch=hatch, edgecolor="black", linewidth=0.4,
               bottom=0)
        if not smoke and v <= speed_goal(r) and (r["high_collision"] or r["large_channels"]):
            ax.text(x, v * 1.05, "2x", ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ax.axhline(1.0, color="black", linewidth=1.0)
    ax.axhline(WORST_GOAL, color="0.4", linewidth=0.8, linestyle="--")
    ax.axhline(SPEEDUP_GOAL, color="0.4", linewidth=0.8, linestyle=":")
    first_3d = next((x for x, r in zip(xs, rows) if r["dim"] == 3), None)
    if first_3d:  # the 3-D rows (their own backward) after a divider, if 2-D rows precede
        ax.axvline(first_3d - 0.5, color="0.5", linewidth=0.8, linestyle="-.")
        ax.text(first_3d - 0.4, hi / 1.15, "3-D →", ha="left", va="top", fontsize=7,
                color="0.3")
    ax.set_xlim(-0.7, len(rows) - 0.3)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("detgrid / stock time (log; < 1 is faster)")
    title = f"detgrid bench: {result['device_name']}, torch {result['torch']}"
    if smoke:
        title = f"CPU smoke run, not a performance claim: {title}"
    g = result["summary"]["geomean"]
    if g:
        title += f"\ngeomean {g:.3g}, worst {result['summary']['worst']:.3g}; " \
                 "dashed 1.5 worst bound, dotted 0.5 speed-up goal; hatched: wrong result"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_out(out: str) -> None:
    """Raises ValueError unless FILE.json, FILE.md and FILE.png can be
    written (the folder made if need be): for a check before the run, not a
    traceback after it."""
    for path in (out, *sibling_paths(out)):
        if os.path.isdir(path):
            raise ValueError(f"{path} is a directory")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"{path} is not writable")
    folder = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(folder):  # the nearest folder that exists
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot create files in {folder}")


def write_outputs(result: Dict[str, Any], out: str) -> Dict[str, Optional[str]]:
    """Writes FILE.json, FILE.md and FILE.png; returns their paths (png
    None where matplotlib is missing, as on a bare device machine: then
    `detgrid bench --render FILE.json` draws it later)."""
    md_path, png_path = sibling_paths(out)
    directory = os.path.dirname(out)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(out, "w") as f:
        json.dump(_jsonable(result), f, indent=1, allow_nan=False)
        f.write("\n")
    return {"json": out, **render(result, out)}


def render(result: Dict[str, Any], out: str) -> Dict[str, Optional[str]]:
    """Writes FILE.md and FILE.png for a result (a fresh one, or one read
    back from FILE.json)."""
    md_path, png_path = sibling_paths(out)
    with open(md_path, "w") as f:
        f.write(markdown(result))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {"markdown": md_path, "png": None}
    return {"markdown": md_path, "png": plot(result, png_path)}


def _jsonable(value: Any) -> Any:
    """NaN/inf as strings, so the JSON stays standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
