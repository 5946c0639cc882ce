"""The Python side of tools/gpu_check.sh: the checks of detgrid that need a GPU.

    python3 -m detgrid.kit.gpucheck env            --json env.json
    python3 -m detgrid.kit.gpucheck build-info     --json build.json [--require-cuda]
    python3 -m detgrid.kit.gpucheck bitwise        --device cuda --json bitwise.json
    python3 -m detgrid.kit.gpucheck exact          --device cuda --json exact.json
    python3 -m detgrid.kit.gpucheck routes         --device cuda --json routes.json
    python3 -m detgrid.kit.gpucheck timing         --device cuda --json timing.json
    python3 -m detgrid.kit.gpucheck sanitize       --tool memcheck --set all --json s.json
    python3 -m detgrid.kit.gpucheck sanitizer-case --device cuda --set all
    python3 -m detgrid.kit.gpucheck report         --work DIR --out DIR [--junit X]

The bitwise and sanitizer checks cover both backwards,
grid_sampler_2d_backward and grid_sampler_3d_backward (timing: the 2-D
set; `detgrid bench` times the 3-D rows). `exact` checks the extension's
accumulate="exact" and "exact_atomic" (their bits against each other, over
runs and knobs, and against the host executor's); timing times them too.
Every subcommand also runs with
`--device cpu` (or needs no device at all), so its logic is tested on
machines without a GPU: there "detgrid" is the host executor and "stock"
is aten's CPU kernel.

The functions return plain data (dicts, lists); only main() prints. This
module runs the checks; the cases, workloads, comparisons and timing they
use are detgrid.bench.workloads (which a benchmark command reuses), the report
is detgrid.kit.gpucheck_report.

The file also runs as a script (`python3 tools/detgrid/kit/gpucheck.py ...`),
which the shell script uses: then `env` and `report` work even when the
extension did not build, since detgrid's ops are imported only by the
subcommands that call them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import hashlib
import importlib.util
import itertools
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script: import detgrid from the tools/ folder above this file,
    # not its modules as top-level ones. detgrid/__init__.py imports the
    # extension, so the package is registered without running it: its
    # modules (detgrid.kit's, detgrid.bench's) import as usual, and
    # detgrid.ops (with the extension) only where a subcommand calls it.
    _here = os.path.dirname(os.path.abspath(__file__))
    _package = os.path.dirname(_here)
    if sys.path and os.path.abspath(sys.path[0]) == _here:
        sys.path[0] = os.path.dirname(_package)
    _spec = importlib.util.spec_from_file_location(
        "detgrid", os.path.join(_package, "__init__.py"), submodule_search_locations=[_package])
    sys.modules["detgrid"] = importlib.util.module_from_spec(_spec)

import torch

from detgrid import levels
from detgrid.kit.bitwise import same_bits_or_both_nan
from detgrid.kit.gpucheck_report import jsonable, markdown_report, write_report
from detgrid.bench.stock_limits import SKIP_REASON, stock_cpu_workload_is_reliable
from detgrid.bench.workloads import (BENCH_WORKLOADS, DIMS, DTYPES, MODES, PADDINGS, WORKLOADS,
                                     Case, Gradients,
                                     Workload, dtype_name, executor_cases, max_abs_diff,
                                     peak_bytes, run_detgrid, run_stock, sanitizer_cases, sha256,
                                     synchronize, time_rotating, time_workload)

# dtypes whose device result must equal the host executor's bit for bit.
EXACT_DTYPES = ("float32", "float64")

# The cases whose 100 repeats are hashed, both gradients asked for, each a
# benchmark workload at a scale relative to --scale: extreme collisions in
# 2-D (TensoRF line, 3333 points per cell) and in 3-D (SimpleBEV's lift at
# 0.75: 540,000 points, ~43 per voxel, three chunks of the default size; at
# full size its 40 MB of gradients per run would make hashing the step's
# main cost).
REPEAT_WORKLOADS = (("tensorf_line", 1.0), ("simplebev_lift_3d", 0.75))


# --------------------------------------------------------------------------
# Bitwise checks
# --------------------------------------------------------------------------


def repeat_hashes(fn: Callable[[], Gradients], reps: int, device: str) -> Dict[str, Any]:
    """Runs fn reps times; distinct SHA-256 hashes of each gradient."""
    hashes: Tuple[set, set] = (set(), set())
    first: List[Optional[str]] = [None, None]
    for _ in range(reps):
        grads = fn()
        synchronize(device)
        for i, t in enumerate(grads):
            h = sha256(t)
            if h is not None:
                hashes[i].add(h)
                first[i] = first[i] or h
    return {
        "reps": reps,
        "grad_input_distinct": len(hashes[0]) if first[0] else None,
        "grad_grid_distinct": len(hashes[1]) if first[1] else None,
        "grad_input_sha256": first[0],
        "grad_grid_sha256": first[1],
    }


# Knobs that must not move a bit on either device: the keying (one sort key
# per tap instead of per point) and the dense reduce's thread order.
PIPELINE_KNOBS = [{"keying": 1}, {"gather": 1}, {"gather": 2}, {"keying": 1, "gather": 2}]


def knob_settings(device: str) -> List[Dict[str, int]]:
    if torch.device(device).type == "cuda":
        return [{}, {"chunk_points": 4096}, {"block_size": 128}, {"block_size": 512},
                {"block_size": 64, "max_blocks": 7}, {"chunk_points": 8192, "max_blocks": 2},
                *PIPELINE_KNOBS]
    return [{}, {"chunk_points": 4096}, {"grain_size": 1}, {"grain_size": 100000},
            *PIPELINE_KNOBS]


# Put into grad_output by with_non_finite_grad_output: NaN, and +-Inf that
# meet zero weights and each other in the sums, so that grad_input and
# grad_grid hold NaNs made by arithmetic, whose bits differ between the GPU
# and the host (detgrid.kit.bitwise).
NON_FINITE_GRAD_OUTPUT = (math.nan, math.inf, -math.inf)


def with_non_finite_grad_output(case: Case) -> Case:
    """A copy of the case whose grad_output starts, in every (n, c) plane,
    with NON_FINITE_GRAD_OUTPUT (rotated by channel, so one point meets +Inf
    in one channel and -Inf in another)."""
    grad = case.grad_output.clone()
    planes = grad.reshape(grad.shape[0], grad.shape[1], -1)
    values = torch.tensor(NON_FINITE_GRAD_OUTPUT, dtype=grad.dtype)
    for c in range(grad.shape[1]):
        planes[:, c, :len(values)] = values.roll(c)[:planes.shape[-1]]
    return dataclasses.replace(case, name=case.name + "_non_finite_grad_output",
                               grad_output=planes.reshape(grad.shape))


def executor_row_cases(dtype: str, dim: int, seed: int = 0) -> List[Case]:
    """executor_cases, and their zoom-in cases again with a non-finite
    grad_output."""
    cases = executor_cases(DTYPES[dtype], seed, dim)
    return cases + [with_non_finite_grad_output(c) for c in cases if c.name.endswith("_zoom")]


def executor_match(device: str, dtypes: Sequence[str], seed: int = 0) -> List[Dict[str, Any]]:
    """The device backward against the host executor, bit for bit (NaN
    payloads aside: detgrid.kit.bitwise): one row per dtype and spatial dims
    (2-D, 3-D).

    On --device cpu the "device" run is the executor with grain_size=1 (as
    many threads as it will take), the reference its default.
    """
    return [executor_row(device, name, dim, executor_row_cases(name, dim, seed))
            for name in dtypes for dim in DIMS]


def executor_row(device: str, dtype: str, dim: int, cases: Sequence[Case]) -> Dict[str, Any]:
    equal, worst, mismatches, errors = 0, 0.0, [], []
    for case in cases:
        try:
            ref = run_detgrid(case)
            if torch.device(device).type == "cpu":
                got = run_detgrid(case, grain_size=1)
            else:
                got = run_detgrid(case.to(device))
                synchronize(device)
        except Exception as e:  # recorded, the other cases still run
            errors.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        same = all(same_bits_or_both_nan(g, r) for g, r in zip(got, ref))
        equal += same
        worst = max(worst, *(max_abs_diff(g, r) for g, r in zip(got, ref)))
        if not same:
            mismatches.append(case.name)
    return {
        "dtype": dtype,
        "dim": dim,
        "cases": len(cases),
        "bitwise_equal": equal,
        "max_abs_diff": worst,
        "must_be_equal": dtype in EXACT_DTYPES,
        "mismatches": mismatches[:10],
        "errors": errors[:10],
    }


# --------------------------------------------------------------------------
# The core (aten_kernels/aten/, issue 59): CUDA build against host build
# --------------------------------------------------------------------------


def core_grad_input(case: Case, level: str = levels.CORE) -> torch.Tensor:
    """The grad_input of the core's build ``level`` (detgrid.levels.CORE_BUILDS) for the
    case, on the case's device (the host build on CPU, the nvcc build on CUDA)."""
    return torch.ops.detgrid._core_grad_input(
        case.grad_output, case.input, case.grid, case.interpolation_mode,
        case.padding_mode, case.align_corners, level=level)


