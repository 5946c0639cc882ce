"""Benchmark workloads and test cases of detgrid's backward, and their timing.

The layer that the GPU check (detgrid.kit.gpucheck) and a benchmark command
share: Case is one call of grid_sampler_2d_backward or
grid_sampler_3d_backward (by the input's rank) with its inputs; Workload
(WORKLOADS) builds a benchmark's inputs from a seeded generator at any
scale; the small case sets exercise every mode, padding, dtype, layout and
both ranks; run_detgrid / run_stock run a case; sha256, bitwise_equal,
max_abs_diff and rel_err compare results; time_rotating times calls (CUDA
events on the GPU, the host clock on the CPU).

This module imports detgrid.ops (and with it the compiled extension) only
when a case is run, so the rest works where the extension did not build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

# Spatial dimensions of the backwards: grid_sampler_2d_backward and
# grid_sampler_3d_backward.
DIMS = (2, 3)
MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

Gradients = Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]


def backward_name(dim: int) -> str:
    """The dim-D backward's name, the same in aten and in detgrid.ops."""
    return f"grid_sampler_{dim}d_backward"


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
    """One call of grid_sampler_2d_backward (4-D input) or
    grid_sampler_3d_backward (5-D input), inputs included."""

    name: str
    grad_output: torch.Tensor
    input: torch.Tensor
    grid: torch.Tensor
    interpolation_mode: int
    padding_mode: int
    align_corners: bool
    output_mask: Tuple[bool, bool]

    @property
    def dim(self) -> int:
        """Spatial dimensions: 2 or 3."""
        return self.input.dim() - 2

    @property
    def op(self) -> str:
        return backward_name(self.dim)

    def args(self) -> tuple:
        return (self.grad_output, self.input, self.grid, self.interpolation_mode,
                self.padding_mode, self.align_corners, list(self.output_mask))

    def to(self, device: str) -> "Case":
        return dataclasses.replace(
            self, grad_output=self.grad_output.to(device), input=_move_input(self.input, device),
            grid=self.grid.to(device))


def channels_last(dim: int) -> torch.memory_format:
    """The channels-last memory format of a dim-D (spatial) input."""
    return torch.channels_last if dim == 2 else torch.channels_last_3d


def _move_input(t: torch.Tensor, device: str) -> torch.Tensor:
    """Keeps a stride-0 batch and channels_last(_3d) across devices."""
    if t.device.type == torch.device(device).type:
        return t
    if t.dim() >= 4 and t.size(0) > 1 and t.stride(0) == 0:
        return t[:1].to(device).expand(t.shape)  # stride-0 batch stays stride-0
    fmt = channels_last(t.dim() - 2)
    if t.is_contiguous(memory_format=fmt) and not t.is_contiguous():
        return t.to(device).contiguous(memory_format=fmt)
    return t.to(device)


