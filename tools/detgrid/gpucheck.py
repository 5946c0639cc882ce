"""The Python side of tools/gpu_check.sh: the checks of detgrid that need a GPU.

    python3 -m detgrid.gpucheck env            --json env.json
    python3 -m detgrid.gpucheck build-info     --json build.json [--require-cuda]
    python3 -m detgrid.gpucheck bitwise        --device cuda --json bitwise.json
    python3 -m detgrid.gpucheck timing         --device cuda --json timing.json
    python3 -m detgrid.gpucheck sanitize       --tool memcheck --set all --json s.json
    python3 -m detgrid.gpucheck sanitizer-case --device cuda --set all
    python3 -m detgrid.gpucheck report         --work DIR --out DIR [--junit X]

Every subcommand also runs with `--device cpu` (or needs no device at all),
so its logic is tested on machines without a GPU: there "detgrid" is the
host executor and "stock" is aten's CPU kernel.

The functions return plain data (dicts, lists); only main() prints. The
workloads (WORKLOADS) and the timing (time_workload) are meant to be reused
by a benchmark command: each workload builds its inputs from a seeded
generator at any scale.

The file also runs as a script (`python3 tools/detgrid/gpucheck.py ...`),
which the shell script uses: then `env` and `report` work even when the
extension did not build, since detgrid's ops are imported only by the
subcommands that call them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
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
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script: import detgrid from the tools/ folder beside this file,
    # not its modules as top-level ones.
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == _here:
        sys.path[0] = os.path.dirname(_here)

import torch

MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# dtypes whose device result must equal the host executor's bit for bit.
EXACT_DTYPES = ("float32", "float64")

Gradients = Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]


def _ops():
    from detgrid import ops

    return ops


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------
# Cases and workloads
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """One call of grid_sampler_2d_backward, inputs included."""

    name: str
    grad_output: torch.Tensor
    input: torch.Tensor
    grid: torch.Tensor
    interpolation_mode: int
    padding_mode: int
    align_corners: bool
    output_mask: Tuple[bool, bool]
    options: Dict[str, int] = dataclasses.field(default_factory=dict)

    def args(self) -> tuple:
        return (self.grad_output, self.input, self.grid, self.interpolation_mode,
                self.padding_mode, self.align_corners, list(self.output_mask))

    def to(self, device: str) -> "Case":
        return dataclasses.replace(
            self, grad_output=self.grad_output.to(device), input=_move_input(self.input, device),
            grid=self.grid.to(device))


def _move_input(t: torch.Tensor, device: str) -> torch.Tensor:
    """Keeps a stride-0 batch and channels_last across devices."""
    if t.device.type == torch.device(device).type:
        return t
    if t.dim() == 4 and t.size(0) > 1 and t.stride(0) == 0:
        return t[:1].to(device).expand(t.shape)  # stride-0 batch stays stride-0
    if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return t.to(device).contiguous(memory_format=torch.channels_last)
    return t.to(device)


def run_detgrid(case: Case, **options: int) -> Gradients:
    ops = _ops()
    opts = {**case.options, **options}
    if opts:
        return ops.grid_sampler_2d_backward_with_options(*case.args(), **opts)
    return ops.grid_sampler_2d_backward(*case.args())


def run_stock(case: Case) -> Gradients:
    """aten's own kernel, outside deterministic mode (it alerts there)."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        gi, gg = torch.ops.aten.grid_sampler_2d_backward(*case.args())
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)
    return (gi if case.output_mask[0] else None, gg if case.output_mask[1] else None)


def _scaled(d: int, scale: float) -> int:
    return d if d <= 1 else max(1, int(round(d * scale)))


def _axis(size: int, align_corners: bool) -> torch.Tensor:
    """Normalized pixel centres (align_corners=False) or corners (True)."""
    if align_corners:
        return torch.linspace(-1.0, 1.0, size) if size > 1 else torch.zeros(1)
    return (torch.arange(size, dtype=torch.float32) * 2 + 1) / size - 1


def _identity_grid(n: int, h: int, w: int, align_corners: bool) -> torch.Tensor:
    ys, xs = _axis(h, align_corners), _axis(w, align_corners)
    grid = torch.stack(torch.broadcast_tensors(xs.view(1, w), ys.view(h, 1)), dim=-1)
    return grid.expand(n, h, w, 2).clone()