def _compare_cases(cases: Sequence[Case],
                   pair: Callable[[Case], Optional[Tuple[torch.Tensor, torch.Tensor]]]
                   ) -> Dict[str, Any]:
    """pair(case) -> (got, reference), or None for a case it skips, over the cases: how many
    ran, how many are the same bits (NaNs alike), the largest difference, the first
    mismatches and errors (an error is recorded and the other cases still run)."""
    equal, worst, mismatches, errors, ran = 0, 0.0, [], [], 0
    for case in cases:
        try:
            pair_ = pair(case)
        except Exception as e:
            errors.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if pair_ is None:
            continue
        got, ref = pair_
        ran += 1
        same = same_bits_or_both_nan(got, ref)
        equal += same
        worst = max(worst, max_abs_diff(got, ref))
        if not same:
            mismatches.append(case.name)
    return {"cases": ran, "bitwise_equal": equal, "max_abs_diff": worst,
            "mismatches": mismatches[:10], "errors": errors[:10]}


def core_row(device: str, dtype: str, dim: int, cases: Sequence[Case]) -> Dict[str, Any]:
    """The core on the device against its host build, per case: "host
    == CUDA bit for bit" is a measurement here, not a requirement, since
    both builds contract multiply-adds into FMAs where their compilers
    choose (on --device cpu the "device" run is the host build with a
    shuffled launch, block size 64)."""
    def pair(case: Case) -> Tuple[torch.Tensor, torch.Tensor]:
        ref = core_grad_input(case)
        if torch.device(device).type == "cpu":
            got = torch.ops.detgrid._core_grad_input(
                case.grad_output, case.input, case.grid, case.interpolation_mode,
                case.padding_mode, case.align_corners, 64, 0, 7)
        else:
            got = core_grad_input(case.to(device))
            synchronize(device)
        return got, ref

    return {"dtype": dtype, "dim": dim, **_compare_cases(cases, pair)}


