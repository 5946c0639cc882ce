"""Golden corpus of detgrid's default backward: cases, inputs, digests.

detgrid.ops.grid_sampler_{2d,3d}_backward, the default deterministic
backward (the whole stack of the core, detgrid.levels.TOP, for grad_input;
the grid-gradient kernel for grad_grid; stock's kernel for a CPU call that
asks for grad_grid alone), promises bits, not just values. digests.json,
next to this file, holds the SHA-256 of its two outputs for every case below
on CPU tensors (the host build), computed from the code as it was when the
table was written; tests/test_golden.py recomputes them. A change meant for
speed must leave every digest as it is. (core_digests.json holds the core's
own grad_input digests of the same inputs: golden/core.py.)

Inputs depend on numpy's PCG64 bit stream and IEEE arithmetic only, never on
torch's random generators or on numpy's transcendental functions (whose last
bit varies with the platform's SIMD code): each case has its own
np.random.Generator(np.random.PCG64(seed)), seed = the first 8 bytes of
SHA-256(case name); uniform draws are (raw >> 11) * 2**-53 of the raw 64-bit
outputs; everything else is +, -, *, /, floor and ldexp of those in float64.
The float64 values reach their dtype through float32: numpy rounds float64 to
float32, torch.from_numpy(...).to(dtype) rounds that to float16/bfloat16,
both round-to-nearest-even.

Terminology as in GridSamplerDeterministic.cu: a point is one output
location, a tap one input pixel (voxel) a point reads, a record one (point,
tap) pair, a run the records of one grad_input position; a run's records
after its first CORE_PARTIAL_RECORDS are summed in stored partials.

The case names seed the inputs and key core_digests.json, so they keep the
words of the implementation the corpus was first written for, which planned
"dense" and "sparse" reductions, tiles and chunks of 4096 points ("chunks",
"tile_boundary", "chunk_boundary"), chunks of 8192 ("chunks8192") and grain
sizes ("grain"): read them as labels ("dense" and "sparse" name the matrix's
input shapes below). Each case's description says what it is today.

Usage:
  python tests/golden/corpus.py            rewrite digests.json from today's code
  python tests/golden/corpus.py --check    recompute and compare, write nothing
  ... --threads N                          torch.set_num_threads(N) first
  ... --level L --block-size B --max-blocks M
                                           (with --check) grad_input by
                                           grid_sampler_*_backward_with_options
"""

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from typing import Optional

import numpy as np
import torch

from detgrid import ops

DIGESTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digests.json")

MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
TAPS_PER_AXIS = {"bilinear": 2, "nearest": 1, "bicubic": 4}
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
GRID_KINDS = ("uniform", "zoom", "exact", "mixed", "nonfinite")
LAYOUTS = ("contiguous", "channels_last")
GRID_LAYOUTS = ("contiguous", "strided")
GRAD_OUTPUTS = ("random", "expanded", "expanded_channel")

# The digest of an output the op did not compute (output_mask False: None).
NONE_DIGEST = "none"