def make_grid(kind: str, n: int, h: int, w: int, input_hw: Tuple[int, int],
              align_corners: bool, g: torch.Generator, extent: float = 1.0) -> torch.Tensor:
    """A float32 grid (n, h, w, 2) on the CPU.

    random: uniform in [-extent, extent]; smooth: the identity warp plus
    about 1.5 input pixels of noise (flow warps, reprojection); zoom: the
    identity scaled by extent, so all points land in the middle
    extent-fraction of the input (many samples per input cell); line: x = 0,
    y uniform (a 1-D table, as TensoRF's line factors).
    """
    if kind == "random":
        return (torch.rand(n, h, w, 2, generator=g) * 2 - 1) * extent
    if kind == "smooth":
        base = _identity_grid(n, h, w, align_corners)
        step = torch.tensor([2.0 / max(input_hw[1], 1), 2.0 / max(input_hw[0], 1)])
        return base + torch.randn(n, h, w, 2, generator=g) * 1.5 * step
    if kind == "zoom":
        base = _identity_grid(n, h, w, align_corners) * extent
        step = torch.tensor([2.0 / max(input_hw[1], 1), 2.0 / max(input_hw[0], 1)])
        return base + (torch.rand(n, h, w, 2, generator=g) - 0.5) * step
    if kind == "line":
        grid = torch.zeros(n, h, w, 2)
        grid[..., 1] = (torch.rand(n, h, w, generator=g) * 2 - 1) * extent
        return grid
    raise ValueError(f"unknown grid kind {kind!r}")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A benchmark workload (see shared BENCHMARKS.md), at full size.

    build(device, seed, scale) makes its inputs: every dimension but the
    last of the grid (and dimensions of size one) is multiplied by scale.
    """

    name: str
    source: str
    input_shape: Tuple[int, int, int, int]
    grid_shape: Tuple[int, int, int, int]
    mode: str
    padding: str
    align_corners: bool
    output_mask: Tuple[bool, bool]
    grid_kind: str
    extent: float = 1.0
    dtype: torch.dtype = torch.float32
    expanded_batch: bool = False
    channels_last: bool = False
    load: str = ""

    def shapes(self, scale: float = 1.0) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        n, c, h, w = (_scaled(d, scale) for d in self.input_shape)
        gn, gh, gw, two = self.grid_shape
        return (n, c, h, w), (n, _scaled(gh, scale), _scaled(gw, scale), two)

    def build(self, device: str = "cpu", seed: int = 0, scale: float = 1.0,
              output_mask: Optional[Tuple[bool, bool]] = None) -> Case:
        g = torch.Generator().manual_seed(seed)
        (n, c, h, w), (_, gh, gw, _) = self.shapes(scale)
        inp = torch.randn(1 if self.expanded_batch else n, c, h, w, generator=g).to(self.dtype)
        if self.expanded_batch:
            inp = inp.expand(n, c, h, w)
        if self.channels_last:
            inp = inp.contiguous(memory_format=torch.channels_last)
        grid = make_grid(self.grid_kind, n, gh, gw, (h, w), self.align_corners, g, self.extent)
        case = Case(
            name=self.name,
            grad_output=torch.randn(n, c, gh, gw, generator=g).to(self.dtype),
            input=inp,
            grid=grid.to(self.dtype),
            interpolation_mode=MODES[self.mode],
            padding_mode=PADDINGS[self.padding],
            align_corners=self.align_corners,
            output_mask=tuple(output_mask or self.output_mask),
        )
        return case.to(device)


WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("rtdetr_l80", "BENCHMARKS #1 (level 80x80)", (128, 32, 80, 80), (128, 500, 4, 2),
             "bilinear", "zeros", False, (True, True), "random", load="sparse"),
    Workload("mask2former_l32", "BENCHMARKS #2 (level 32x32)", (16, 32, 32, 32), (16, 21504, 4, 2),
             "bilinear", "zeros", False, (True, True), "random", load="zoom ~84/cell"),
    Workload("basicvsr_flow_warp", "BENCHMARKS #5", (4, 64, 64, 64), (4, 64, 64, 2),
             "bilinear", "zeros", True, (True, True), "smooth", load="smooth"),
    Workload("tensorf_line", "BENCHMARKS #11", (1, 48, 300, 1), (1, 1000000, 1, 2),
             "bilinear", "zeros", True, (True, False), "line", load=">1000/cell"),
    Workload("positional_table_c1024", "BENCHMARKS #14 (stride-0 batch)", (8, 1024, 31, 31),
             (8, 64, 64, 2), "bilinear", "zeros", False, (True, True), "zoom", extent=0.28,
             expanded_batch=True, load="zoom ~50/cell"),
    Workload("rgb_warp_bicubic_fp16", "BENCHMARKS #15", (16, 3, 224, 224), (16, 224, 224, 2),
             "bicubic", "reflection", False, (True, True), "smooth", dtype=torch.float16,
             load="smooth"),
    Workload("monodepth2_grid_only", "BENCHMARKS #6", (12, 3, 192, 640), (12, 192, 640, 2),
             "bilinear", "border", False, (False, True), "smooth", load="smooth, grid only"),
    Workload("liif_nearest", "BENCHMARKS #13", (16, 576, 48, 48), (16, 1, 2304, 2),
             "nearest", "zeros", False, (True, False), "random", load="random, large C"),
]}

# The case whose 100 repeats are hashed: extreme collisions (TensoRF line),
# both gradients asked for.
REPEAT_WORKLOAD = "tensorf_line"


def special_grid(grid: torch.Tensor) -> torch.Tensor:
    """Puts NaN, +-Inf and +-1e38 into the first points of a (n, h, w, 2) grid."""
    specials = [
        (math.nan, 0.1), (0.2, math.nan), (math.inf, 0.0), (-math.inf, 0.3),
        (1e38, -1e38), (-1e38, 0.5), (math.inf, -math.inf), (math.nan, math.nan),
        (0.3, 1e38), (-0.7, -math.inf),
    ]
    flat = grid.reshape(-1, 2)
    for i, (x, y) in enumerate(specials[: flat.shape[0]]):
        flat[i, 0], flat[i, 1] = x, y
    return grid


def _small_case(name: str, mode: str, padding: str, align: bool, dtype: torch.dtype,
                g: torch.Generator, *, shape=(2, 3, 7, 9), grid_hw=(5, 6), extent=1.3,
                mask=(True, True), special=False, options=None) -> Case:
    n, c, h, w = shape
    gh, gw = grid_hw
    grid = (torch.rand(n, gh, gw, 2, generator=g) * 2 - 1) * extent
    if special:
        grid = special_grid(grid)
    return Case(
        name=name,
        grad_output=torch.randn(n, c, gh, gw, generator=g).to(dtype),
        input=torch.randn(n, c, h, w, generator=g).to(dtype),
        grid=grid.to(dtype),
        interpolation_mode=MODES[mode],
        padding_mode=PADDINGS[padding],
        align_corners=align,
        output_mask=tuple(mask),
        options=dict(options or {}),
    )


def sanitizer_cases(set_name: str = "all", seed: int = 0) -> List[Case]:
    """CPU cases for the memory checker: every mode x padding, finite and
    non-finite/huge grids, masks, dtypes, layouts and a multi-chunk case
    (chunk_points=4096 with 10000 points per call, so three chunks)."""
    g = torch.Generator().manual_seed(seed)
    if set_name == "tiny":
        return [_small_case("tiny_bilinear_zeros_collide", "bilinear", "zeros", False,
                            torch.float32, g, shape=(1, 2, 3, 3), grid_hw=(8, 8), extent=0.9)]
    if set_name != "all":
        raise ValueError(f"unknown case set {set_name!r}")
    cases = []
    for mode in MODES:
        for padding in PADDINGS:
            for special in (False, True):
                align = special  # both values of align_corners per mode x padding
                tag = "special" if special else "finite"
                cases.append(_small_case(f"{mode}_{padding}_{tag}", mode, padding, align,
                                         torch.float32, g, special=special))
    cases += [
        _small_case("bilinear_zeros_gi_only", "bilinear", "zeros", False, torch.float32, g,
                    mask=(True, False)),
        _small_case("bicubic_border_gg_only", "bicubic", "border", True, torch.float32, g,
                    mask=(False, True), special=True),
        _small_case("bilinear_reflection_f64_special", "bilinear", "reflection", False,
                    torch.float64, g, special=True),
        _small_case("bicubic_zeros_f16_special", "bicubic", "zeros", False, torch.float16, g,
                    special=True),
        _small_case("nearest_border_bf16", "nearest", "border", True, torch.bfloat16, g),
        _small_case("bilinear_zeros_multichunk", "bilinear", "zeros", False, torch.float32, g,
                    shape=(1, 2, 11, 13), grid_hw=(100, 100), extent=1.1,
                    options={"chunk_points": 4096}),
        _small_case("bicubic_reflection_multichunk_special", "bicubic", "reflection", True,
                    torch.float32, g, shape=(1, 2, 11, 13), grid_hw=(100, 100), special=True,
                    options={"chunk_points": 4096}),
        _small_case("bilinear_border_f16_multichunk", "bilinear", "border", False,
                    torch.float16, g, shape=(1, 3, 11, 13), grid_hw=(100, 100),
                    options={"chunk_points": 4096}),
        _small_case("nearest_zeros_small_blocks", "nearest", "zeros", False, torch.float32, g,
                    shape=(2, 3, 5, 5), grid_hw=(40, 40),
                    options={"block_size": 64, "max_blocks": 3}),
    ]
    cl = _small_case("bilinear_zeros_channels_last", "bilinear", "zeros", True, torch.float32, g,
                     shape=(2, 5, 7, 9))
    cl.input = cl.input.contiguous(memory_format=torch.channels_last)
    ex = _small_case("bilinear_zeros_expanded", "bilinear", "zeros", False, torch.float32, g,
                     shape=(3, 4, 6, 6))
    ex.input = ex.input[:1].expand(3, 4, 6, 6)
    cases += [cl, ex]
    return cases


def executor_cases(dtype: torch.dtype, seed: int = 0) -> List[Case]:
    """Small cases for device-vs-host-executor equality: every mode x
    padding x align_corners, some points out of bounds, plus non-finite grids."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for mode in MODES:
        for padding in PADDINGS:
            for align in (False, True):
                cases.append(_small_case(f"{mode}_{padding}_{'ac' if align else 'nac'}", mode,
                                         padding, align, dtype, g, shape=(2, 5, 13, 17),
                                         grid_hw=(24, 20), extent=1.2))
        cases.append(_small_case(f"{mode}_zeros_zoom", mode, "zeros", False, dtype, g,
                                 shape=(2, 4, 6, 7), grid_hw=(40, 40), extent=0.8))
        cases.append(_small_case(f"{mode}_reflection_special", mode, "reflection", True, dtype,
                                 g, shape=(2, 3, 8, 8), grid_hw=(9, 9), special=True))
    return cases


