"""The Python side of tools/gpu_check.sh: the checks of detgrid that need a GPU.

    python3 -m detgrid.kit.gpucheck env            --json env.json
    python3 -m detgrid.kit.gpucheck build-info     --json build.json [--require-cuda]
    python3 -m detgrid.kit.gpucheck bitwise        --device cuda --json bitwise.json
    python3 -m detgrid.kit.gpucheck routes         --device cuda --json routes.json
    python3 -m detgrid.kit.gpucheck timing         --device cuda --json timing.json
    python3 -m detgrid.kit.gpucheck sanitize       --tool memcheck --set all --json s.json
    python3 -m detgrid.kit.gpucheck sanitizer-case --device cuda --set all
    python3 -m detgrid.kit.gpucheck report         --work DIR --out DIR [--junit X]

detgrid's deterministic backward is the upstream core's grad_input
(aten_kernels/aten/), built at the whole stack of its speed levels
(detgrid.levels.TOP), and the grid gradient's grad_grid
(aten_kernels/extension/GridGradient.cu). Every build of the core
(detgrid.levels.CORE_BUILDS) gives the same bits, and its host build gives
the CUDA build's: the CPU tests' proof holds on the GPU only if this check
finds those bits there. `bitwise` decides that (the key verdict): each
build's CUDA grad_input against its host build's, on small cases of every
dtype and rank and on the golden corpus (tests/golden/core.py); the default
backward's grad_input and grad_grid against the host's; runs repeated on two
high-collision cases; and agreement with stock's atomic backward within
tolerance. `timing` times stock against each build on the benchmark rows
(detgrid.bench.workloads.BENCH_WORKLOADS, the rows `detgrid bench` times).
Both backwards are covered, grid_sampler_2d_backward and
grid_sampler_3d_backward.

Every subcommand also runs with `--device cpu` (or needs no device at all),
so its logic is tested on machines without a GPU: there the "device" run is
the host build with launches of another shape (HOST_STAND_IN_LAUNCH) and
"stock" is aten's CPU kernel.

The functions return plain data (dicts, lists); only main() prints. This
module runs the checks; the cases, workloads, comparisons and timing loop
they use are detgrid.bench.workloads (which a benchmark command reuses), the
report is detgrid.kit.gpucheck_report.

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
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

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
                                     Case, Gradients, Workload, dtype_name, host_match_cases,
                                     max_abs_diff, peak_bytes, rel_err, run_detgrid, run_stock,
                                     sanitizer_cases, sha256, synchronize, time_rotating)

# The repository: tests/golden (the golden corpus) is found from here.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

# The builds of the core other than the default backward's (levels.TOP), which
# the default operator runs: each is run through the _with_options operator.
OTHER_BUILDS = tuple(level for level in levels.CORE_BUILDS if level != levels.TOP)

# The cases whose 100 repeats are compared, both gradients asked for, each a
# benchmark workload at a scale relative to --scale: extreme collisions in
# 2-D (TensoRF line, 3333 points per cell) and in 3-D (SimpleBEV's lift at
# 0.75: 540,000 points, ~43 per voxel, 4.3 million records, nine of the
# core's chunks of 2^19 records).
REPEAT_WORKLOADS = (("tensorf_line", 1.0), ("simplebev_lift_3d", 0.75))

# On --device cpu the "device" run of a build is its host build with blocks of
# 64 threads, the grid the blocks need, and block and thread orders shuffled
# (seed 7): another launch shape than the reference's, which must move no bit.
HOST_STAND_IN_LAUNCH = (64, 0, 7)


def _ops():
    """detgrid.ops, imported where a check first needs it: it loads the extension
    (torch.ops.detgrid)."""
    from detgrid import ops

    return ops


def _guarded(fn: Callable[[], Any]) -> Any:
    """fn(), or {"error": ...}: one failing part leaves the others' results."""
    try:
        return fn()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


# --------------------------------------------------------------------------
# Run-to-run determinism
# --------------------------------------------------------------------------