@contextlib.contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """torch.use_deterministic_algorithms(on) for the block, restored after."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


def run_detgrid(case: Case, **options: Any) -> Gradients:
    """detgrid's backward in deterministic mode, the only mode in which
    detgrid.enable() routes to it, so its cost is what a user pays there
    (torch.utils.deterministic.fill_uninitialized_memory included). With
    options (detgrid.ops.*_with_options' level, block_size, max_blocks), that
    operator with them; else the default backward."""
    from detgrid import ops  # here, not at the top: it loads the extension

    with deterministic_algorithms(True):
        if options:
            return getattr(ops, case.op + "_with_options")(*case.args(), **options)
        return getattr(ops, case.op)(*case.args())


def _run_aten(case: Case, deterministic: bool) -> Gradients:
    """aten::grid_sampler_{2d,3d}_backward with deterministic algorithms set
    as asked, restored afterwards; None for a gradient not asked for."""
    with deterministic_algorithms(deterministic):
        gi, gg = getattr(torch.ops.aten, case.op)(*case.args())
    return (gi if case.output_mask[0] else None, gg if case.output_mask[1] else None)


def run_stock(case: Case) -> Gradients:
    """aten's own kernel, outside deterministic mode (it alerts there)."""
    return _run_aten(case, deterministic=False)


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
    y uniform (a 1-D table, as TensoRF's line factors); constant: every
    point at one place, a quarter pixel right of and below pixel (0, 0)'s
    centre, so all of a point's taps land on the same few pixels.
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
    if kind == "window":
        # One (h, w) window of whole-pixel offsets per batch item around a
        # random sub-pixel centre anywhere over the input's pixels (RAFT's
        # correlation lookup, radius (h-1)/2).
        in_h, in_w = input_hw
        centre = torch.rand(n, 1, 1, 2, generator=g) * torch.tensor(
            [float(in_w), float(in_h)]) - 0.5
        dy = torch.arange(h, dtype=torch.float32) - (h - 1) / 2
        dx = torch.arange(w, dtype=torch.float32) - (w - 1) / 2
        offsets = torch.stack(torch.broadcast_tensors(dx.view(1, w), dy.view(h, 1)), dim=-1)
        return _normalize(centre + offsets, (in_w, in_h), align_corners)
    if kind == "affine":
        # The identity under a random similarity per batch item: scale in
        # [1/extent, extent], rotation within +-0.3 rad, shift within +-0.1
        # (a learned STN affine; StyleGAN2-ADA's geometric augmentation).
        base = _identity_grid(n, h, w, align_corners)
        scale = torch.exp((torch.rand(n, generator=g) * 2 - 1) * math.log(max(extent, 1.0)))
        angle = (torch.rand(n, generator=g) * 2 - 1) * 0.3
        shift = (torch.rand(n, 2, generator=g) * 2 - 1) * 0.1
        cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
        mat = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
        return torch.einsum("nhwj,nij->nhwi", base, mat) + shift.view(n, 1, 1, 2)
    if kind == "clustered":
        return _clustered(n, h * w, 2, g, extent).view(n, h, w, 2)
    if kind == "constant":
        # A collapsed flow field, or an untrained spatial transformer's; off
        # the centre, so that a bilinear point's four taps all carry weight.
        return _normalize(torch.full((2,), 0.25), input_hw[::-1], align_corners).expand(
            n, h, w, 2).clone()
    raise ValueError(f"unknown grid kind {kind!r}")


def _normalize(pixels: torch.Tensor, sizes: Sequence[int], align_corners: bool) -> torch.Tensor:
    """Pixel coordinates (last dim x, y[, z]) to grid_sample's [-1, 1]."""
    size = torch.tensor([float(s) for s in sizes])
    if align_corners:
        return pixels * 2 / (size - 1).clamp(min=1) - 1
    return (pixels * 2 + 1) / size - 1


def _clustered(n: int, points: int, dims: int, g: torch.Generator,
               extent: float = 1.0) -> torch.Tensor:
    """(n, points, dims) in [-1, 1]: three quarters of the points near 8
    random centres per batch item (sigma 0.05 * extent), a quarter uniform,
    as importance-sampled boundary points or rays through an occupied region."""
    centres = torch.rand(n, 8, dims, generator=g) * 1.6 - 0.8
    pick = torch.randint(0, 8, (n, points, 1), generator=g).expand(n, points, dims)
    near = centres.gather(1, pick) + torch.randn(n, points, dims, generator=g) * 0.05 * extent
    uniform = torch.rand(n, points, dims, generator=g) * 2 - 1
    use_uniform = torch.rand(n, points, 1, generator=g) < 0.25
    return torch.where(use_uniform, uniform, near).clamp(-1, 1)


def make_grid_3d(kind: str, n: int, d: int, h: int, w: int, input_dhw: Tuple[int, int, int],
                 align_corners: bool, g: torch.Generator, extent: float = 1.0) -> torch.Tensor:
    """A float32 grid (n, d, h, w, 3) on the CPU (last dim x, y, z).

    random: uniform in [-extent, extent]; smooth: the identity warp plus
    about 1.5 voxels of noise; clustered: as _clustered.
    """
    if kind == "random":
        return (torch.rand(n, d, h, w, 3, generator=g) * 2 - 1) * extent
    if kind == "smooth":
        zs, ys, xs = (_axis(s, align_corners) for s in (d, h, w))
        base = torch.stack(torch.broadcast_tensors(
            xs.view(1, 1, w), ys.view(1, h, 1), zs.view(d, 1, 1)), dim=-1)
        step = torch.tensor([2.0 / max(s, 1) for s in reversed(input_dhw)])
        return base.expand(n, d, h, w, 3) + torch.randn(n, d, h, w, 3, generator=g) * 1.5 * step
    if kind == "clustered":
        return _clustered(n, d * h * w, 3, g, extent).view(n, d, h, w, 3)
    raise ValueError(f"unknown 3-D grid kind {kind!r}")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A benchmark workload (see shared BENCHMARKS.md), at full size.

    2-D (input N, C, H, W; grid N, H', W', 2) or 3-D (input N, C, D, H, W;
    grid N, D', H', W', 3; mode "bilinear" is trilinear there). build(device,
    seed, scale) makes its inputs from a seeded generator (random data,
    never zeros): every dimension but the last of the grid (and dimensions
    of size one) is multiplied by scale. row is the BENCHMARKS.md row.
    """

    name: str
    source: str
    input_shape: Tuple[int, ...]
    grid_shape: Tuple[int, ...]
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
    row: int = 0

    @property
    def dim(self) -> int:
        """Spatial dimensions: 2 or 3."""
        return len(self.input_shape) - 2

    @property
    def taps(self) -> int:
        return TAPS[(self.mode, self.dim)]

    @property
    def layout(self) -> str:
        if self.channels_last:
            return "channels_last"
        return "stride-0 batch" if self.expanded_batch else "contiguous"

    @property
    def mode_label(self) -> str:
        return mode_name(self.mode, self.dim)

    def shapes(self, scale: float = 1.0) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        inp = tuple(_scaled(d, scale) for d in self.input_shape)
        spatial = tuple(_scaled(d, scale) for d in self.grid_shape[1:-1])
        return inp, (inp[0],) + spatial + (self.grid_shape[-1],)

    def records(self, scale: float = 1.0) -> int:
        """records(case) of the case build(scale) makes, without making it."""
        if not self.output_mask[0]:
            return 0
        return math.prod(self.shapes(scale)[1][:-1]) * self.taps

    def build(self, device: str = "cpu", seed: int = 0, scale: float = 1.0,
              output_mask: Optional[Tuple[bool, bool]] = None) -> Case:
        g = torch.Generator().manual_seed(seed)
        in_shape, grid_shape = self.shapes(scale)
        n, c = in_shape[:2]
        spatial, out_spatial = in_shape[2:], grid_shape[1:-1]
        inp = torch.randn(1 if self.expanded_batch else n, c, *spatial,
                          generator=g).to(self.dtype)
        if self.expanded_batch:
            inp = inp.expand(in_shape)
        if self.channels_last:
            inp = inp.contiguous(memory_format=channels_last(self.dim))
        if self.dim == 2:
            grid = make_grid(self.grid_kind, n, *out_spatial, tuple(spatial), self.align_corners,
                             g, self.extent)
        else:
            grid = make_grid_3d(self.grid_kind, n, *out_spatial, tuple(spatial),
                                self.align_corners, g, self.extent)
        case = Case(
            name=self.name,
            grad_output=torch.randn(n, c, *out_spatial, generator=g).to(self.dtype),
            input=inp,
            grid=grid.to(self.dtype),
            interpolation_mode=MODES[self.mode],
            padding_mode=PADDINGS[self.padding],
            align_corners=self.align_corners,
            output_mask=tuple(output_mask or self.output_mask),
        )
        return case.to(device)


_B, _Z, _BO, _R = "bilinear", "zeros", "border", "reflection"
_IN_GRID, _IN, _GRID = (True, True), (True, False), (False, True)

# The benchmark matrix of shared BENCHMARKS.md, in its row order: one
# workload per pyramid level for the multi-level rows (#1, #2, #4: each
# level is its own grid_sample call there), plus the variants it lists
# (channels_last of #5 and #10, bf16 of #1). Rows #16-#18 are 3-D.
_BENCH_BASE = [
    Workload("rtdetr_l80", "BENCHMARKS #1 (level 80x80)", (128, 32, 80, 80), (128, 500, 4, 2),
             _B, _Z, False, _IN_GRID, "random", load="sparse", row=1),
    Workload("rtdetr_l40", "BENCHMARKS #1 (level 40x40)", (128, 32, 40, 40), (128, 500, 4, 2),
             _B, _Z, False, _IN_GRID, "random", load="~1.25/cell", row=1),
    Workload("rtdetr_l20", "BENCHMARKS #1 (level 20x20)", (128, 32, 20, 20), (128, 500, 4, 2),
             _B, _Z, False, _IN_GRID, "random", load="~5/cell", row=1),
    Workload("mask2former_l128", "BENCHMARKS #2 (level 128x128)", (16, 32, 128, 128),
             (16, 21504, 4, 2), _B, _Z, False, _IN_GRID, "random", load="~5/cell", row=2),
    Workload("mask2former_l64", "BENCHMARKS #2 (level 64x64)", (16, 32, 64, 64),
             (16, 21504, 4, 2), _B, _Z, False, _IN_GRID, "random", load="~21/cell", row=2),
    Workload("mask2former_l32", "BENCHMARKS #2 (level 32x32)", (16, 32, 32, 32), (16, 21504, 4, 2),
             _B, _Z, False, _IN_GRID, "random", load="zoom ~84/cell", row=2),
    Workload("rfdetr_deform_attn", "BENCHMARKS #3", (64, 16, 40, 40), (64, 3900, 2, 2),
             _B, _Z, False, _IN_GRID, "random", load="~5/cell", row=3),
    Workload("raft_corr_l0", "BENCHMARKS #4 (level 46x62)", (17112, 1, 46, 62), (17112, 9, 9, 2),
             _B, _Z, True, _IN, "window", load="local 9x9 window", row=4),
    Workload("raft_corr_l3", "BENCHMARKS #4 (level 5x7)", (17112, 1, 5, 7), (17112, 9, 9, 2),
             _B, _Z, True, _IN, "window", load="9x9 window over a 5x7 map", row=4),
    Workload("basicvsr_flow_warp", "BENCHMARKS #5", (4, 64, 64, 64), (4, 64, 64, 2),
             _B, _Z, True, _IN_GRID, "smooth", load="smooth", row=5),
    Workload("monodepth2_grid_only", "BENCHMARKS #6", (12, 3, 192, 640), (12, 192, 640, 2),
             _B, _BO, False, _GRID, "smooth", load="smooth, grid only", row=6),
    Workload("stn_mnist", "BENCHMARKS #7", (64, 1, 28, 28), (64, 28, 28, 2),
             _B, _Z, False, _GRID, "affine", extent=1.25, load="learned affine, grid only",
             row=7),
    Workload("stylegan2_ada_augment", "BENCHMARKS #8", (8, 3, 524, 524), (8, 524, 524, 2),
             _B, _Z, False, _IN, "affine", extent=1.25, load="smooth, scale 0.8-1.25", row=8),
    Workload("mask2former_point_loss", "BENCHMARKS #9", (40, 1, 256, 256), (40, 12544, 1, 2),
             _B, _Z, False, _IN, "clustered", load="clustered", row=9),
    Workload("eg3d_triplane", "BENCHMARKS #10", (12, 32, 256, 256), (12, 1, 196608, 2),
             _B, _Z, False, _IN, "random", load="~3/cell", row=10),
    Workload("tensorf_line", "BENCHMARKS #11", (1, 48, 300, 1), (1, 1000000, 1, 2),
             _B, _Z, True, _IN, "line", load=">1000/cell", row=11),
    Workload("kplanes_proposal", "BENCHMARKS #12", (1, 8, 128, 128), (1, 1000000, 1, 2),
             _B, _BO, True, _IN, "random", extent=0.5, load="~250/cell", row=12),
    Workload("liif_nearest", "BENCHMARKS #13", (16, 576, 48, 48), (16, 1, 2304, 2),
             "nearest", _Z, False, _IN, "random", load="random, large C", row=13),
    Workload("positional_table_c1024", "BENCHMARKS #14 (stride-0 batch)", (8, 1024, 31, 31),
             (8, 64, 64, 2), _B, _Z, False, _IN_GRID, "zoom", extent=0.28,
             expanded_batch=True, load="zoom ~50/cell", row=14),
    Workload("rgb_warp_bicubic_fp16", "BENCHMARKS #15", (16, 3, 224, 224), (16, 224, 224, 2),
             "bicubic", _R, False, _IN_GRID, "smooth", dtype=torch.float16, load="smooth",
             row=15),
    Workload("voxelmorph_warp_3d", "BENCHMARKS #16", (1, 3, 80, 96, 112), (1, 80, 96, 112, 3),
             _B, _Z, True, _IN_GRID, "smooth", load="smooth 3D", row=16),
    Workload("dvgo_dense_grid_3d", "BENCHMARKS #17", (1, 12, 160, 160, 160),
             (1, 1, 1, 1000000, 3), _B, _Z, True, _IN, "clustered", load="clustered", row=17),
    Workload("simplebev_lift_3d", "BENCHMARKS #18", (6, 128, 1, 56, 100), (6, 200, 8, 200, 3),
             _B, _Z, False, _IN, "random", load="zoom ~57/cell", row=18),
    # Not a BENCHMARKS.md row: the degenerate grid of issue 33, where every
    # point lands at one place, so each of the 2x2 input's pixels takes one
    # tap of every point (1,048,576 records each).
    Workload("constant_grid", "issue 33 (every point at one place)", (1, 3, 2, 2),
             (1, 1024, 1024, 2), _B, _Z, False, _IN, "constant",
             load="1,048,576 per pixel"),
]

# The variants BENCHMARKS.md asks for, each listed right after its base:
# base name -> (name suffix, what differs, the changed fields).
_BENCH_VARIANTS = {
    "rtdetr_l20": ("_bf16", "bf16 variant", dict(dtype=torch.bfloat16)),
    "basicvsr_flow_warp": ("_cl", "channels_last variant", dict(channels_last=True)),
    "eg3d_triplane": ("_cl", "channels_last variant", dict(channels_last=True)),
}


def _with_variants(base: Sequence[Workload]) -> List[Workload]:
    workloads = []
    for workload in base:
        workloads.append(workload)
        if workload.name in _BENCH_VARIANTS:
            suffix, what, changes = _BENCH_VARIANTS[workload.name]
            workloads.append(dataclasses.replace(
                workload, name=workload.name + suffix,
                source=f"{workload.source}, {what}", **changes))
    return workloads


BENCH_WORKLOADS: Dict[str, Workload] = {w.name: w for w in _with_variants(_BENCH_BASE)}

# The GPU check's timing set (detgrid.kit.gpucheck timing): eight of the above.
GPUCHECK_WORKLOADS = ("rtdetr_l80", "mask2former_l32", "basicvsr_flow_warp", "tensorf_line",
                      "positional_table_c1024", "rgb_warp_bicubic_fp16",
                      "monodepth2_grid_only", "liif_nearest")
WORKLOADS: Dict[str, Workload] = {name: BENCH_WORKLOADS[name] for name in GPUCHECK_WORKLOADS}


# --------------------------------------------------------------------------
# What a workload asks of the backward
# --------------------------------------------------------------------------

# Input cells one grid point touches, by (mode, spatial dims): "bilinear"
# is trilinear in 3-D, "bicubic" tricubic.
TAPS = {("bilinear", 2): 4, ("nearest", 2): 1, ("bicubic", 2): 16,
        ("bilinear", 3): 8, ("nearest", 3): 1, ("bicubic", 3): 64}


def mode_name(mode: str, dim: int) -> str:
    """A mode as users call it: "bilinear" is trilinear in 3-D, "bicubic"
    tricubic."""
    if dim == 3 and mode in ("bilinear", "bicubic"):
        return "tri" + mode[2:]
    return mode


def modes(dim: int) -> List[str]:
    """The interpolation modes of the dim-D backward, on either device."""
    return [mode for mode, d in TAPS if d == dim]


def records(case: Case) -> int:
    """Records the deterministic backward sorts: points x taps when
    grad_input is asked for, else 0 (the grid gradient needs none)."""
    if not case.output_mask[0]:
        return 0
    mode = {v: k for k, v in MODES.items()}[case.interpolation_mode]
    points = case.grid.numel() // case.grid.shape[-1]
    return points * TAPS[(mode, case.dim)]


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def work_counters(case: Case, level: Optional[str] = None) -> Dict[str, int]:
    """detgrid.ops.work_counters of this case at the core's build ``level``
    (detgrid.levels.CORE_BUILDS; the whole stack by default): what the CUDA
    backward launches, sorts and allocates, the same on every machine. The
    fields that where the points land decides (longest_fold, reduce_items,
    record_visits) are counted for a CPU case and -1 for any other: its
    shapes alone are counted."""
    from detgrid import ops

    on_cpu = case.grid.device.type == "cpu"
    tensors = (case.grad_output, case.input, case.grid)
    return ops.work_counters(
        *(tensors if on_cpu else map(_meta_like, tensors)),
        case.interpolation_mode, case.padding_mode, case.align_corners,
        list(case.output_mask), **({"level": level} if level else {}))


def full_size_case(workload: "Workload") -> Case:
    """The workload's case at full size (scale 1) with the layout build()
    gives it, on the meta device: its shapes, strides and dtype, nothing
    allocated."""
    in_shape, grid_shape = workload.shapes()
    n, c = in_shape[:2]
    inp = torch.empty((1 if workload.expanded_batch else n,) + in_shape[1:],
                      dtype=workload.dtype, device="meta")
    if workload.expanded_batch:
        inp = inp.expand(in_shape)
    if workload.channels_last:
        inp = inp.contiguous(memory_format=channels_last(workload.dim))
    return Case(
        name=workload.name,
        grad_output=torch.empty((n, c) + grid_shape[1:-1], dtype=workload.dtype, device="meta"),
        input=inp,
        grid=torch.empty(grid_shape, dtype=workload.dtype, device="meta"),
        interpolation_mode=MODES[workload.mode],
        padding_mode=PADDINGS[workload.padding],
        align_corners=workload.align_corners,
        output_mask=workload.output_mask,
    )


def full_size_work_counters(workload: "Workload", level: Optional[str] = None) -> Dict[str, int]:
    """work_counters of the workload at full size, from its shapes alone
    (full_size_case), at the core's build ``level`` (the whole stack by
    default)."""
    return work_counters(full_size_case(workload), level)


def samples_per_cell(case: Case) -> Dict[str, float]:
    """How many grid points land in each input cell that any point lands in
    (nearest cell, per batch item), mean and max: the contention stock's
    atomicAdd sees. Points outside the input are left out."""
    spatial = list(case.input.shape[2:])
    n = case.input.shape[0]
    coords = case.grid.detach().double().reshape(n, -1, len(spatial))  # x, y[, z]
    sizes = torch.tensor(list(reversed(spatial)), dtype=torch.float64, device=coords.device)
    if case.align_corners:
        pix = (coords + 1) / 2 * (sizes - 1)
    else:
        pix = ((coords + 1) * sizes - 1) / 2
    idx = pix.round()
    inside = ((idx >= 0) & (idx < sizes) & idx.isfinite()).all(-1)
    idx = torch.where(inside.unsqueeze(-1), idx, torch.zeros_like(idx)).long()
    key = torch.arange(n, device=idx.device).view(n, 1)
    for axis in reversed(range(len(spatial))):  # z (or y) outermost, x innermost
        key = key * int(sizes[axis]) + idx[..., axis]
    key = key[inside]
    if key.numel() == 0:
        return {"mean": 0.0, "max": 0.0}
    counts = torch.unique(key, return_counts=True)[1]
    return {"mean": float(key.numel()) / counts.numel(), "max": float(counts.max())}


def takes_cudnn(mode: str, padding: str, align_corners: bool, input_shape: Sequence[int],
                dtype: torch.dtype, grid_numel: Optional[int] = None) -> bool:
    """Whether stock grid_sample takes cuDNN on CUDA (when cuDNN is there and
    enabled): bilinear, zeros, align_corners=True, 4-D, C <= 1024, float16,
    float32 or float64 (not bfloat16), 32-bit indexable, non-empty: aten's
    cond_cudnn_grid_sampler and the check in grid_sampler."""
    numel = math.prod(input_shape)
    limit = 2**31 - 1
    return (mode == "bilinear" and padding == "zeros" and align_corners
            and len(input_shape) == 4 and input_shape[1] <= 1024
            and dtype in (torch.float16, torch.float32, torch.float64)
            and 0 < numel <= limit and (grid_numel is None or 0 < grid_numel <= limit))


def run_cudnn(case: Case) -> Gradients:
    """Stock's cuDNN backward (aten::cudnn_grid_sampler_backward), outside
    deterministic mode (it alerts there). cuDNN always computes both
    gradients; the ones not asked for are dropped here."""
    with deterministic_algorithms(False):
        gi, gg = torch.ops.aten.cudnn_grid_sampler_backward(case.input, case.grid,
                                                            case.grad_output)
    return (gi if case.output_mask[0] else None, gg if case.output_mask[1] else None)


def run_in_tree(case: Case) -> Gradients:
    """aten::grid_sampler_{2d,3d}_backward under deterministic algorithms:
    on a torch carrying the ATen change this is the in-tree deterministic
    kernel (on stock torch it raises on CUDA)."""
    return _run_aten(case, deterministic=True)


def contiguous_case(case: Case) -> Case:
    """The case with contiguous input, grid and grad_output (what cuDNN's
    grid sampler wants)."""
    return dataclasses.replace(case, grad_output=case.grad_output.contiguous(),
                               input=case.input.contiguous(), grid=case.grid.contiguous())


def _clone_keeping_layout(t: torch.Tensor) -> torch.Tensor:
    if t.dim() >= 4 and t.size(0) > 1 and t.stride(0) == 0:
        return t[:1].clone().expand(t.shape)  # a stride-0 batch stays stride-0
    return t.clone()  # preserve_format: channels_last stays channels_last


def case_bytes(case: Case) -> int:
    """Bytes of memory the case's tensors occupy (a stride-0 batch once)."""
    return sum(t.untyped_storage().nbytes() for t in (case.grad_output, case.input, case.grid))


def rotation_copies(case: Case, cache_bytes: int, max_copies: int = 128) -> List[Case]:
    """The case and copies of it (same values, own memory), enough that
    cycling through them touches over twice cache_bytes between two uses of
    one copy, so no timed call finds its inputs in the cache the previous
    call left (at least two copies when cache_bytes > 0; one when 0)."""
    if cache_bytes <= 0:
        return [case]
    need = max(2, math.ceil(2 * cache_bytes / max(case_bytes(case), 1)))
    copies = [case]
    for _ in range(min(need, max_copies) - 1):
        copies.append(dataclasses.replace(
            case, grad_output=_clone_keeping_layout(case.grad_output),
            input=_clone_keeping_layout(case.input), grid=case.grid.clone()))
    return copies


_SPECIAL_XY = [
    (math.nan, 0.1), (0.2, math.nan), (math.inf, 0.0), (-math.inf, 0.3),
    (1e38, -1e38), (-1e38, 0.5), (math.inf, -math.inf), (math.nan, math.nan),
    (0.3, 1e38), (-0.7, -math.inf),
]
# 3-D: the same x, y over an in-range z, then points whose x, y are in
# range and only z is not (the third axis takes its own path to an index).
_SPECIAL_XYZ = [(x, y, 0.1) for x, y in _SPECIAL_XY] + [
    (0.1, -0.2, math.nan), (0.4, 0.0, math.inf), (-0.3, 0.6, -math.inf),
    (0.2, 0.2, 1e38), (-0.5, 0.1, -1e38),
]


def special_grid(grid: torch.Tensor) -> torch.Tensor:
    """Puts NaN, +-Inf and +-1e38 into the first points of a (n, h, w, 2)
    or (n, d, h, w, 3) grid."""
    specials = _SPECIAL_XY if grid.shape[-1] == 2 else _SPECIAL_XYZ
    flat = grid.reshape(-1, grid.shape[-1])
    for i, point in enumerate(specials[: flat.shape[0]]):
        flat[i] = torch.tensor(point, dtype=flat.dtype)
    return grid


def _small_case(name: str, mode: str, padding: str, align: bool, dtype: torch.dtype,
                g: torch.Generator, *, shape=(2, 3, 7, 9), grid_size=(5, 6), extent=1.3,
                mask=(True, True), special=False) -> Case:
    """A case with random data: input shape (n, c, [d,] h, w), grid
    (n, *grid_size, len(grid_size)) uniform in [-extent, extent]."""
    n, c = shape[:2]
    grid = (torch.rand(n, *grid_size, len(grid_size), generator=g) * 2 - 1) * extent
    if special:
        grid = special_grid(grid)
    return Case(
        name=name,
        grad_output=torch.randn(n, c, *grid_size, generator=g).to(dtype),
        input=torch.randn(*shape, generator=g).to(dtype),
        grid=grid.to(dtype),
        interpolation_mode=MODES[mode],
        padding_mode=PADDINGS[padding],
        align_corners=align,
        output_mask=tuple(mask),
    )


# Grid sizes whose records just pass the core's 2^19 records per chunk
# (detgrid.ops.CORE_CHUNK_RECORDS), so that a call sorts and sums two chunks:
# 131,328 bilinear points (4 taps), 32,896 bicubic ones (16), 65,792
# trilinear ones (8), 525,312 nearest ones (1) and 8,481 tricubic ones (64).
_TWO_CHUNKS = {("bilinear", 2): (256, 513), ("bicubic", 2): (128, 257),
               ("bilinear", 3): (2, 128, 257), ("nearest", 3): (4, 256, 513),
               ("bicubic", 3): (1, 33, 257)}


def sanitizer_cases(set_name: str = "all", seed: int = 0) -> List[Case]:
    """CPU cases for the memory checker, 2-D then 3-D: every mode x padding,
    finite and non-finite/huge grids, masks, dtypes, layouts and calls of two
    chunks (_TWO_CHUNKS; in float16 their sums wait in the float scratch).
    "tiny": one colliding case per rank."""
    g = torch.Generator().manual_seed(seed)
    if set_name == "tiny":
        return [_small_case("tiny_bilinear_zeros_collide", "bilinear", "zeros", False,
                            torch.float32, g, shape=(1, 2, 3, 3), grid_size=(8, 8), extent=0.9),
                _small_case("tiny_3d_trilinear_zeros_collide", "bilinear", "zeros", False,
                            torch.float32, g, shape=(1, 2, 3, 3, 3), grid_size=(4, 4, 4),
                            extent=0.9)]
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
    two_bilinear, two_bicubic = _TWO_CHUNKS[("bilinear", 2)], _TWO_CHUNKS[("bicubic", 2)]
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
        # A small input: runs of thousands of records, summed in stored partials.
        _small_case("bilinear_zeros_multichunk", "bilinear", "zeros", False, torch.float32, g,
                    shape=(1, 2, 11, 13), grid_size=two_bilinear, extent=1.1),
        _small_case("bicubic_reflection_multichunk_special", "bicubic", "reflection", True,
                    torch.float32, g, shape=(1, 2, 11, 13), grid_size=two_bicubic,
                    special=True),
        _small_case("bilinear_border_f16_multichunk", "bilinear", "border", False,
                    torch.float16, g, shape=(1, 3, 11, 13), grid_size=two_bilinear),
        # A larger input: many short runs.
        _small_case("bilinear_reflection_f16_multichunk_special", "bilinear", "reflection",
                    True, torch.float16, g, shape=(1, 2, 130, 140), grid_size=two_bilinear,
                    special=True),
    ]
    cl = _small_case("bilinear_zeros_channels_last", "bilinear", "zeros", True, torch.float32, g,
                     shape=(2, 5, 7, 9))
    cl.input = cl.input.contiguous(memory_format=torch.channels_last)
    ex = _small_case("bilinear_zeros_expanded", "bilinear", "zeros", False, torch.float32, g,
                     shape=(3, 4, 6, 6))
    ex.input = ex.input[:1].expand(3, 4, 6, 6)
    cases += [cl, ex]
    return cases + _sanitizer_cases_3d(g)