_INT_VIEW = {
    torch.float16: (torch.int16, "<i2"),
    torch.bfloat16: (torch.int16, "<i2"),
    torch.float32: (torch.int32, "<i4"),
    torch.float64: (torch.int64, "<i8"),
}


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One call of the backward. in_size / out_size are the spatial sizes,
    outermost first: (H, W) in 2-D, (D, H, W) in 3-D."""

    name: str
    dims: int
    mode: str
    padding: str
    align_corners: bool
    dtype: str
    N: int
    C: int
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    grid: str = "mixed"
    # Memory layout of input and grad_output ("channels_last" is
    # channels_last_3d for 5-D tensors).
    layout: str = "contiguous"
    # "strided": the grid is a view with a non-unit last-dimension stride.
    grid_layout: str = "contiguous"
    # "expanded": one value, all strides 0; "expanded_channel": stride 0 in C.
    grad_output: str = "random"
    output_mask: tuple[bool, bool] = (True, True)
    # zoom grids: the share of points that land in the hot cell, and
    # optionally the window [first, end) of point indices that may.
    hot_fraction: float = 0.7
    hot_window: Optional[tuple[int, int]] = None
    note: str = ""

    def __post_init__(self):
        assert self.dims in (2, 3), self
        assert len(self.in_size) == len(self.out_size) == self.dims, self
        assert self.mode in MODES and self.padding in PADDINGS, self
        assert self.dtype in DTYPES and self.grid in GRID_KINDS, self
        assert self.layout in LAYOUTS and self.grid_layout in GRID_LAYOUTS, self
        assert self.grad_output in GRAD_OUTPUTS, self
        if self.grid == "zoom" or self.grid == "mixed":
            assert min(self.in_size) >= 3, f"{self.name}: the hot cell needs 3 pixels"

    @property
    def taps(self) -> int:
        return TAPS_PER_AXIS[self.mode] ** self.dims

    @property
    def points(self) -> int:
        return self.N * math.prod(self.out_size)

    @property
    def pixels(self) -> int:
        """grad_input positions: N times the input's spatial size."""
        return self.N * math.prod(self.in_size)

    @property
    def records(self) -> int:
        """Records grad_input's sums sort: points x taps; none without grad_input."""
        return self.points * self.taps if self.output_mask[0] else 0

    @property
    def core_chunks(self) -> int:
        """The core's chunks (one radix sort each): CORE_CHUNK_RECORDS records
        per chunk (no case has the more than 256 channels that shrink them)."""
        return -(-self.records // ops.CORE_CHUNK_RECORDS)

    @property
    def description(self) -> str:
        size = "x".join
        parts = [
            (f"{self.dims}-D {self.mode} {self.padding} "
             f"align_corners={self.align_corners} {self.dtype}"),
            f"input {self.N}x{self.C}x{size(map(str, self.in_size))} {self.layout}",
            f"grid {size(map(str, self.out_size))} {self.grid}"
            + (" strided" if self.grid_layout == "strided" else ""),
            f"grad_output {self.grad_output}",
            f"output_mask {list(self.output_mask)}",
        ]
        if self.output_mask[0]:
            parts.append(f"{self.records} records on {self.pixels} pixels, "
                         f"{self.core_chunks} chunk(s) of the core")
        else:
            parts.append("grad_grid alone: stock's kernel on CPU")
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)


def _size(k, align_corners):
    """A spatial size for which pixel-centre and edge coordinates normalize
    exactly: 2**k for align_corners=False, 2**k + 1 for True."""
    return 2 ** k + int(align_corners)


def _sizes(exponents, align_corners):
    return tuple(_size(k, align_corners) for k in exponents)


# Shapes of the mode x padding x align_corners matrix, two per rank, named
# as the case names name them: a "dense" shape has fewer pixels than a call
# of any mode has records (most pixels receive many), a "sparse" one more
# (most receive few or none); checked by the tests:
#   2-D dense:  2 x (8|9)^2 = 128|162 pixels <= 240 points
#   2-D sparse: (32|33)^2 = 1024|1089 pixels > 63 points * 16 taps
#   3-D dense:  2 x (4|5)^3 = 128|250 pixels <= 280 points
#   3-D sparse: (16|17)^3 = 4096|4913 pixels > 60 points * 64 taps
_MATRIX_SHAPES = {
    (2, "dense"): dict(N=2, C=3, in_exp=(3, 3), out_size=(10, 12)),
    (2, "sparse"): dict(N=1, C=2, in_exp=(5, 5), out_size=(7, 9)),
    (3, "dense"): dict(N=2, C=2, in_exp=(2, 2, 2), out_size=(4, 5, 7)),
    (3, "sparse"): dict(N=1, C=2, in_exp=(4, 4, 4), out_size=(3, 4, 5)),
}

_DTYPE_CYCLE = ("float32", "float64", "float16", "bfloat16")


def _shaped(dims, label, align_corners):
    shape = dict(_MATRIX_SHAPES[(dims, label)])
    shape["in_size"] = _sizes(shape.pop("in_exp"), align_corners)
    return shape


