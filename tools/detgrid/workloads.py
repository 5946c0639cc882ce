"""Benchmark workloads and test cases of detgrid's backward, and their timing.

The layer that the GPU check (detgrid.gpucheck) and a benchmark command
share: Case is one call of grid_sampler_2d_backward with its inputs;
Workload (WORKLOADS) builds a benchmark's inputs from a seeded generator at
any scale; the small case sets exercise every mode, padding, dtype and
layout; run_detgrid / run_stock run a case; sha256, bitwise_equal,
max_abs_diff and rel_err compare results; time_workload times stock against
detgrid (CUDA events on the GPU, the host clock on the CPU).

This module imports detgrid.ops (and with it the compiled extension) only
when a case is run, so the rest works where the extension did not build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

Gradients = Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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
    from detgrid import ops  # here, not at the top: it loads the extension

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
# Comparisons
# --------------------------------------------------------------------------


def sha256(*tensors: Optional[torch.Tensor]) -> Optional[str]:
    """SHA-256 over the bytes of the tensors, one after the other (several
    gradients get one hash); None where a tensor is None (an output not
    asked for)."""
    if any(t is None for t in tensors):
        return None
    digest = hashlib.sha256()
    for t in tensors:
        data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()


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
    synchronize(device)
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
        "dtype": dtype_name(case.input.dtype),
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
    synchronize(device)
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