def _sanitizer_cases_3d(g: torch.Generator) -> List[Case]:
    """sanitizer_cases' 3-D part."""
    f32, tri = torch.float32, "bilinear"
    small = dict(shape=(2, 3, 5, 6, 7), grid_size=(3, 4, 5))
    cases = []
    for mode in modes(3):
        for padding in PADDINGS:
            for special in (False, True):
                tag = "special" if special else "finite"
                cases.append(_small_case(f"3d_{mode_name(mode, 3)}_{padding}_{tag}", mode,
                                         padding, special, f32, g, special=special, **small))
    two_trilinear = _TWO_CHUNKS[("bilinear", 3)]
    cases += [
        _small_case("3d_trilinear_zeros_gi_only", tri, "zeros", False, f32, g,
                    mask=(True, False), **small),
        _small_case("3d_nearest_border_gg_only", "nearest", "border", True, f32, g,
                    mask=(False, True), special=True, **small),
        _small_case("3d_trilinear_reflection_f64_special", tri, "reflection", False,
                    torch.float64, g, special=True, **small),
        _small_case("3d_trilinear_zeros_f16_special", tri, "zeros", False, torch.float16, g,
                    special=True, **small),
        _small_case("3d_nearest_border_bf16", "nearest", "border", True, torch.bfloat16, g,
                    **small),
        _small_case("3d_trilinear_zeros_multichunk", tri, "zeros", False, f32, g,
                    shape=(1, 2, 9, 11, 13), grid_size=two_trilinear, extent=1.1),
        _small_case("3d_trilinear_reflection_multichunk_special", tri, "reflection", True,
                    f32, g, shape=(1, 2, 16, 32, 40), grid_size=two_trilinear, special=True),
        _small_case("3d_trilinear_border_f16_multichunk", tri, "border", False, torch.float16,
                    g, shape=(1, 3, 20, 40, 48), grid_size=two_trilinear),
        _small_case("3d_nearest_zeros_multichunk", "nearest", "zeros", False, f32, g,
                    shape=(1, 2, 16, 16, 20), grid_size=_TWO_CHUNKS[("nearest", 3)]),
        _small_case("3d_tricubic_border_multichunk_special", "bicubic", "border", False, f32,
                    g, shape=(1, 2, 6, 7, 8), grid_size=_TWO_CHUNKS[("bicubic", 3)],
                    special=True),
    ]
    cl = _small_case("3d_trilinear_zeros_channels_last", tri, "zeros", True, f32, g,
                     shape=(2, 5, 4, 6, 7), grid_size=(3, 4, 5))
    cl.input = cl.input.contiguous(memory_format=torch.channels_last_3d)
    ex = _small_case("3d_trilinear_zeros_expanded", tri, "zeros", False, f32, g,
                     shape=(3, 4, 4, 5, 5), grid_size=(3, 4, 5))
    ex.input = ex.input[:1].expand(3, 4, 4, 5, 5)
    return cases + [cl, ex]