_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_raw_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every bit alike, NaN payloads too (two runs on one device must not differ
    at all), compared where the tensors are (on the GPU, no copy to the host)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = _SAME_SIZE_INT[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def repeat_hashes(fn: Callable[[], Gradients], reps: int, device: str) -> Dict[str, Any]:
    """Runs fn reps times: per gradient, the SHA-256 of the first run's and how
    many distinct results the runs gave (each run is compared with the first on
    the device; a differing one is hashed)."""
    first: List[Optional[torch.Tensor]] = [None, None]
    hashes: Tuple[set, set] = (set(), set())
    for _ in range(reps):
        grads = fn()
        synchronize(device)
        for i, t in enumerate(grads):
            if t is None:
                continue
            if first[i] is None:
                first[i] = t
                hashes[i].add(sha256(t))
            elif not _same_raw_bits(t, first[i]):
                hashes[i].add(sha256(t))
    heads = [None if t is None else sha256(t) for t in first]
    return {
        "reps": reps,
        "grad_input_distinct": len(hashes[0]) if first[0] is not None else None,
        "grad_grid_distinct": len(hashes[1]) if first[1] is not None else None,
        "grad_input_sha256": heads[0],
        "grad_grid_sha256": heads[1],
    }


def repeat_cases(device: str, scale: float = 1.0, seed: int = 0) -> List[Case]:
    """REPEAT_WORKLOADS' cases at scale times their own, both gradients."""
    return [BENCH_WORKLOADS[name].build(device, seed, scale * relative, output_mask=(True, True))
            for name, relative in REPEAT_WORKLOADS]


def repeat_row(case: Case, reps: int, device: str) -> Dict[str, Any]:
    """reps runs of the case by the default backward, by each build of the core
    (the _with_options operator at that level) and by stock."""
    return {
        "case": case.name,
        "dim": case.dim,
        "input_shape": list(case.input.shape),
        "grid_shape": list(case.grid.shape),
        "detgrid": _guarded(lambda: repeat_hashes(lambda: run_detgrid(case), reps, device)),
        "builds": {level: _guarded(lambda: repeat_hashes(
            lambda: run_detgrid(case, level=level), reps, device))
            for level in levels.CORE_BUILDS},
        "stock": _guarded(lambda: repeat_hashes(lambda: run_stock(case), reps, device)),
    }


# --------------------------------------------------------------------------
# The device's bits against the host build's
# --------------------------------------------------------------------------

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


def match_cases(dtype: str, dim: int, seed: int = 0) -> List[Case]:
    """The small cases on which the device's bits are compared with the host
    build's (detgrid.bench.workloads.host_match_cases: every mode, padding and
    align_corners, zoom-in and non-finite grids), and their zoom-in cases again
    with a non-finite grad_output."""
    cases = host_match_cases(DTYPES[dtype], seed, dim)
    return cases + [with_non_finite_grad_output(c) for c in cases if c.name.endswith("_zoom")]


def core_grad_input(case: Case, level: str = levels.TOP,
                    launch: Sequence[int] = ()) -> torch.Tensor:
    """grad_input of the core's build ``level`` for the case, on the case's device
    (the host build on CPU, the nvcc build on CUDA); launch: the host build's
    (block_size, grid_size, shuffle_seed), its own where not given."""
    _ops()
    return torch.ops.detgrid._core_grad_input(
        case.grad_output, case.input, case.grid, case.interpolation_mode,
        case.padding_mode, case.align_corners, *launch, level=level)


def host_grid_gradient(case: Case) -> torch.Tensor:
    """grad_grid of the grid gradient's host build for the case (a CPU case)."""
    return _ops().grid_gradient(case.grad_output, case.input, case.grid,
                                case.interpolation_mode, case.padding_mode, case.align_corners)


def _compare_cases(cases: Sequence[Any],
                   pair: Callable[[Any], Optional[Tuple[torch.Tensor, torch.Tensor]]]
                   ) -> Dict[str, Any]:
    """pair(case) -> (got, reference), or None for a case it skips, over the cases: how many
    ran, how many are the same bits (NaNs alike: detgrid.kit.bitwise), the largest
    difference, the first mismatches and errors (an error is recorded and the other cases
    still run)."""
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


def core_row(device: str, level: str, dtype: str, dim: int,
             cases: Sequence[Case]) -> Dict[str, Any]:
    """The core's build ``level`` on the device against its host build, case by case
    (the reference runs first)."""
    def pair(case: Case) -> Tuple[torch.Tensor, torch.Tensor]:
        ref = core_grad_input(case, level)
        if torch.device(device).type == "cpu":
            return core_grad_input(case, level, HOST_STAND_IN_LAUNCH), ref
        got = core_grad_input(case.to(device), level)
        synchronize(device)
        return got, ref

    return {"level": level, "dtype": dtype, "dim": dim, **_compare_cases(cases, pair)}


def default_row(device: str, gradient: str, dtype: str, dim: int,
                cases: Sequence[Case]) -> Dict[str, Any]:
    """One gradient of the default backward on the device (detgrid.ops'
    grid_sampler_{2d,3d}_backward, which enable() routes to) against its host
    reference: grad_input the host build of the whole stack's (levels.TOP),
    grad_grid the grid gradient's host build's. Cases that do not ask for the
    gradient are left out."""
    index = ("grad_input", "grad_grid").index(gradient)

    def pair(case: Case) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        if not case.output_mask[index]:
            return None
        ref = core_grad_input(case, levels.TOP) if index == 0 else host_grid_gradient(case)
        got = run_detgrid(case.to(device))[index]
        synchronize(device)
        return got, ref

    return {"gradient": gradient, "dtype": dtype, "dim": dim, **_compare_cases(cases, pair)}


def core_match(device: str, dtypes: Sequence[str], seed: int = 0) -> List[Dict[str, Any]]:
    """core_row per build, dtype and spatial dims."""
    return [core_row(device, level, name, dim, match_cases(name, dim, seed))
            for level in levels.CORE_BUILDS for name in dtypes for dim in DIMS]


def default_match(device: str, gradient: str, dtypes: Sequence[str],
                  seed: int = 0) -> List[Dict[str, Any]]:
    """default_row per dtype and spatial dims."""
    return [default_row(device, gradient, name, dim, match_cases(name, dim, seed))
            for name in dtypes for dim in DIMS]


def same_layout_on(t: torch.Tensor, device: str) -> torch.Tensor:
    """t on device with its sizes, strides and storage offset, over a copy of the
    storage it views: an expanded (stride 0), channels-last or strided view reaches
    the kernel there as it reaches it here."""
    if t.device == torch.device(device):
        return t
    count = t.untyped_storage().nbytes() // t.element_size()
    storage = t.new_empty(0).set_(t.untyped_storage(), 0, (count,), (1,))
    return storage.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def _golden_modules() -> Optional[Tuple[Any, Any]]:
    """tests/golden's core and corpus modules (the golden corpus of the core's
    bits), or None where this tree has none."""
    tests_dir = os.path.join(ROOT, "tests")
    if not os.path.isfile(os.path.join(tests_dir, "golden", "core.py")):
        return None
    if tests_dir not in sys.path:
        sys.path.append(tests_dir)
    from golden import core, corpus

    return core, corpus


def golden_rows(device: str) -> List[Dict[str, Any]]:
    """Each build of the core on the device over the golden corpus
    (tests/golden/core.py, every case; 5-D bicubic included), against the golden
    bits: the host core build's, whose digests must be core_digests.json's
    (host_differ lists a case where they are not). One row per build; a row
    {"skipped": why} where no comparison can be made."""
    modules = _golden_modules()
    if modules is None:
        return [{"skipped": "no tests/golden/core.py in this tree"}]
    core, corpus = modules
    _ops()
    if not torch.ops.detgrid._core_host_contracts():
        return [{"skipped": "the golden bits are a host build's that contracts FMAs as nvcc "
                            "does; this CPU has no FMA"}]
    golden = core.load()
    reference, host_differ = {}, []
    for case in core.CASES:
        reference[case.name] = core.grad_input(case, levels.CORE)
        if corpus.tensor_digest(reference[case.name]) != golden.get(case.name):
            host_differ.append(case.name)

    def run_on_device(case: Any, level: str) -> torch.Tensor:
        if torch.device(device).type == "cpu":
            return core.grad_input(case, level, *HOST_STAND_IN_LAUNCH)
        grad_output, inp, grid = (same_layout_on(t, device) for t in corpus.make_inputs(case))
        got = torch.ops.detgrid._core_grad_input(
            grad_output, inp, grid, corpus.MODES[case.mode], corpus.PADDINGS[case.padding],
            case.align_corners, level=level)
        synchronize(device)
        return got

    return [{"level": level, "host_differ": host_differ[:10],
             "host_differ_count": len(host_differ),
             **_compare_cases(core.CASES, lambda case, level=level: (
                 run_on_device(case, level), reference[case.name]))}
            for level in levels.CORE_BUILDS]


# --------------------------------------------------------------------------
# Agreement with stock
# --------------------------------------------------------------------------

def _finite(case: Case) -> bool:
    return all(bool(t.isfinite().all()) for t in (case.grad_output, case.input, case.grid))


def _upcast(case: Case) -> Case:
    return dataclasses.replace(case, grad_output=case.grad_output.double(),
                               input=case.input.double(), grid=case.grid.double())


def _judged(gradients: Gradients, reference: Gradients, dtype: str) -> Optional[float]:
    """The largest rel_err of the gradients a result is judged on: both, but
    grad_input alone in float16 and bfloat16 where it is asked for (their
    grad_grid has no reference that is both independent and the same function:
    detgrid.bench.matrix's rule)."""
    pairs = list(zip(gradients, reference))
    if dtype in ("float16", "bfloat16") and gradients[0] is not None:
        pairs = pairs[:1]
    errors = [e for e in (rel_err(a, b) for a, b in pairs) if e is not None]
    return max(errors) if errors else None


def stock_row(device: str, dtype: str, dim: int, cases: Sequence[Case]) -> Dict[str, Any]:
    """The default backward against stock's (atomicAdd on CUDA) on the device, case
    by case, judged as `detgrid bench` judges a row (detgrid.bench.matrix.judge):
    within the dtype's tolerance of stock, or, where stock is further off, of
    float64 stock and no further from it than stock. Only finite cases: where a
    coordinate is NaN, the core takes no tap where stock's bicubic kernel pads it
    onto an edge pixel (by design; aten_kernels/extension/GridGradient.cu). A case
    stock refuses (tricubic before torch 2.15) is counted in refused, not run."""
    from detgrid.bench.matrix import TOLERANCE, judge

    tolerance = TOLERANCE[dtype]
    ran, refused, failing, errors, worst = 0, [], [], [], 0.0
    for case in filter(_finite, cases):
        moved = case.to(device)
        try:
            stock, float64 = run_stock(moved), run_stock(_upcast(moved))
        except RuntimeError as e:
            refused.append(f"{case.name}: {str(e)[:200]}")
            continue
        try:
            ours = run_detgrid(moved)
            synchronize(device)
        except Exception as e:  # recorded, the other cases still run
            errors.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        vs_stock = _judged(ours, stock, dtype)
        ok, _ = judge(vs_stock, {"detgrid": _judged(ours, float64, dtype),
                                 "stock": _judged(stock, float64, dtype)}, tolerance)
        ran += 1
        worst = max(worst, vs_stock if vs_stock is not None else 0.0)
        if not ok:
            failing.append(case.name)
    return {"dtype": dtype, "dim": dim, "device": device, "cases": ran,
            "tolerance": tolerance, "max_rel_diff": worst, "failing": failing[:10],
            "errors": errors[:10], "refused": len(refused), "refused_first": refused[:1]}


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


def run_bitwise(device: str = "cuda", reps: int = 100, scale: float = 1.0, seed: int = 0,
                dtypes: Sequence[str] = tuple(DTYPES)) -> Dict[str, Any]:
    """Per high-collision case (2-D, 3-D): repeat runs of the default backward,
    of each build and of stock. Per build, dtype and spatial dims: the device
    against the host build; per build, the golden corpus on the device; per dtype
    and spatial dims: the default backward's grad_input and grad_grid against the
    host's, and its agreement with stock; then half and bfloat16 taps against
    stock's (fidelity to stock's forward)."""
    _ops()
    golden = _guarded(lambda: golden_rows(device))
    return {
        "device": device,
        "builds": list(levels.CORE_BUILDS),
        "default_build": levels.TOP,
        "host_contracts": bool(torch.ops.detgrid._core_host_contracts()),
        "repeat": [repeat_row(case, reps, device) for case in repeat_cases(device, scale, seed)],
        "core": core_match(device, dtypes, seed),
        "golden": golden if isinstance(golden, list) else [golden],
        "default_grad_input": default_match(device, "grad_input", dtypes, seed),
        "grid_gradient": default_match(device, "grad_grid", dtypes, seed),
        "stock": [stock_row(device, name, dim, host_match_cases(DTYPES[name], seed, dim))
                  for name in dtypes for dim in DIMS],
        "fidelity": [fidelity_row(device, name, dim, seed)
                     for name in FIDELITY_DTYPES for dim in DIMS],
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

# The benchmark rows, the GPU check's eight first (detgrid.bench.workloads.
# WORKLOADS: the set a run short of time should still have), then the rest in
# the benchmark's order.
TIMING_WORKLOADS = (*WORKLOADS, *(name for name in BENCH_WORKLOADS if name not in WORKLOADS))


def time_workload(workload: Workload, device: str = "cuda", warmup: int = 5, reps: int = 25,
                  scale: float = 1.0, seed: int = 0) -> Dict[str, Any]:
    """Median ms of stock's backward (its own mode) and detgrid's (deterministic
    mode) on one workload, interleaved rep by rep: the default backward (the
    whole stack, levels.TOP) and, where grad_input is asked for, each other
    build of the core. Their ratios to stock; the default's extra peak memory
    over stock's and its difference from stock's result; whether each other
    build gave the default's bits."""
    case = workload.build(device, seed, scale)
    stock_out, det_out = run_stock(case), run_detgrid(case)
    synchronize(device)
    row: Dict[str, Any] = {
        "name": workload.name, "load": workload.load,
        "input_shape": list(case.input.shape), "grid_shape": list(case.grid.shape),
        "dtype": dtype_name(case.input.dtype), "mode": workload.mode_label,
        "padding": workload.padding, "align_corners": workload.align_corners,
        "output_mask": list(case.output_mask),
        "rel_err_grad_input": rel_err(det_out[0], stock_out[0]),
        "rel_err_grad_grid": rel_err(det_out[1], stock_out[1]),
    }
    others = OTHER_BUILDS if case.output_mask[0] else ()
    equal = {level: all(same_bits_or_both_nan(a, b)
                        for a, b in zip(run_detgrid(case, level=level), det_out))
             for level in others}
    del stock_out, det_out
    fns = [run_stock, run_detgrid] + [functools.partial(run_detgrid, level=level)
                                      for level in others]
    times = time_rotating(fns, [case], device, warmup, reps)
    stock_ms, det_ms = (statistics.median(t) for t in times[:2])
    row["stock_ms"], row["detgrid_ms"] = stock_ms, det_ms
    row["stock_ms_range"] = [min(times[0]), max(times[0])]
    row["detgrid_ms_range"] = [min(times[1]), max(times[1])]
    row["ratio"] = det_ms / stock_ms if stock_ms > 0 else None
    # The core's builds: the default backward is the whole stack's; a grid-only
    # call runs no build (the grid gradient alone).
    row["builds"] = {}
    if case.output_mask[0]:
        row["builds"][levels.TOP] = {"ms": det_ms, "ratio": row["ratio"]}
    for level, ms in zip(others, times[2:]):
        median = statistics.median(ms)
        row["builds"][level] = {"ms": median, "ratio": median / stock_ms if stock_ms > 0 else None,
                                "equals_default": equal[level]}
    stock_peak = peak_bytes(lambda: run_stock(case), device)
    det_peak = peak_bytes(lambda: run_detgrid(case), device)
    row["stock_peak_mib"] = None if stock_peak is None else stock_peak / 2**20
    row["detgrid_peak_mib"] = None if det_peak is None else det_peak / 2**20
    row["extra_peak_mib"] = (None if stock_peak is None or det_peak is None
                             else (det_peak - stock_peak) / 2**20)
    row["reps"], row["warmup"] = reps, warmup
    return row


def run_timing(device: str = "cuda", names: Optional[Iterable[str]] = None, warmup: int = 5,
               reps: int = 25, scale: float = 1.0, seed: int = 0,
               deadline: Optional[float] = None) -> Dict[str, Any]:
    """time_workload over the benchmark rows (TIMING_WORKLOADS by default); stops
    starting new ones after deadline (time.monotonic()), so a slow device still
    leaves a partial table."""
    rows = []
    for name in names or TIMING_WORKLOADS:
        if deadline is not None and time.monotonic() > deadline:
            rows.append({"name": name, "skipped": "time budget"})
            continue
        workload = BENCH_WORKLOADS[name]
        if (torch.device(device).type == "cpu"
                and not stock_cpu_workload_is_reliable(workload, scale)):
            rows.append({"name": name, "skipped": SKIP_REASON})
            continue
        try:
            rows.append(time_workload(workload, device, warmup, reps, scale, seed))
        except Exception as e:
            rows.append({"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return {"device": device, "scale": scale, "builds": list(levels.CORE_BUILDS),
            "default_build": levels.TOP, "rows": rows}


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
    """Runs each case on device by the default backward and by each other build of
    the core, so that every kernel runs under the tool, and compares every result
    with the host's (the NaN rule: detgrid.kit.bitwise)."""
    ran, mismatches = 0, []
    for case in sanitizer_cases(set_name, seed):
        moved = case.to(device)
        got = [run_detgrid(moved)] + [run_detgrid(moved, level=level) for level in OTHER_BUILDS]
        synchronize(device)
        ran += 1
        ref = [run_detgrid(case)] + [run_detgrid(case, level=level) for level in OTHER_BUILDS]
        if not all(same_bits_or_both_nan(g, r) for gs, rs in zip(got, ref)
                   for g, r in zip(gs, rs)):
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
    sub.add_parser("routes", help="grid-only calls and cross-device calls under enable()")
    common(sub.choices["routes"])
    sp = sub.add_parser("timing"); common(sp)
    sp.add_argument("--warmup", type=int, default=5)
    sp.add_argument("--reps", type=int, default=25)
    sp.add_argument("--scale", type=float, default=1.0)
    sp.add_argument("--workloads", default=",".join(TIMING_WORKLOADS))
    sp.add_argument("--budget-s", type=float, default=None,
                    help="start no workload after this many seconds")
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
    if args.cmd == "routes":
        _write_json(args.json, run_routes(args.device, args.seed))
        return 0
    if args.cmd == "timing":
        deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
        result = run_timing(args.device, [w for w in args.workloads.split(",") if w],
                            args.warmup, args.reps, args.scale, args.seed, deadline)
        _write_json(args.json, result)
        return 0
    if args.cmd == "sanitizer-case":
        result = run_sanitizer_cases(args.device, args.set, args.seed)
        print(f"{DONE_MARK} cases={result['cases']} mismatches={len(result['mismatches'])}")
        if result["mismatches"]:
            print("mismatches with the host build: " + ", ".join(result["mismatches"]))
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