def level_row(device: str, level: str, dtype: str, dim: int,
              cases: Sequence[Case]) -> Dict[str, Any]:
    """A speed level of the core against the core, both on the device: a level changes no
    bit, so here equality is required (the host builds show it on the CPU; nvcc's choices of
    FMA contraction in the level's loops are what this row measures)."""
    def pair(case: Case) -> Tuple[torch.Tensor, torch.Tensor]:
        on_device = case.to(device)
        core = core_grad_input(on_device)
        got = core_grad_input(on_device, level)
        synchronize(device)
        return got, core

    return {"level": level, "dtype": dtype, "dim": dim, **_compare_cases(cases, pair)}


def levels_match(device: str, dtypes: Sequence[str], seed: int = 0) -> List[Dict[str, Any]]:
    """level_row per speed level, dtype and spatial dims, on the executor's cases."""
    return [level_row(device, level, name, dim, executor_row_cases(name, dim, seed))
            for level in levels.CORE_BUILDS[1:] for name in dtypes for dim in DIMS]


def core_match(device: str, dtypes: Sequence[str], seed: int = 0) -> List[Dict[str, Any]]:
    """core_row per dtype and spatial dims, on the executor's cases."""
    return [core_row(device, name, dim, executor_row_cases(name, dim, seed))
            for name in dtypes for dim in DIMS]


def _guarded(fn: Callable[[], Any]) -> Any:
    """fn(), or {"error": ...}: one failing part leaves the others' results."""
    try:
        return fn()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def knob_invariance(case: Case, device: str) -> Dict[str, Any]:
    settings = knob_settings(device)
    hashes = []
    for opts in settings:
        gi, gg = run_detgrid(case, **opts)
        synchronize(device)
        hashes.append((sha256(gi), sha256(gg)))
    return {"settings": settings, "distinct": len(set(hashes))}


def repeat_cases(device: str, scale: float = 1.0, seed: int = 0) -> List[Case]:
    """REPEAT_WORKLOADS' cases at scale times their own, both gradients."""
    return [BENCH_WORKLOADS[name].build(device, seed, scale * relative, output_mask=(True, True))
            for name, relative in REPEAT_WORKLOADS]


def repeat_row(case: Case, reps: int, device: str) -> Dict[str, Any]:
    return {
        "case": case.name,
        "dim": case.dim,
        "input_shape": list(case.input.shape),
        "grid_shape": list(case.grid.shape),
        "detgrid": _guarded(lambda: repeat_hashes(lambda: run_detgrid(case), reps, device)),
        "stock": _guarded(lambda: repeat_hashes(lambda: run_stock(case), reps, device)),
    }


def run_bitwise(device: str = "cuda", reps: int = 100, scale: float = 1.0, seed: int = 0,
                dtypes: Sequence[str] = tuple(DTYPES)) -> Dict[str, Any]:
    """Per high-collision case (2-D, 3-D): repeat hashes (detgrid and
    stock) and knob invariance; then device vs host executor per dtype and
    spatial dims; then detgrid against stock in half and bfloat16
    (fidelity to stock's forward)."""
    cases = repeat_cases(device, scale, seed)
    return {
        "device": device,
        "repeat": [repeat_row(case, reps, device) for case in cases],
        "knobs": [{"case": case.name, "dim": case.dim,
                   **_guarded(lambda: knob_invariance(case, device))} for case in cases],
        "executor": executor_match(device, dtypes, seed),
        "core": core_match(device, dtypes, seed),
        "core_levels": levels_match(device, dtypes, seed),
        "core_repeat": [
            {"case": case.name, "dim": case.dim,
             **_guarded(lambda: repeat_hashes(
                 lambda: (core_grad_input(case), None), reps, device))}
            for case in cases],
        "fidelity": [fidelity_row(device, name, dim, seed)
                     for name in FIDELITY_DTYPES for dim in DIMS],
    }


# --------------------------------------------------------------------------
# Fidelity to stock's forward in half and bfloat16
# --------------------------------------------------------------------------

# Half and bfloat16 taps and weights are scalar_t arithmetic in stock's CUDA
# kernels; detgrid reproduces them. Against stock's CUDA backward, with
# grad_output = 1 and about one point per four pixels, grad_input holds each
# pixel's sum of a few weights: stock's 16-bit atomics round each addition
# (a few ulps, below 2^-8 here), while a tap moved by a pixel moves a whole
# weight (nearest: 1; bilinear: at least 1/4 at one of a point's taps;
# bicubic: its largest coefficient) to another pixel, far beyond the
# tolerance. On --device cpu "stock" is aten's CPU kernel, which rounds
# after every operation: a different function, so the row is informative
# only there.
FIDELITY_DTYPES = ("float16", "bfloat16")
FIDELITY_ATOL = 2.0 ** -6
FIDELITY_RTOL = 2.0 ** -7