# --------------------------------------------------------------------------
# Bitwise checks
# --------------------------------------------------------------------------


def sha256(t: Optional[torch.Tensor]) -> Optional[str]:
    if t is None:
        return None
    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def bitwise_equal(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return sha256(a) == sha256(b)


def max_abs_diff(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> float:
    """max |a - b|, NaN == NaN; inf where only one side is NaN."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    a = a.detach().cpu().double()
    b = b.detach().cpu().double()
    if a.numel() == 0:
        return 0.0
    both_nan = a.isnan() & b.isnan()
    same = (a == b) | both_nan  # also equal infinities
    diff = (a - b).abs()
    diff = torch.where(same, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    return float(diff.max())


def rel_err(a: Optional[torch.Tensor], ref: Optional[torch.Tensor]) -> Optional[float]:
    """max |a - ref| / max |ref| (a normwise, not elementwise, relative error)."""
    if a is None or ref is None:
        return None
    scale = float(ref.detach().double().abs().max()) if ref.numel() else 0.0
    return max_abs_diff(a, ref) / (scale if scale > 0 else 1.0)


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def repeat_hashes(fn: Callable[[], Gradients], reps: int, device: str) -> Dict[str, Any]:
    """Runs fn reps times; distinct SHA-256 hashes of each gradient."""
    hashes: Tuple[set, set] = (set(), set())
    first: List[Optional[str]] = [None, None]
    for _ in range(reps):
        grads = fn()
        _sync(device)
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


def knob_settings(device: str) -> List[Dict[str, int]]:
    if torch.device(device).type == "cuda":
        return [{}, {"chunk_points": 4096}, {"block_size": 128}, {"block_size": 512},
                {"block_size": 64, "max_blocks": 7}, {"chunk_points": 8192, "max_blocks": 2}]
    return [{}, {"chunk_points": 4096}, {"grain_size": 1}, {"grain_size": 100000}]


def executor_match(device: str, dtypes: Sequence[str], seed: int = 0) -> List[Dict[str, Any]]:
    """The device backward against the host executor, bit for bit, per dtype.

    On --device cpu the "device" run is the executor with grain_size=1 (as
    many threads as it will take), the reference its default.
    """
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        cases = executor_cases(dtype, seed)
        equal, worst, mismatches, errors = 0, 0.0, [], []
        for case in cases:
            try:
                ref = run_detgrid(case)
                if torch.device(device).type == "cpu":
                    got = run_detgrid(case, grain_size=1)
                else:
                    got = run_detgrid(case.to(device))
                    _sync(device)
            except Exception as e:  # recorded, the other cases still run
                errors.append(f"{case.name}: {type(e).__name__}: {str(e)[:200]}")
                continue
            same = all(bitwise_equal(g, r) for g, r in zip(got, ref))
            equal += same
            worst = max(worst, *(max_abs_diff(g, r) for g, r in zip(got, ref)))
            if not same:
                mismatches.append(case.name)
        rows.append({
            "dtype": name,
            "cases": len(cases),
            "bitwise_equal": equal,
            "max_abs_diff": worst,
            "must_be_equal": name in EXACT_DTYPES,
            "mismatches": mismatches[:10],
            "errors": errors[:10],
        })
    return rows


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
        _sync(device)
        hashes.append((sha256(gi), sha256(gg)))
    return {"case": case.name, "settings": settings, "distinct": len(set(hashes))}


def run_bitwise(device: str = "cuda", reps: int = 100, scale: float = 1.0, seed: int = 0,
                dtypes: Sequence[str] = tuple(DTYPES)) -> Dict[str, Any]:
    """Repeat hashes (detgrid and stock) of a high-collision case, knob
    invariance, and device vs host executor per dtype."""
    workload = WORKLOADS[REPEAT_WORKLOAD]
    case = workload.build(device, seed, scale, output_mask=(True, True))
    return {
        "device": device,
        "repeat": {
            "case": workload.name,
            "input_shape": list(case.input.shape),
            "grid_shape": list(case.grid.shape),
            "detgrid": _guarded(lambda: repeat_hashes(lambda: run_detgrid(case), reps, device)),
            "stock": _guarded(lambda: repeat_hashes(lambda: run_stock(case), reps, device)),
        },
        "knobs": _guarded(lambda: knob_invariance(case, device)),
        "executor": executor_match(device, dtypes, seed),
    }


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def _time_interleaved(fns: Sequence[Callable[[], Any]], device: str, warmup: int,
                      reps: int) -> List[List[float]]:
    """Milliseconds of each fn per rep, the fns interleaved rep by rep (so
    clock drift hits all alike); CUDA events on the GPU."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    _sync(device)
    cuda = torch.device(device).type == "cuda"
    times: List[List[float]] = [[] for _ in fns]
    if cuda:
        events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(reps)] for _ in fns]
        for r in range(reps):
            for i, fn in enumerate(fns):
                start, end = events[i][r]
                start.record()
                fn()
                end.record()
        torch.cuda.synchronize()
        for i in range(len(fns)):
            times[i] = [s.elapsed_time(e) for s, e in events[i]]
    else:
        for _ in range(reps):
            for i, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                times[i].append((time.perf_counter() - t0) * 1e3)
    return times