# host_match_cases' (input shape, grid size) per kind of case, by spatial dims.
_HOST_MATCH_SHAPES = {
    2: {"plain": ((2, 5, 13, 17), (24, 20)), "zoom": ((2, 4, 6, 7), (40, 40)),
        "special": ((2, 3, 8, 8), (9, 9))},
    3: {"plain": ((2, 3, 6, 7, 9), (6, 8, 10)), "zoom": ((2, 4, 3, 4, 4), (8, 10, 10)),
        "special": ((2, 3, 4, 4, 4), (3, 4, 5))},
}


def host_match_cases(dtype: torch.dtype, seed: int = 0, dim: int = 2) -> List[Case]:
    """Small dim-D cases for equality of the device and host builds: every mode x
    padding x align_corners, some points out of bounds, plus zoom-in (many
    points per cell) and non-finite grids."""
    g = torch.Generator().manual_seed(seed)
    shapes = _HOST_MATCH_SHAPES[dim]
    prefix = "" if dim == 2 else "3d_"
    cases = []
    for mode in modes(dim):
        label = prefix + mode_name(mode, dim)
        shape, size = shapes["plain"]
        for padding in PADDINGS:
            for align in (False, True):
                cases.append(_small_case(f"{label}_{padding}_{'ac' if align else 'nac'}", mode,
                                         padding, align, dtype, g, shape=shape,
                                         grid_size=size, extent=1.2))
        shape, size = shapes["zoom"]
        cases.append(_small_case(f"{label}_zeros_zoom", mode, "zeros", False, dtype, g,
                                 shape=shape, grid_size=size, extent=0.8))
        shape, size = shapes["special"]
        cases.append(_small_case(f"{label}_reflection_special", mode, "reflection", True, dtype,
                                 g, shape=shape, grid_size=size, special=True))
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