def fidelity_cases(dtype: torch.dtype, dim: int, seed: int = 0) -> List[Case]:
    """Every mode x padding x align_corners of one rank: one channel, a wide
    input (past half's and bfloat16's consecutive integers), a uniform grid
    over [-1.1, 1.1], grad_output = 1."""
    g = torch.Generator().manual_seed(seed)
    shape, grid_size = ((1, 1, 16, 1024), (16, 64)) if dim == 2 else (
        (1, 1, 4, 8, 520), (4, 8, 32))
    cases = []
    for mode, padding, align in itertools.product(MODES, PADDINGS, (False, True)):
        grid = (torch.rand(1, *grid_size, dim, generator=g) * 2 - 1) * 1.1
        cases.append(Case(
            name=f"fidelity_{dim}d_{mode}_{padding}_align{int(align)}_{dtype_name(dtype)}",
            grad_output=torch.ones(1, 1, *grid_size, dtype=dtype),
            input=torch.randn(*shape, generator=g).to(dtype),
            grid=grid.to(dtype),
            interpolation_mode=MODES[mode],
            padding_mode=PADDINGS[padding],
            align_corners=align,
            output_mask=(True, True)))
    return cases


def fidelity_mismatches(ours: torch.Tensor, stock: torch.Tensor) -> int:
    """Elements of grad_input farther from stock's than rounding explains."""
    ours, stock = ours.double().cpu(), stock.double().cpu()
    return int(((ours - stock).abs() > FIDELITY_ATOL + FIDELITY_RTOL * stock.abs()).sum())


def fidelity_row(device: str, dtype: str, dim: int, seed: int = 0) -> Dict[str, Any]:
    """detgrid's grad_input against stock's backward on the device, per case."""
    cases, failing, errors, worst = 0, [], [], 0.0
    for case in fidelity_cases(DTYPES[dtype], dim, seed):
        try:
            moved = case.to(device)
            ours, stock = run_detgrid(moved)[0], run_stock(moved)[0]
            synchronize(device)
        except Exception as e:  # 3-D bicubic before torch 2.15, for one
            errors.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        cases += 1
        worst = max(worst, max_abs_diff(ours, stock))
        if fidelity_mismatches(ours, stock):
            failing.append(case.name)
    return {"dtype": dtype, "dim": dim, "device": device, "cases": cases,
            "failing": failing, "max_abs_diff": worst, "errors": errors[:10]}


# --------------------------------------------------------------------------
# accumulate="exact": the two variants against each other and the host
# --------------------------------------------------------------------------

# detgrid.ops.ACCUMULATE_MODES' exact variants: the sorted reduce and the
# integer atomics with no sort. Integer sums are order-free, so both must
# give the same bits under every knob and on every run, and the host
# executor's "exact" the same grad_input bits, in all four dtypes (the sum is
# rounded once, straight to the dtype, by the same code on both sides).
EXACT_VARIANTS = ("exact", "exact_atomic")


def exact_knob_settings(device: str) -> List[Dict[str, int]]:
    """Settings each exact variant runs under: chunks (the slices carry sums
    across them), the keying (per tap; bilinear is keyed per point or cell
    by default), the index width (the keys are 32-bit: the only width the
    exact accumulation is built for), and the launch or thread shapes."""
    common = [{}, {"chunk_points": 4096}, {"keying": 1}, {"index_bits": 64}]
    if torch.device(device).type == "cuda":
        return common + [{"block_size": 128}, {"block_size": 64, "max_blocks": 7}]
    return common + [{"grain_size": 1}]


def _digest(grads: Gradients) -> Optional[str]:
    """One hash over the gradients that were asked for."""
    return sha256(*(t for t in grads if t is not None))


def exact_runs(case: Case, device: str) -> Iterator[Gradients]:
    """The case on device under every exact variant x knob setting (on
    --device cpu: the host executor under the host's knobs), one at a time."""
    moved = case.to(device)
    for variant, opts in itertools.product(EXACT_VARIANTS, exact_knob_settings(device)):
        grads = run_detgrid(moved, accumulate=variant, **opts)
        synchronize(device)
        yield grads


def exact_case(case: Case, device: str) -> Tuple[bool, bool]:
    """(do all of exact_runs hash the same, both gradients; is each one's
    grad_input the host executor's "exact" one, bit for bit)."""
    reference = run_detgrid(case, accumulate="exact")[0]
    digests, host_equal = set(), True
    for grads in exact_runs(case, device):
        digests.add(_digest(grads))
        host_equal = host_equal and same_bits_or_both_nan(grads[0], reference)
    return len(digests) == 1, host_equal


def exact_executor_row(device: str, dtype: str, dim: int,
                       cases: Sequence[Case]) -> Dict[str, Any]:
    """exact_case over one dtype's and rank's executor cases. grad_grid is
    the ordered path's point pass, which the executor rows compare with the
    host; here it only has to agree between runs."""
    agree, host_equal, disagreeing, mismatches, errors = 0, 0, [], [], []
    for case in cases:
        try:
            same, as_host = exact_case(case, device)
        except Exception as e:  # recorded, the other cases still run
            errors.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        agree += same
        host_equal += as_host
        if not same:
            disagreeing.append(case.name)
        if not as_host:
            mismatches.append(case.name)
    return {
        "dtype": dtype,
        "dim": dim,
        "cases": len(cases),
        "runs_per_case": len(EXACT_VARIANTS) * len(exact_knob_settings(device)),
        "variants_agree": agree,
        "host_equal": host_equal,
        "disagreeing": disagreeing[:10],
        "mismatches": mismatches[:10],
        "errors": errors[:10],
    }