def _peak_bytes(fn: Callable[[], Any], device: str) -> Optional[int]:
    """Memory the call allocates at its peak, beyond what was allocated before."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def _describe(case: Case) -> Dict[str, Any]:
    return {
        "input_shape": list(case.input.shape),
        "grid_shape": list(case.grid.shape),
        "dtype": _dtype_name(case.input.dtype),
        "mode": {v: k for k, v in MODES.items()}[case.interpolation_mode],
        "padding": {v: k for k, v in PADDINGS.items()}[case.padding_mode],
        "align_corners": case.align_corners,
        "output_mask": list(case.output_mask),
    }


def time_workload(workload: Workload, device: str = "cuda", warmup: int = 5, reps: int = 25,
                  scale: float = 1.0, seed: int = 0) -> Dict[str, Any]:
    """Median ms of stock vs detgrid backward on one workload, their ratio,
    detgrid's extra peak memory over stock, and the difference of results."""
    case = workload.build(device, seed, scale)
    stock_out = run_stock(case)
    det_out = run_detgrid(case)
    _sync(device)
    row: Dict[str, Any] = {"name": workload.name, "load": workload.load, **_describe(case)}
    row["rel_err_grad_input"] = rel_err(det_out[0], stock_out[0])
    row["rel_err_grad_grid"] = rel_err(det_out[1], stock_out[1])
    del stock_out, det_out
    stock_ms, det_ms = _time_interleaved(
        [lambda: run_stock(case), lambda: run_detgrid(case)], device, warmup, reps)
    row["stock_ms"] = statistics.median(stock_ms)
    row["detgrid_ms"] = statistics.median(det_ms)
    row["stock_ms_range"] = [min(stock_ms), max(stock_ms)]
    row["detgrid_ms_range"] = [min(det_ms), max(det_ms)]
    row["ratio"] = row["detgrid_ms"] / row["stock_ms"] if row["stock_ms"] > 0 else None
    stock_peak = _peak_bytes(lambda: run_stock(case), device)
    det_peak = _peak_bytes(lambda: run_detgrid(case), device)
    row["stock_peak_mib"] = None if stock_peak is None else stock_peak / 2**20
    row["detgrid_peak_mib"] = None if det_peak is None else det_peak / 2**20
    row["extra_peak_mib"] = (None if stock_peak is None or det_peak is None
                             else (det_peak - stock_peak) / 2**20)
    row["reps"], row["warmup"] = reps, warmup
    return row