def time_rotating(fns: Sequence[Callable[[Case], Any]], cases: Sequence[Case], device: str,
                  warmup: int, reps: int,
                  before: Optional[Sequence[Optional[Callable[[], Any]]]] = None,
                  fn_cases: Optional[Sequence[Optional[Sequence[Case]]]] = None
                  ) -> List[List[float]]:
    """Milliseconds of each fn(case) per rep, the fns interleaved rep by
    rep; every call (warm-up too) takes the next copy in turn, so with
    rotation_copies no call runs on inputs the call before left in the
    cache. fn_cases[i], if given, is fn i's own list of copies (as many as
    cases, e.g. contiguous ones); before[i], if given, runs before fn i's
    timed region (outside it), e.g. to set deterministic mode. CUDA events
    on the GPU (the time between the two events on the stream, launch gaps
    included), the host clock on the CPU."""
    count = [0]
    lists = [(own if own is not None else cases)
             for own in (fn_cases if fn_cases is not None else [None] * len(fns))]
    if any(len(own) != len(cases) for own in lists):
        raise ValueError("every fn needs as many copies as cases")

    def next_case(i: int) -> Case:
        case = lists[i][count[0] % len(cases)]
        count[0] += 1
        return case

    prep = list(before) if before is not None else [None] * len(fns)
    for _ in range(warmup):
        for i, (fn, pre) in enumerate(zip(fns, prep)):
            if pre is not None:
                pre()
            fn(next_case(i))
    synchronize(device)
    times: List[List[float]] = [[] for _ in fns]
    if torch.device(device).type == "cuda":
        events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(reps)] for _ in fns]
        for r in range(reps):
            for i, (fn, pre) in enumerate(zip(fns, prep)):
                if pre is not None:
                    pre()
                case = next_case(i)
                start, end = events[i][r]
                start.record()
                fn(case)
                end.record()
        torch.cuda.synchronize()
        for i in range(len(fns)):
            times[i] = [s.elapsed_time(e) for s, e in events[i]]
    else:
        for _ in range(reps):
            for i, (fn, pre) in enumerate(zip(fns, prep)):
                if pre is not None:
                    pre()
                case = next_case(i)
                t0 = time.perf_counter()
                fn(case)
                times[i].append((time.perf_counter() - t0) * 1e3)
    return times


def peak_bytes(fn: Callable[[], Any], device: str) -> Optional[int]:
    """Memory fn allocates at its peak beyond what was allocated before
    (torch.cuda.max_memory_allocated); None off CUDA."""
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