def exact_repeat_row(case: Case, reps: int, device: str) -> Dict[str, Any]:
    """A high-collision case (3-D: over three chunks): each variant reps
    times (the atomics' order changes from run to run), then once per knob
    setting; every run must hash the same, and grad_input equal the host
    executor's "exact"."""
    digests: Dict[str, set] = {}
    for variant in EXACT_VARIANTS:
        digests[variant] = set()
        for _ in range(reps):
            grads = run_detgrid(case, accumulate=variant)
            synchronize(device)
            digests[variant].add(_digest(grads))
    knob_runs = exact_runs(case, device)
    first = next(knob_runs)  # "exact" with the default knobs
    digests["knobs"] = {_digest(first)} | {_digest(grads) for grads in knob_runs}
    host = run_detgrid(case.to("cpu"), accumulate="exact")[0]
    return {
        "reps": reps,
        "runs": len(EXACT_VARIANTS) * (reps + len(exact_knob_settings(device))),
        "distinct": len(set().union(*digests.values())),
        "distinct_by_group": {name: len(found) for name, found in digests.items()},
        "host_equal": same_bits_or_both_nan(first[0], host),
    }


def run_exact(device: str = "cuda", reps: int = 10, scale: float = 1.0, seed: int = 0,
              dtypes: Sequence[str] = tuple(DTYPES)) -> Dict[str, Any]:
    """accumulate="exact" and "exact_atomic": on the high-collision cases
    (2-D, 3-D), repeat runs and knobs; then per dtype and spatial dims, the
    executor cases under every variant and knob against the host."""
    return {
        "device": device,
        "variants": list(EXACT_VARIANTS),
        "settings": exact_knob_settings(device),
        "repeat": [{"case": case.name, "dim": case.dim,
                    **_guarded(lambda: exact_repeat_row(case, reps, device))}
                   for case in repeat_cases(device, scale, seed)],
        "executor": [exact_executor_row(device, name, dim, executor_row_cases(name, dim, seed))
                     for name in dtypes for dim in DIMS],
    }


# --------------------------------------------------------------------------
# Routes under detgrid.enable()
# --------------------------------------------------------------------------

# Calls for grad_grid alone: stock's CUDA kernel alerts on them in
# deterministic mode, so under enable() they take detgrid's grid-gradient
# pass, which must neither raise nor move grad_grid's bits from stock's
# (but for an FMA stock's fp32 build may fuse: mismatches are counted).
GRID_ONLY_WORKLOADS = ("stn_mnist", "monodepth2_grid_only")
GRID_SAMPLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _compare_grid_gradients(name: str, ours: torch.Tensor, stock: torch.Tensor) -> Dict[str, Any]:
    from detgrid.kit.bitwise import differing_elements

    differ = differing_elements(ours, stock)
    return {"name": name, "dtype": dtype_name(ours.dtype),
            "bitwise_equal": not bool(differ.any()), "mismatches": int(differ.sum()),
            "max_abs_diff": max_abs_diff(ours, stock)}


def _deterministic_and_not(call: Callable[[], torch.Tensor], name: str) -> Dict[str, Any]:
    """call() in deterministic mode (detgrid's route) against call() outside
    it (stock's), or the error the deterministic call raised."""
    from detgrid.bench.workloads import deterministic_algorithms

    with deterministic_algorithms(False):
        stock = call()
    try:
        with deterministic_algorithms(True):
            ours = call()
    except RuntimeError as e:
        return {"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    return _compare_grid_gradients(name, ours, stock)


def _grid_sample_grid_grad(inp: torch.Tensor, grid: torch.Tensor, mode: str) -> torch.Tensor:
    """grid.grad of sum(F.grid_sample(...) * weights), only the grid requiring grad."""
    grid = grid.detach().requires_grad_(True)
    out = torch.nn.functional.grid_sample(inp, grid, mode=mode, align_corners=False)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out).to(out.dtype)
    (out * weights).sum().backward()
    return grid.grad


def grid_only_rows(device: str, seed: int = 0) -> List[Dict[str, Any]]:
    """Grid-only backward calls under enable(), deterministic mode against
    not: the bench's grid-only workloads through aten's operator, and
    F.grid_sample with only the grid requiring grad, per dtype."""
    from detgrid.switch import enabled

    rows = []
    with enabled(torch.device(device).type):
        for name in GRID_ONLY_WORKLOADS:
            case = BENCH_WORKLOADS[name].build(device, seed, 1.0)
            op = getattr(torch.ops.aten, case.op)
            rows.append(_deterministic_and_not(lambda: op(*case.args())[1], name))
        g = torch.Generator().manual_seed(seed)
        for dims, mode, dtype in ([(2, m, d) for m in ("bilinear", "bicubic")
                                   for d in GRID_SAMPLE_DTYPES] + [(3, "bilinear", torch.float32)]):
            spatial = (6, 20, 24)[3 - dims:]
            inp = torch.randn(2, 3, *spatial, generator=g).to(device=device, dtype=dtype)
            grid = (torch.rand(2, *(s - 1 for s in spatial), dims, generator=g) * 2.2 - 1.1).to(
                device=device, dtype=dtype)
            rows.append(_deterministic_and_not(
                lambda: _grid_sample_grid_grad(inp, grid, mode),
                f"F.grid_sample {dims}-D {mode} grid only"))
    return rows