def _build_cases():
    cases = []

    def add(name, **fields):
        cases.append(Case(name=name, **fields))

    # 1. Every (dims, mode, padding, align_corners), on mixed grids; the
    # dense shape for one align_corners and the sparse one for the other,
    # alternating with the padding, dtypes cycling.
    for dims in (2, 3):
        j = 0
        for mode in MODES:
            for p, padding in enumerate(PADDINGS):
                for align in (False, True):
                    label = ("dense", "sparse")[(p + align) % 2]
                    dtype = _DTYPE_CYCLE[j % 4]
                    j += 1
                    add(f"matrix_{dims}d_{mode}_{padding}_align{int(align)}_{dtype}_{label}",
                        dims=dims, mode=mode, padding=padding, align_corners=align,
                        dtype=dtype, **_shaped(dims, label, align))

    # 2. Every dtype on uniform grids, 2-D bicubic and 3-D trilinear.
    for dtype in DTYPES:
        add(f"dtype_2d_bicubic_reflection_uniform_{dtype}", dims=2, mode="bicubic",
            padding="reflection", align_corners=False, dtype=dtype, N=2, C=2,
            in_size=(6, 10), out_size=(9, 11), grid="uniform")
        add(f"dtype_3d_bilinear_border_uniform_{dtype}", dims=3, mode="bilinear",
            padding="border", align_corners=True, dtype=dtype, N=1, C=3,
            in_size=(5, 6, 7), out_size=(4, 6, 8), grid="uniform")

    # 3. Zoom grids of several thousand points, most of them in one cell, in
    # every dtype: the hot cell's corners take runs of thousands of records
    # (stored partials, Half and BFloat16 summed in float), beside pixels
    # that take few. 2-D bilinear on 2 x 12 x 16 and on 160 x 128.
    for dtype in DTYPES:
        add(f"chunks_2d_bilinear_dense_{dtype}", dims=2, mode="bilinear",
            padding="zeros", align_corners=False, dtype=dtype, N=2, C=3,
            in_size=(12, 16), out_size=(64, 80), grid="zoom")
        add(f"chunks_2d_bilinear_sparse_{dtype}", dims=2, mode="bilinear",
            padding="border", align_corners=True, dtype=dtype, N=1, C=2,
            in_size=(160, 128), out_size=(100, 100), grid="zoom")
    # 20000 and 12800 points.
    add("chunks8192_2d_bilinear_sparse_float32", dims=2, mode="bilinear",
        padding="reflection", align_corners=False, dtype="float32", N=1, C=2,
        in_size=(192, 192), out_size=(100, 200), grid="zoom")
    add("chunks8192_2d_bilinear_dense_float16", dims=2, mode="bilinear",
        padding="zeros", align_corners=True, dtype="float16", N=1, C=2,
        in_size=(12, 16), out_size=(100, 200), grid="zoom")
    add("chunks8192_2d_nearest_sparse_bfloat16", dims=2, mode="nearest",
        padding="border", align_corners=False, dtype="bfloat16", N=2, C=2,
        in_size=(64, 72), out_size=(80, 80), grid="zoom")
    add("chunks_2d_bicubic_dense_float16", dims=2, mode="bicubic",
        padding="reflection", align_corners=True, dtype="float16", N=1, C=2,
        in_size=(9, 9), out_size=(64, 72), grid="mixed")
    add("chunks_2d_bicubic_sparse_bfloat16", dims=2, mode="bicubic",
        padding="zeros", align_corners=False, dtype="bfloat16", N=1, C=1,
        in_size=(256, 320), out_size=(64, 72), grid="zoom")
    # 3-D: 6272 points on 8^3 voxels and on 32 x 32 x 40.
    for dtype in ("float32", "float16", "bfloat16"):
        add(f"chunks_3d_bilinear_dense_{dtype}", dims=3, mode="bilinear",
            padding="zeros", align_corners=False, dtype=dtype, N=1, C=2,
            in_size=(8, 8, 8), out_size=(8, 28, 28), grid="zoom")
        add(f"chunks_3d_bilinear_sparse_{dtype}", dims=3, mode="bilinear",
            padding="reflection", align_corners=True, dtype=dtype, N=1, C=2,
            in_size=(32, 32, 40), out_size=(8, 28, 28), grid="zoom")
    add("chunks_3d_nearest_sparse_float64", dims=3, mode="nearest",
        padding="border", align_corners=False, dtype="float64", N=1, C=2,
        in_size=(16, 16, 20), out_size=(8, 28, 28), grid="zoom")
    add("chunks_3d_bicubic_dense_float16", dims=3, mode="bicubic",
        padding="border", align_corners=True, dtype="float16", N=1, C=1,
        in_size=(5, 5, 5), out_size=(4, 32, 40), grid="mixed")
    add("chunks_3d_bicubic_sparse_float32", dims=3, mode="bicubic",
        padding="zeros", align_corners=False, dtype="float32", N=1, C=1,
        in_size=(64, 64, 80), out_size=(4, 32, 40), grid="zoom")

    # 4. Hot pixels: runs of far more than 256 records on one pixel (voxel).
    add("hot_2d_nearest_one_pixel_float32", dims=2, mode="nearest",
        padding="zeros", align_corners=False, dtype="float32", N=1, C=2,
        in_size=(16, 16), out_size=(64, 96), grid="zoom", hot_fraction=0.9,
        note="about 5500 records on one pixel")
    add("hot_2d_bilinear_tile_boundary_sparse_float32", dims=2, mode="bilinear",
        padding="zeros", align_corners=False, dtype="float32", N=1, C=2,
        in_size=(192, 192), out_size=(64, 128), grid="zoom", hot_fraction=1.0,
        hot_window=(3800, 4500),
        note="points 3800..4499 in one cell: runs of 700 records on its corners")
    for dtype in ("float32", "float16"):
        add(f"hot_2d_bilinear_chunk_boundary_dense_{dtype}", dims=2, mode="bilinear",
            padding="border", align_corners=False, dtype=dtype, N=1, C=2,
            in_size=(64, 64), out_size=(64, 128), grid="zoom", hot_fraction=1.0,
            hot_window=(3800, 4500),
            note="points 3800..4499 in one cell: runs of 700 records on its corners")
    add("hot_2d_bicubic_border_float64", dims=2, mode="bicubic",
        padding="border", align_corners=True, dtype="float64", N=1, C=1,
        in_size=(9, 17), out_size=(48, 100), grid="zoom", hot_fraction=0.8)
    add("hot_3d_nearest_one_voxel_bfloat16", dims=3, mode="nearest",
        padding="reflection", align_corners=False, dtype="bfloat16", N=1, C=2,
        in_size=(4, 8, 8), out_size=(4, 32, 40), grid="zoom", hot_fraction=0.9)
    add("hot_3d_bilinear_tile_boundary_float64", dims=3, mode="bilinear",
        padding="zeros", align_corners=True, dtype="float64", N=1, C=2,
        in_size=(5, 9, 9), out_size=(4, 32, 48), grid="zoom", hot_fraction=1.0,
        hot_window=(3900, 4400),
        note="points 3900..4399 in one cell: runs of 500 records on its corners")

    # 5. Non-finite grid coordinates (NaN, +Inf, -Inf), every padding.
    for dims in (2, 3):
        for p, padding in enumerate(PADDINGS):
            align = p == 1
            label = ("dense", "sparse")[p % 2]
            dtype = ("float32", "float64", "float16")[(p + dims) % 3]
            add(f"nonfinite_{dims}d_bilinear_{padding}_{dtype}_{label}", dims=dims,
                mode="bilinear", padding=padding, align_corners=align, dtype=dtype,
                grid="nonfinite", **_shaped(dims, label, align))
    for dims, mode, padding, dtype, label in (
            (2, "nearest", "reflection", "bfloat16", "sparse"),
            (2, "bicubic", "zeros", "float32", "dense"),
            (2, "bicubic", "reflection", "float64", "sparse"),
            (3, "nearest", "zeros", "float32", "dense"),
            (3, "bicubic", "border", "float64", "dense"),
            (3, "bicubic", "reflection", "float32", "sparse")):
        add(f"nonfinite_{dims}d_{mode}_{padding}_{dtype}_{label}", dims=dims,
            mode=mode, padding=padding, align_corners=False, dtype=dtype,
            grid="nonfinite", **_shaped(dims, label, False))
    add("nonfinite_2d_bilinear_chunks_sparse_float16", dims=2, mode="bilinear",
        padding="reflection", align_corners=True, dtype="float16", N=1, C=2,
        in_size=(160, 128), out_size=(100, 100), grid="nonfinite")

    # 6. output_mask: grad_input only, grad_grid only.
    for dims, mode, mask, dtype, label in (
            (2, "bilinear", (True, False), "float32", "dense"),
            (2, "bicubic", (True, False), "float64", "sparse"),
            (2, "bicubic", (False, True), "float32", "dense"),
            (2, "nearest", (False, True), "float16", "sparse"),
            (3, "bilinear", (True, False), "bfloat16", "sparse"),
            (3, "nearest", (True, False), "float32", "dense"),
            (3, "nearest", (False, True), "float64", "dense"),
            (3, "bilinear", (False, True), "float32", "sparse")):
        # A grid-only call on CPU runs stock's kernel (one writer per
        # element, so deterministic mode leaves it as it is): its digest is
        # stock's bits.
        name = (f"mask_input_only_{dims}d_{mode}_{dtype}_{label}" if mask[0]
                else f"mask_grid_only_{dims}d_{mode}_{dtype}")
        add(name, dims=dims, mode=mode,
            padding="border", align_corners=True, dtype=dtype, output_mask=mask,
            **_shaped(dims, label, True))
    add("mask_input_only_2d_bilinear_chunks_sparse_bfloat16", dims=2, mode="bilinear",
        padding="zeros", align_corners=False, dtype="bfloat16", N=1, C=2,
        in_size=(160, 128), out_size=(100, 100), grid="zoom", output_mask=(True, False))
    add("mask_grid_only_2d_bilinear_chunks_float32", dims=2, mode="bilinear",
        padding="zeros", align_corners=False, dtype="float32", N=2, C=3,
        in_size=(12, 16), out_size=(64, 80), grid="zoom", output_mask=(False, True))

    # 7. Memory layouts: channels_last input and grad_output, zero-stride
    # grad_output, a strided grid.
    for dims, mode, dtype, label in (
            (2, "bilinear", "float32", "dense"),
            (2, "bicubic", "float16", "sparse"),
            (3, "bilinear", "float64", "dense"),
            (3, "nearest", "bfloat16", "sparse"),
            (3, "bicubic", "float32", "dense")):
        add(f"layout_channels_last_{dims}d_{mode}_{dtype}_{label}", dims=dims,
            mode=mode, padding="reflection", align_corners=False, dtype=dtype,
            layout="channels_last", **_shaped(dims, label, False))
    add("layout_channels_last_2d_bilinear_chunks_sparse_bfloat16", dims=2,
        mode="bilinear", padding="zeros", align_corners=True, dtype="bfloat16", N=1,
        C=4, in_size=(160, 128), out_size=(100, 100), grid="zoom", layout="channels_last")
    for dims, mode, dtype, label, grad_output, layout in (
            (2, "bilinear", "float32", "dense", "expanded", "contiguous"),
            (2, "nearest", "float64", "sparse", "expanded_channel", "contiguous"),
            (2, "bicubic", "float16", "dense", "expanded", "channels_last"),
            (3, "bilinear", "bfloat16", "sparse", "expanded", "contiguous"),
            (3, "bicubic", "float32", "dense", "expanded_channel", "channels_last")):
        add(f"layout_{grad_output}_grad_output_{dims}d_{mode}_{dtype}_{label}"
            + ("_channels_last_input" if layout == "channels_last" else ""),
            dims=dims, mode=mode, padding="zeros", align_corners=True, dtype=dtype,
            grad_output=grad_output, layout=layout, **_shaped(dims, label, True))
    add("layout_expanded_grad_output_3d_bilinear_chunks_dense_float16", dims=3,
        mode="bilinear", padding="border", align_corners=False, dtype="float16", N=1,
        C=2, in_size=(8, 8, 8), out_size=(8, 28, 28), grid="zoom", grad_output="expanded")
    add("layout_strided_grid_2d_bicubic_float64_dense", dims=2, mode="bicubic",
        padding="border", align_corners=False, dtype="float64", grid_layout="strided",
        **_shaped(2, "dense", False))
    add("layout_strided_grid_3d_bilinear_float32_sparse", dims=3, mode="bilinear",
        padding="reflection", align_corners=True, dtype="float32",
        grid_layout="strided", **_shaped(3, "sparse", True))

    # 8. Exact pixel-centre / edge / half-pixel coordinates only.
    for dims, mode, padding, align, dtype in (
            (2, "bilinear", "zeros", False, "float32"),
            (2, "bilinear", "reflection", True, "bfloat16"),
            (2, "nearest", "border", False, "float16"),
            (2, "bicubic", "reflection", False, "float64"),
            (3, "nearest", "reflection", True, "float32"),
            (3, "bicubic", "zeros", True, "float64")):
        add(f"exact_{dims}d_{mode}_{padding}_align{int(align)}_{dtype}", dims=dims,
            mode=mode, padding=padding, align_corners=align, dtype=dtype, grid="exact",
            **_shaped(dims, "dense", align))

    # 9. More zoom grids, in 2-D and 3-D (named for the grain sizes an
    # earlier implementation ran them with).
    add("grain1_2d_bilinear_chunks_sparse_float32", dims=2, mode="bilinear",
        padding="border", align_corners=True, dtype="float32", N=1, C=2,
        in_size=(160, 128), out_size=(100, 100), grid="zoom")
    add("grain7_2d_bicubic_dense_float16", dims=2, mode="bicubic", padding="zeros",
        align_corners=False, dtype="float16", **_shaped(2, "dense", False))
    add("grain3_2d_nearest_hot_pixel_bfloat16", dims=2, mode="nearest",
        padding="zeros", align_corners=False, dtype="bfloat16", N=1, C=2,
        in_size=(16, 16), out_size=(64, 96), grid="zoom", hot_fraction=0.9)
    add("grain100000_3d_bilinear_chunks_sparse_float32", dims=3, mode="bilinear",
        padding="reflection", align_corners=True, dtype="float32", N=1, C=2,
        in_size=(32, 32, 40), out_size=(8, 28, 28), grid="zoom")

    names = [case.name for case in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"duplicate case names: {duplicates}"
    return tuple(sorted(cases, key=lambda case: case.name))


CASES = _build_cases()
CASES_BY_NAME = {case.name: case for case in CASES}


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def seed_of(name: str) -> int:
    """The case's seed: the first 8 bytes of SHA-256(name), little-endian."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


class Draws:
    """float64 draws from np.random.Generator(np.random.PCG64(seed)), made
    from the raw 64-bit outputs with exact or correctly rounded arithmetic
    only."""

    def __init__(self, seed: int):
        self.generator = np.random.Generator(np.random.PCG64(seed))

    def raw(self, n: int) -> np.ndarray:
        return np.asarray(self.generator.bit_generator.random_raw(n), dtype=np.uint64)

    def uniform(self, n: int) -> np.ndarray:
        """[0, 1), multiples of 2**-53 (what Generator.random draws)."""
        return (self.raw(n) >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)

    def integers(self, n: int, low: int, high: int) -> np.ndarray:
        """[low, high)."""
        span = high - low
        return np.minimum(np.floor(self.uniform(n) * span), span - 1).astype(np.int64) + low

    def signed(self, n: int, min_exp: int, max_exp: int) -> np.ndarray:
        """(-1, 1) times 2**k, k uniform in [min_exp, max_exp]: values over
        several binades, so that the order of a sum shows in its bits."""
        mantissa = self.uniform(n) * 2.0 - 1.0
        return np.ldexp(mantissa, self.integers(n, min_exp, max_exp + 1).astype(np.int32))


def pixel_to_grid(coord, size, align_corners):
    """Normalized grid coordinate of a pixel-unit coordinate (the inverse of
    grid_sampler_unnormalize)."""
    if align_corners:
        return coord * 2.0 / (size - 1) - 1.0
    return (2.0 * coord + 1.0) / size - 1.0


def _special_pixels(size):
    """Pixel coordinates where implementations part: centres, half-way
    points, the edges and beyond."""
    return np.array([0.0, 1.0, size - 1.0, size - 2.0, 0.5, size / 2.0, size - 1.5,
                     -0.5, size - 0.5, -1.0, size, -2.0, size + 1.0, 1.5, 2.0],
                    dtype=np.float64)


def _grid_axis(case: Case, draws: Draws, size: int, hot: np.ndarray) -> np.ndarray:
    n = case.points
    ac = case.align_corners
    uniform = draws.uniform(n) * 2.4 - 1.2
    special = pixel_to_grid(_special_pixels(size)[draws.integers(n, 0, 15)], size, ac)
    # The hot cell is [1, 2) in every axis.
    hot_coord = pixel_to_grid(1.0 + draws.uniform(n), size, ac)
    if case.grid == "uniform":
        return uniform
    if case.grid == "exact":
        return special
    if case.grid == "zoom":
        spread = pixel_to_grid(draws.uniform(n) * (size - 1), size, ac)
        return np.where(hot, hot_coord, spread)
    # mixed, nonfinite: per point, uniform, special or hot.
    pick = draws.uniform(n)
    return np.where(pick < 0.4, uniform, np.where(pick < 0.8, special, hot_coord))


def _grid(case: Case, draws: Draws) -> np.ndarray:
    n = case.points
    hot = draws.uniform(n) < case.hot_fraction
    if case.hot_window is not None:
        index = np.arange(n)
        hot &= (index >= case.hot_window[0]) & (index < case.hot_window[1])
    # The grid's last dimension is x, y(, z): innermost spatial size first.
    grid = np.stack([_grid_axis(case, draws, size, hot)
                     for size in reversed(case.in_size)], axis=-1)
    if case.grid == "nonfinite":
        replace = draws.uniform(grid.size).reshape(grid.shape) < 0.15
        which = draws.integers(grid.size, 0, 3).reshape(grid.shape)
        values = np.array([np.nan, np.inf, -np.inf])[which]
        grid = np.where(replace, values, grid)
    return grid.reshape(case.N, *case.out_size, case.dims)


def _to_torch(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float64:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(dtype)


def make_inputs(case: Case):
    """(grad_output, input, grid) of the case, with the case's layouts."""
    draws = Draws(seed_of(case.name))
    dtype = DTYPES[case.dtype]
    inp64 = draws.signed(case.N * case.C * math.prod(case.in_size), -2, 2)
    inp = _to_torch(inp64.reshape(case.N, case.C, *case.in_size), dtype)
    grid = _to_torch(_grid(case, draws), dtype)
    out_shape = (case.N, case.C, *case.out_size)
    if case.grad_output == "random":
        grad_output = _to_torch(draws.signed(math.prod(out_shape), -6, 6)
                                .reshape(out_shape), dtype)
    elif case.grad_output == "expanded":
        grad_output = _to_torch(draws.signed(1, -1, 1).reshape(()), dtype).expand(out_shape)
    else:  # expanded_channel
        one = (case.N, 1, *case.out_size)
        grad_output = _to_torch(draws.signed(math.prod(one), -6, 6).reshape(one),
                                dtype).expand(out_shape)
    if case.layout == "channels_last":
        memory_format = torch.channels_last if case.dims == 2 else torch.channels_last_3d
        inp = inp.contiguous(memory_format=memory_format)
        if case.grad_output == "random":
            grad_output = grad_output.contiguous(memory_format=memory_format)
    if case.grid_layout == "strided":
        storage = torch.zeros(*grid.shape[:-1], case.dims + 1, dtype=dtype)
        view = storage[..., 1:]
        view.copy_(grid)
        grid = view
    return grad_output, inp, grid


# ---------------------------------------------------------------------------
# Digests
# ---------------------------------------------------------------------------


def tensor_digest(t: Optional[torch.Tensor]) -> str:
    """SHA-256 of the raw little-endian bytes of `t` made contiguous; NONE_DIGEST
    for None."""
    if t is None:
        return NONE_DIGEST
    int_dtype, np_dtype = _INT_VIEW[t.dtype]
    raw = t.detach().cpu().contiguous().view(int_dtype).numpy()
    return hashlib.sha256(np.ascontiguousarray(raw, dtype=np_dtype).tobytes()).hexdigest()


def digest(grad_input, grad_grid) -> dict[str, str]:
    return {"grad_input": tensor_digest(grad_input), "grad_grid": tensor_digest(grad_grid)}


def run(case: Case, **options):
    """(grad_input, grad_grid) of the case by detgrid's default backward,
    detgrid.ops.grid_sampler_{2d,3d}_backward; with options (block_size,
    max_blocks, level), by grid_sampler_{2d,3d}_backward_with_options, whose
    grad_grid is the grid-gradient kernel's for a grid-only call too."""
    grad_output, inp, grid = make_inputs(case)
    name = f"grid_sampler_{case.dims}d_backward"
    op = getattr(ops, f"{name}_with_options" if options else name)
    return op(grad_output, inp, grid, MODES[case.mode], PADDINGS[case.padding],
              case.align_corners, list(case.output_mask), **options)


def compute(case: Case, **options) -> dict[str, str]:
    """The digests of the case's outputs (see run for `options`)."""
    return digest(*run(case, **options))


def table(**options) -> dict[str, dict[str, str]]:
    return {case.name: dict(compute(case, **options), description=case.description)
            for case in CASES}


def dumps(entries) -> str:
    return json.dumps(entries, sort_keys=True, indent=2) + "\n"


def load(path: str = DIGESTS_PATH) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="recompute and compare with digests.json; write nothing")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads first (0: leave as is)")
    parser.add_argument("--level", help="(with --check) this build of the core "
                        "(detgrid.levels.CORE_BUILDS)")
    parser.add_argument("--block-size", type=int, default=0,
                        help="(with --check) threads per block of the host build's launches")
    parser.add_argument("--max-blocks", type=int, default=0,
                        help="(with --check) blocks per launch of the host build")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    options = {k: v for k, v in (("level", args.level), ("block_size", args.block_size),
                                 ("max_blocks", args.max_blocks)) if v}
    if options and not args.check:
        parser.error("--level, --block-size and --max-blocks only with --check: the "
                     "table holds the default backward")
    entries = table(**options)
    if not args.check:
        with open(DIGESTS_PATH, "w") as f:
            f.write(dumps(entries))
        print(f"wrote {len(entries)} cases to {DIGESTS_PATH} "
              f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")
        return 0
    # The options shape grad_input; a grid-only call's grad_grid then comes from
    # the grid-gradient kernel, where the default runs stock's (run).
    keys = ("grad_input",) if options else ("grad_input", "grad_grid", "description")
    golden = load()
    differ = [name for name in sorted(set(golden) | set(entries))
              if {k: golden.get(name, {}).get(k) for k in keys}
              != {k: entries.get(name, {}).get(k) for k in keys}]
    for name in differ:
        print(f"DIFFERS {name}: table {golden.get(name)} now {entries.get(name)}")
    print(f"{len(entries) - len(differ)} of {len(entries)} cases match "
          f"({torch.get_num_threads()} threads, options {options}, comparing "
          f"{', '.join(keys)})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