def run_timing(device: str = "cuda", names: Optional[Iterable[str]] = None, warmup: int = 5,
               reps: int = 25, scale: float = 1.0, seed: int = 0,
               deadline: Optional[float] = None) -> Dict[str, Any]:
    """time_workload over workloads; stops starting new ones after deadline
    (time.monotonic()), so a slow device still leaves a partial table."""
    rows = []
    for name in names or WORKLOADS:
        if deadline is not None and time.monotonic() > deadline:
            rows.append({"name": name, "skipped": "time budget"})
            continue
        try:
            rows.append(time_workload(WORKLOADS[name], device, warmup, reps, scale, seed))
        except Exception as e:
            rows.append({"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return {"device": device, "scale": scale, "rows": rows}


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
    (bit for bit for float32/float64)."""
    ran, mismatches = 0, []
    for case in sanitizer_cases(set_name, seed):
        got = run_detgrid(case.to(device))
        _sync(device)
        ran += 1
        if _dtype_name(case.input.dtype) in EXACT_DTYPES:
            ref = run_detgrid(case)
            if not all(bitwise_equal(g, r) for g, r in zip(got, ref)):
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
    tools_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
        ops = _ops()
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
# Report
# --------------------------------------------------------------------------


def junit_summary(path: str) -> Dict[str, Any]:
    """Counts and the failing tests of a pytest junit xml."""
    if not os.path.isfile(path):
        return {"present": False}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"present": True, "parse_error": str(e)}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    summary: Dict[str, Any] = {"present": True, "tests": 0, "failures": 0, "errors": 0,
                               "skipped": 0, "time_s": 0.0}
    for s in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            summary[key] += int(s.get(key, 0) or 0)
        summary["time_s"] += float(s.get("time", 0) or 0)
    summary["time_s"] = round(summary["time_s"], 1)
    summary["passed"] = summary["tests"] - summary["failures"] - summary["errors"] - summary["skipped"]
    failed = []
    for tc in root.iter("testcase"):
        for tag in ("failure", "error"):
            el = tc.find(tag)
            if el is not None:
                msg = (el.get("message") or el.text or "").strip().splitlines()
                failed.append({"test": f"{tc.get('classname')}::{tc.get('name')}",
                               "kind": tag, "message": (msg[0] if msg else "")[:300]})
    summary["failed"] = failed[:25]
    return summary


def read_steps(path: str) -> List[Dict[str, Any]]:
    """steps.tsv lines: name, status, rc, seconds, limit, note."""
    steps = []
    if not os.path.isfile(path):
        return steps
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if not parts or not parts[0]:
                continue
            parts += [""] * (6 - len(parts))
            name, status, rc, secs, limit, note = parts[:6]
            steps.append({
                "name": name, "status": status,
                "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                "seconds": int(secs) if secs.isdigit() else None,
                "limit_s": int(limit) if limit.isdigit() else None,
                "note": note,
            })
    return steps


def _load_json(path: str) -> Optional[Any]:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"unreadable {os.path.basename(path)}: {e}"}


def _check(name: str, ok: Optional[bool], detail: str, required: bool = True) -> Dict[str, Any]:
    result = "n/a" if ok is None else ("pass" if ok else "fail")
    return {"check": name, "result": result, "detail": detail, "required": required}


def verdict_checks(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """pass / fail / n/a for each claim the GPU check is there to make."""
    checks = []
    build = data.get("build") or {}
    if not build:
        checks.append(_check("CUDA kernels built", None, "no build facts"))
    else:
        detail = (f"has_cuda_kernels={build.get('has_cuda_kernels')} "
                  f"sass={build.get('sass_archs')}")
        if build.get("import_error"):
            detail += f"; {build['import_error'][:200]}"
        if build.get("require_cuda", True):
            checks.append(_check("CUDA kernels built", bool(build.get("has_cuda_kernels")), detail))
        else:
            checks.append(_check("CUDA kernels built", None, detail + " (cpu run)"))
    tests = data.get("tests") or {}
    if tests.get("present") and "tests" in tests:
        bad = tests["failures"] + tests["errors"]
        checks.append(_check("CUDA tests", bad == 0 and tests["tests"] > 0,
                             f"{tests['passed']} passed, {tests['failures']} failed, "
                             f"{tests['errors']} errors, {tests['skipped']} skipped"))
    else:
        checks.append(_check("CUDA tests", None, "no junit xml"))
    bw = data.get("bitwise") or {}
    rep = (bw.get("repeat") or {}).get("detgrid") or {}
    if rep:
        distinct = [v for v in (rep.get("grad_input_distinct"), rep.get("grad_grid_distinct"))
                    if v is not None]
        stock = (bw["repeat"].get("stock") or {})
        checks.append(_check(
            "repeat runs bitwise identical", all(v == 1 for v in distinct) and bool(distinct),
            f"{rep.get('reps')} runs of {bw['repeat'].get('case')}: distinct hashes "
            f"grad_input={rep.get('grad_input_distinct')} grad_grid={rep.get('grad_grid_distinct')}; "
            f"stock grad_input={stock.get('grad_input_distinct', stock.get('error'))}"
            + (f"; {rep['error']}" if rep.get("error") else "")))
    else:
        checks.append(_check("repeat runs bitwise identical", None, "not run"))
    knobs = bw.get("knobs") or {}
    checks.append(_check("knobs change no bit", knobs.get("distinct") == 1 if knobs else None,
                         f"{len(knobs.get('settings', []))} settings, distinct={knobs.get('distinct')}"
                         + (f"; {knobs['error']}" if knobs.get("error") else "")
                         if knobs else "not run"))
    for row in bw.get("executor") or []:
        exact = row.get("must_be_equal")
        ok = (row["bitwise_equal"] == row["cases"] and not row.get("errors")) if exact else (
            not row.get("errors"))
        checks.append(_check(
            f"device == host executor ({row['dtype']})", ok,
            f"{row['bitwise_equal']}/{row['cases']} bitwise equal, max abs diff "
            f"{_fmt(row['max_abs_diff'])}" + (f", errors: {row['errors'][:2]}" if row.get("errors") else ""),
            required=bool(exact)))
    if not bw.get("executor"):
        checks.append(_check("device == host executor", None, "not run"))
    for key, required in (("memcheck", True), ("racecheck", True), ("initcheck", False)):
        s = (data.get("sanitizer") or {}).get(key)
        if not s:
            checks.append(_check(f"compute-sanitizer {key}", None, "not run", required))
            continue
        status = s.get("status")
        ok = None if status == "unavailable" else status == "clean"
        detail = f"{status}, errors={s.get('errors')}"
        if s.get("cases") is not None:
            detail += f", {s['cases']} cases, mismatches={s.get('mismatches')}"
        if s.get("reason"):
            detail += f" ({s['reason']})"
        checks.append(_check(f"compute-sanitizer {key}", ok, detail, required))
    timing = data.get("timing") or {}
    rows = timing.get("rows") or []
    timed = [r for r in rows if "detgrid_ms" in r]
    checks.append(_check("timing table", bool(timed) if rows else None,
                         f"{len(timed)}/{len(rows)} workloads timed", required=False))
    return checks


def overall(checks: List[Dict[str, Any]], steps: List[Dict[str, Any]]) -> str:
    required = [c for c in checks if c["required"]]
    if any(c["result"] == "fail" for c in required) or any(s["status"] == "fail" for s in steps):
        return "FAIL"
    if steps and all(s["status"] == "dry-run" for s in steps):
        return "DRY-RUN"
    if any(c["result"] == "n/a" for c in required) or any(
            s["status"] in ("timeout", "skipped") for s in steps):
        return "INCOMPLETE"
    return "PASS"


def assemble_report(work: str, junit: Optional[str] = None) -> Dict[str, Any]:
    """Everything the steps left in work/ (and the junit xml) as one dict."""
    data: Dict[str, Any] = {"schema": 1}
    data["steps"] = read_steps(os.path.join(work, "steps.tsv"))
    data["env"] = _load_json(os.path.join(work, "env.json"))
    data["build"] = _load_json(os.path.join(work, "build.json"))
    data["tests"] = junit_summary(junit) if junit else {"present": False}
    data["sanitizer"] = {}
    for tool in ("memcheck", "racecheck", "initcheck"):
        s = _load_json(os.path.join(work, f"sanitizer_{tool}.json"))
        if s is not None:
            data["sanitizer"][tool] = s
    data["bitwise"] = _load_json(os.path.join(work, "bitwise.json"))
    data["timing"] = _load_json(os.path.join(work, "timing.json"))
    data["checks"] = verdict_checks(data)
    data["verdict"] = overall(data["checks"], data["steps"])
    return data


def _fmt(v: Any, spec: str = ".3g") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _shape(s: Optional[Sequence[int]]) -> str:
    return "×".join(str(d) for d in s) if s else "–"


def markdown_report(data: Dict[str, Any]) -> str:
    env = data.get("env") or {}
    lines = [f"# detgrid GPU check: {data.get('verdict')}", ""]
    if env:
        lines.append(
            f"{env.get('device_name', 'no GPU')} (sm {env.get('capability', '–')}, "
            f"{env.get('sm_count', '–')} SMs), torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
            f"{env.get('nvcc') or 'no nvcc'}, kernel {env.get('kernel_release')} "
            f"({env.get('runtime_guess')}), sources {str(env.get('sources_sha256'))[:12]}")
        if env.get("nvidia_smi"):
            lines.append(f"nvidia-smi: `{env['nvidia_smi']}`")
        lines.append("")
    lines += ["## Checks", "", "| check | result | detail |", "|---|---|---|"]
    for c in data.get("checks", []):
        mark = c["result"] + ("" if c["required"] else " (info)")
        lines.append(f"| {c['check']} | {mark} | {c['detail']} |")
    lines += ["", "## Steps", "", "| step | status | rc | s | limit s | note |", "|---|---|---|---|---|---|"]
    for s in data.get("steps", []):
        lines.append(f"| {s['name']} | {s['status']} | {_fmt(s['rc'])} | {_fmt(s['seconds'])} | "
                     f"{_fmt(s['limit_s'])} | {s['note']} |")
    tests = data.get("tests") or {}
    for f in tests.get("failed", [])[:10]:
        lines.append(f"- failed `{f['test']}`: {f['message']}")
    bw = data.get("bitwise") or {}
    if bw.get("executor"):
        lines += ["", "## Device vs host executor", "",
                  "| dtype | cases | bitwise equal | max abs diff | required |", "|---|---|---|---|---|"]
        for r in bw["executor"]:
            lines.append(f"| {r['dtype']} | {r['cases']} | {r['bitwise_equal']} | "
                         f"{_fmt(r['max_abs_diff'])} | {'yes' if r['must_be_equal'] else 'no'} |")
    rows = (data.get("timing") or {}).get("rows") or []
    if rows:
        clock = "CUDA events" if data["timing"].get("device") == "cuda" else "host clock"
        lines += ["", f"## Backward timing (median ms, {clock})", "",
                  "| workload | input | grid | dtype | mode·pad·ac | mask | stock ms | detgrid ms | "
                  "det/stock | extra peak MiB | rel err gI | rel err gG |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "detgrid_ms" not in r:
                lines.append(f"| {r['name']} | {r.get('error') or r.get('skipped')} |" + " |" * 10)
                continue
            mask = "".join("T" if m else "F" for m in r["output_mask"])
            lines.append(
                f"| {r['name']} | {_shape(r['input_shape'])} | {_shape(r['grid_shape'])} | "
                f"{r['dtype']} | {r['mode']}·{r['padding']}·{int(r['align_corners'])} | {mask} | "
                f"{_fmt(r['stock_ms'])} | {_fmt(r['detgrid_ms'])} | {_fmt(r['ratio'], '.2f')} | "
                f"{_fmt(r['extra_peak_mib'], '.1f')} | {_fmt(r['rel_err_grad_input'], '.1e')} | "
                f"{_fmt(r['rel_err_grad_grid'], '.1e')} |")
    return "\n".join(lines) + "\n"


def write_report(work: str, out: str, junit: Optional[str] = None) -> Dict[str, Any]:
    data = assemble_report(work, junit)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(jsonable(data), f, indent=1, default=str, allow_nan=False)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown_report(data))
    return data


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def jsonable(obj: Any) -> Any:
    """obj with non-finite floats as the strings "inf", "-inf", "nan", so the
    JSON stays standard (jq, browsers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def _write_json(path: Optional[str], data: Any) -> None:
    text = json.dumps(jsonable(data), indent=1, default=str, allow_nan=False)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text if len(text) < 6000 else text[:6000] + "\n...")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="detgrid.gpucheck", description=__doc__.splitlines()[0])
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
    sp = sub.add_parser("timing"); common(sp)
    sp.add_argument("--warmup", type=int, default=5)
    sp.add_argument("--reps", type=int, default=25)
    sp.add_argument("--scale", type=float, default=1.0)
    sp.add_argument("--workloads", default=",".join(WORKLOADS))
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
            print("mismatches with the host executor: " + ", ".join(result["mismatches"]))
        return 1 if result["mismatches"] else 0
    if args.cmd == "sanitize":
        result = run_sanitizer(args.tool, args.set, args.timeout, args.seed)
        print(result.pop("output_tail"))
        _write_json(args.json, result)
        return 1 if result["status"] in ("errors", "case_failed", "failed", "timeout") else 0
    if args.cmd == "report":
        data = write_report(args.work, args.out, args.junit)
        print(markdown_report(data))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