def cross_device_rows(device: str, seed: int = 0) -> List[Dict[str, Any]]:
    """Tensors on cuda:1 while cuda:0 is current, under enable(), in and out
    of deterministic mode: the overrides must run stock's kernels and
    cuDNN on the tensors' device (stock alone is the reference)."""
    from detgrid.bench.workloads import deterministic_algorithms
    from detgrid.switch import enabled

    if torch.device(device).type != "cuda" or torch.cuda.device_count() < 2:
        return [{"name": "cross-device", "skipped": "needs two GPUs"}]
    rows = []
    g = torch.Generator().manual_seed(seed)
    inp = torch.randn(2, 3, 20, 24, generator=g).to("cuda:1")
    grid = (torch.rand(2, 16, 16, 2, generator=g) * 2 - 1).to("cuda:1")
    torch.cuda.set_device(0)
    for align_corners in (False, True):  # True takes cuDNN outside deterministic mode
        def grads() -> Tuple[torch.Tensor, torch.Tensor]:
            x, gr = inp.clone().requires_grad_(True), grid.clone().requires_grad_(True)
            torch.nn.functional.grid_sample(x, gr, align_corners=align_corners).sum().backward()
            return x.grad, gr.grad
        stock = grads()
        name = f"cross-device align_corners={align_corners}"
        try:
            with enabled("cuda"):
                with deterministic_algorithms(False):
                    routed_stock = grads()
                with deterministic_algorithms(True):
                    ours = grads()
        except RuntimeError as e:
            rows.append({"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        rows.append({"name": name, "stock_route_equal": all(
            same_bits_or_both_nan(a, b) for a, b in zip(routed_stock, stock)),
            "deterministic_max_abs_diff": max(max_abs_diff(a, b) for a, b in zip(ours, stock))})
    return rows


def run_routes(device: str = "cuda", seed: int = 0) -> Dict[str, Any]:
    return {"device": device, "grid_only": grid_only_rows(device, seed),
            "cross_device": cross_device_rows(device, seed)}


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def run_timing(device: str = "cuda", names: Optional[Iterable[str]] = None, warmup: int = 5,
               reps: int = 25, scale: float = 1.0, seed: int = 0,
               deadline: Optional[float] = None, exact_reps: int = 5) -> Dict[str, Any]:
    """time_workload over workloads; stops starting new ones after deadline
    (time.monotonic()), so a slow device still leaves a partial table. Then,
    in what is left before the deadline, the exact variants of each timed
    row (exact_timing), so they cannot crowd out the stock/ordered table."""
    rows = []
    for name in names or WORKLOADS:
        if deadline is not None and time.monotonic() > deadline:
            rows.append({"name": name, "skipped": "time budget"})
            continue
        if (torch.device(device).type == "cpu"
                and not stock_cpu_workload_is_reliable(WORKLOADS[name], scale)):
            rows.append({"name": name, "skipped": SKIP_REASON})
            continue
        try:
            rows.append(time_workload(WORKLOADS[name], device, warmup, reps, scale, seed))
        except Exception as e:
            rows.append({"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    for row in rows:
        if "detgrid_ms" in row:
            row["exact"] = exact_timing(WORKLOADS[row["name"]], device, min(warmup, 2),
                                        exact_reps, scale, seed, deadline)
    return {"device": device, "scale": scale, "rows": rows}


def time_exact(workload: Workload, device: str = "cuda", warmup: int = 2, reps: int = 5,
               scale: float = 1.0, seed: int = 0) -> Dict[str, Any]:
    """Median ms of the ordered backward and of each exact variant on one
    workload, interleaved rep by rep (the ordered one is the exact ones'
    baseline in the same rotation), and each exact variant's peak memory
    beyond what was allocated before it (CUDA only)."""
    case = workload.build(device, seed, scale)
    variants = ("ordered",) + EXACT_VARIANTS
    times = time_rotating([functools.partial(run_detgrid, accumulate=v) for v in variants],
                          [case], device, warmup, reps)
    result: Dict[str, Any] = {f"{v}_ms": statistics.median(t) for v, t in zip(variants, times)}
    for variant in EXACT_VARIANTS:
        peak = peak_bytes(functools.partial(run_detgrid, case, accumulate=variant), device)
        result[f"{variant}_peak_mib"] = None if peak is None else peak / 2**20
    result["reps"], result["warmup"] = reps, warmup
    return result


def exact_timing(workload: Workload, device: str, warmup: int, reps: int, scale: float,
                 seed: int, deadline: Optional[float]) -> Dict[str, Any]:
    """time_exact, or why not: a grid-only backward sums nothing (every
    variant is the ordered point pass), and none starts past the deadline."""
    if not workload.output_mask[0]:
        return {"skipped": "no grad_input"}
    if deadline is not None and time.monotonic() > deadline:
        return {"skipped": "time budget"}
    result = _guarded(lambda: time_exact(workload, device, warmup, reps, scale, seed))
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------
# Sanitizer
# --------------------------------------------------------------------------

DONE_MARK = "DETGRID_CASES_DONE"
UNAVAILABLE_MARKS = (
    "Device not supported",
    "device not supported",
    "No supported devices",
    "error 999",
    "Unable to find injection library",
    "not supported on this platform",
    "CUDA_ERROR_NOT_SUPPORTED",
)


def run_sanitizer_cases(device: str, set_name: str, seed: int = 0) -> Dict[str, Any]:
    """Runs the cases on device and compares each with the host executor
    (bit for bit for float32/float64, NaN payloads aside)."""
    ran, mismatches = 0, []
    for case in sanitizer_cases(set_name, seed):
        got = run_detgrid(case.to(device))
        # The core's kernels under the same sanitizer (its bits are the
        # bitwise step's to compare).
        core_grad_input(case.to(device))
        synchronize(device)
        ran += 1
        if dtype_name(case.input.dtype) in EXACT_DTYPES:
            ref = run_detgrid(case)
            if not all(same_bits_or_both_nan(g, r) for g, r in zip(got, ref)):
                mismatches.append(case.name)
    return {"cases": ran, "mismatches": mismatches}


def find_sanitizer() -> Optional[str]:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        for rel in ("bin/compute-sanitizer", "compute-sanitizer/compute-sanitizer"):
            path = os.path.join(home, rel)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def parse_sanitizer(tool: str, output: str, returncode: Optional[int]) -> Dict[str, Any]:
    """status: clean | errors | unavailable | case_failed | failed | timeout."""
    result: Dict[str, Any] = {"tool": tool, "returncode": returncode, "errors": None}
    summaries = [int(m) for m in re.findall(r"ERROR SUMMARY:\s*(\d+)\s+error", output)]
    race = re.search(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards? displayed\s*\((\d+)\s+errors?,\s*"
                     r"(\d+)\s+warnings?\)", output)
    if race:
        result["hazards"] = int(race.group(1))
        result["warnings"] = int(race.group(3))
        summaries.append(int(race.group(2)))
    done = re.search(DONE_MARK + r" cases=(\d+) mismatches=(\d+)", output)
    if done:
        result["cases"], result["mismatches"] = int(done.group(1)), int(done.group(2))
    if summaries:
        result["errors"] = max(summaries)
    if returncode is None:
        result["status"] = "timeout"
    elif any(mark in output for mark in UNAVAILABLE_MARKS) and not done:
        result["status"] = "unavailable"
        result["reason"] = next(m for m in UNAVAILABLE_MARKS if m in output)
    elif result["errors"]:
        result["status"] = "errors"
    elif not summaries:
        result["status"] = "failed"
    elif not done or returncode != 0 or result.get("mismatches"):
        result["status"] = "case_failed"
    else:
        result["status"] = "clean"
    return result


def run_sanitizer(tool: str, set_name: str, timeout: float, seed: int = 0) -> Dict[str, Any]:
    """Runs this file's sanitizer-case under compute-sanitizer --tool tool."""
    exe = find_sanitizer()
    if exe is None:
        return {"tool": tool, "status": "unavailable", "reason": "compute-sanitizer not found",
                "errors": None, "output_tail": ""}
    # API errors (a probe of torch's failing by design) are not what this
    # looks for; a failing launch of ours raises in the case program anyway.
    cmd = [exe, "--tool", tool, "--error-exitcode", "86", "--print-limit", "50",
           "--report-api-errors", "no",
           sys.executable, os.path.abspath(__file__), "sanitizer-case", "--device", "cuda",
           "--set", set_name, "--seed", str(seed)]
    env = dict(os.environ)
    # Without the caching allocator every tensor is its own allocation, so
    # memcheck sees an access past its end.
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    tools_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = tools_dir + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.monotonic()

    def attempt(command: List[str]) -> Tuple[str, Optional[int]]:
        left = max(1.0, timeout - (time.monotonic() - t0))
        try:
            proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=env, timeout=left, text=True, errors="replace")
            return proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            return (out.decode(errors="replace") if isinstance(out, bytes) else out), None

    output, rc = attempt(cmd)
    if rc is not None and DONE_MARK not in output and re.search(
            r"(?i)(unrecognized|unknown) (option|argument)|report-api-errors", output):
        # An older tool without --report-api-errors: once more without it.
        i = cmd.index("--report-api-errors")
        cmd = cmd[:i] + cmd[i + 2:]
        output, rc = attempt(cmd)
    result = parse_sanitizer(tool, output, rc)
    result["set"] = set_name
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["command"] = " ".join(cmd[1:cmd.index(sys.executable)])
    result["output_tail"] = "\n".join(output.splitlines()[-40:])
    return result


# Out of its time limit the tool checked nothing: the step exits as
# `timeout` does, so the driver records it as not run (a timeout), not as
# a failure of the kernels.
TIMEOUT_EXIT = 124


def sanitize_exit_status(status: str) -> int:
    if status == "timeout":
        return TIMEOUT_EXIT
    return 1 if status in ("errors", "case_failed", "failed") else 0


# --------------------------------------------------------------------------
# Environment and build facts
# --------------------------------------------------------------------------


def _cmd(args: Sequence[str], timeout: float = 30) -> Optional[str]:
    try:
        proc = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip()


def sources_sha256(root: str) -> str:
    """One hash over the kernel sources and the package, to name what ran."""
    h = hashlib.sha256()
    for top in ("aten_kernels", os.path.join("tools", "detgrid"), "setup.py"):
        path = os.path.join(root, top)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
            if f.endswith((".h", ".cuh", ".cu", ".cpp", ".py")))
        for f in files:
            h.update(os.path.relpath(f, root).encode())
            with open(f, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def env_facts(root: str = ".") -> Dict[str, Any]:
    facts: Dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "kernel_release": platform.release(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "sources_sha256": sources_sha256(root),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    # gVisor reports kernel 4.4.0; Firecracker a real one (compute-sanitizer
    # and ncu work only there).
    facts["runtime_guess"] = "gvisor" if facts["kernel_release"].startswith("4.4.0") else "vm"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update({
            "device_name": p.name,
            "capability": f"{p.major}.{p.minor}",
            "sm_count": p.multi_processor_count,
            "device_memory_gib": round(p.total_memory / 2**30, 1),
            "device_count": torch.cuda.device_count(),
        })
    smi = _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                "clocks.max.sm,temperature.gpu,power.draw,utilization.gpu",
                "--format=csv,noheader"])
    facts["nvidia_smi"] = smi
    nvcc = _cmd(["nvcc", "--version"])
    facts["nvcc"] = nvcc.splitlines()[-1] if nvcc else None
    sanitizer = find_sanitizer()
    version = _cmd([sanitizer, "--version"]) if sanitizer else None
    facts["compute_sanitizer"] = version.splitlines()[-1] if version else None
    return facts


def build_facts(require_cuda: bool) -> Dict[str, Any]:
    """What the extension build produced."""
    facts: Dict[str, Any] = {"require_cuda": require_cuda}
    try:
        from detgrid import ops
        import detgrid._C as ext

        facts["so_path"] = ext.__file__
        facts["has_cuda_kernels"] = ops.has_cuda_kernels()
    except Exception as e:
        facts["import_error"] = f"{type(e).__name__}: {str(e)[:500]}"
        facts["has_cuda_kernels"] = False
        facts["ok"] = False
        return facts
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump and facts["has_cuda_kernels"]:
        listing = _cmd([cuobjdump, "--list-elf", facts["so_path"]]) or ""
        facts["sass_archs"] = sorted(set(re.findall(r"sm_\d+a?", listing)))
    facts["ok"] = bool(facts["has_cuda_kernels"]) or not require_cuda
    return facts


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _write_json(path: Optional[str], data: Any) -> None:
    text = json.dumps(jsonable(data), indent=1, default=str, allow_nan=False)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text if len(text) < 6000 else text[:6000] + "\n...")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="detgrid.kit.gpucheck", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, device=True):
        sp.add_argument("--json", help="write the result here")
        sp.add_argument("--seed", type=int, default=0)
        if device:
            sp.add_argument("--device", default="cuda", choices=("cuda", "cpu"))

    sp = sub.add_parser("env"); common(sp, device=False)
    sp.add_argument("--root", default=".")
    sp = sub.add_parser("build-info"); common(sp, device=False)
    sp.add_argument("--require-cuda", action="store_true")
    sp = sub.add_parser("bitwise"); common(sp)
    sp.add_argument("--reps", type=int, default=100)
    sp.add_argument("--scale", type=float, default=1.0)
    sp.add_argument("--dtypes", default=",".join(DTYPES))
    sp = sub.add_parser("exact"); common(sp)
    sp.add_argument("--reps", type=int, default=10)
    sp.add_argument("--scale", type=float, default=1.0)
    sp.add_argument("--dtypes", default=",".join(DTYPES))
    sub.add_parser("routes", help="grid-only calls and cross-device calls under enable()")
    common(sub.choices["routes"])
    sp = sub.add_parser("timing"); common(sp)
    sp.add_argument("--warmup", type=int, default=5)
    sp.add_argument("--reps", type=int, default=25)
    sp.add_argument("--scale", type=float, default=1.0)
    sp.add_argument("--workloads", default=",".join(WORKLOADS))
    sp.add_argument("--budget-s", type=float, default=None,
                    help="start no workload after this many seconds")
    sp.add_argument("--exact-reps", type=int, default=5,
                    help="reps of the exact variants' timing (after the table's)")
    sp = sub.add_parser("sanitizer-case"); common(sp)
    sp.add_argument("--set", default="all", choices=("all", "tiny"))
    sp = sub.add_parser("sanitize"); common(sp, device=False)
    sp.add_argument("--tool", default="memcheck",
                    choices=("memcheck", "racecheck", "initcheck", "synccheck"))
    sp.add_argument("--set", default="all", choices=("all", "tiny"))
    sp.add_argument("--timeout", type=float, default=120.0)
    sp = sub.add_parser("report")
    sp.add_argument("--work", required=True)
    sp.add_argument("--out", required=True)
    sp.add_argument("--junit")
    args = p.parse_args(argv)

    if args.cmd == "env":
        _write_json(args.json, env_facts(args.root))
        return 0
    if args.cmd == "build-info":
        facts = build_facts(args.require_cuda)
        _write_json(args.json, facts)
        if not facts["ok"]:
            print("detgrid GPU check: the extension has NO CUDA KERNELS (or did not import)",
                  file=sys.stderr)
        return 0 if facts["ok"] else 1
    if args.cmd == "bitwise":
        result = run_bitwise(args.device, args.reps, args.scale, args.seed,
                             [d for d in args.dtypes.split(",") if d])
        _write_json(args.json, result)
        return 0
    if args.cmd == "exact":
        result = run_exact(args.device, args.reps, args.scale, args.seed,
                           [d for d in args.dtypes.split(",") if d])
        _write_json(args.json, result)
        return 0
    if args.cmd == "routes":
        _write_json(args.json, run_routes(args.device, args.seed))
        return 0
    if args.cmd == "timing":
        deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
        result = run_timing(args.device, [w for w in args.workloads.split(",") if w],
                            args.warmup, args.reps, args.scale, args.seed, deadline,
                            args.exact_reps)
        _write_json(args.json, result)
        return 0
    if args.cmd == "sanitizer-case":
        result = run_sanitizer_cases(args.device, args.set, args.seed)
        print(f"{DONE_MARK} cases={result['cases']} mismatches={len(result['mismatches'])}")
        if result["mismatches"]:
            print("mismatches with the host executor: " + ", ".join(result["mismatches"]))
        return 1 if result["mismatches"] else 0
    if args.cmd == "sanitize":
        result = run_sanitizer(args.tool, args.set, args.timeout, args.seed)
        print(result.pop("output_tail"))
        _write_json(args.json, result)
        return sanitize_exit_status(result["status"])
    if args.cmd == "report":
        data = write_report(args.work, args.out, args.junit)
        print(markdown_report(data))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
