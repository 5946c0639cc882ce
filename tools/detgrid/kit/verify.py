"""`detgrid verify`: the kit's main job on its embedded default cases.

Runs the deterministic backward K times (K >= 2) on a high-collision 2-D case
and a 3-D one (zoom-in grids: many sample points per input pixel or voxel,
the case where stock's atomicAdd order varies most), hashes every result,
compares it with stock, and on CUDA also with the host build, which must
agree bit for bit.

float16 and bfloat16 are checked where each claim means something: the
hashes as for any dtype; agreement with stock run in float64 on the same
(rounded) inputs, since detgrid sums grad_input in float32 and rounds once
while stock in the dtype itself rounds at every step (TOLERANCES), and
grad_grid, which is stock's own arithmetic in the dtype, within stock's
accuracy of that float64 result (GRID_TOLERANCES); and no bitwise claim
against the host build, which is made for float32 and float64 only. Their
grids sit on quarter pixels, where float64 takes the taps and weights that
the dtype's forward takes (see on_quarter_pixels).
"""

import dataclasses
from typing import Dict, List, Optional

import torch

from detgrid import ops
from detgrid.kit.bitwise import same_bits_or_both_nan
from detgrid.bench.workloads import sha256

MODES = (0, 0, False)  # bilinear, zeros, align_corners=False

# max |deterministic - stock| / max |stock|, by dtype. float32 and float64:
# two summation orders. float16 and bfloat16: about two unit roundoffs
# (2^-11, 2^-8) against a float64 stock: detgrid's one rounding of each
# result, and the coordinates and weights it rounds to the dtype as stock's
# forward does. (Measured on the cases below, on quarter-pixel grids: 3.7e-4
# and 2.9e-3.)
TOLERANCES = {"torch.float64": 1e-12, "torch.float32": 1e-5,
              "torch.float16": 1e-3, "torch.bfloat16": 8e-3}
# grad_grid in float16 and bfloat16 against float64 stock: stock's CUDA
# arithmetic, sums over channels rounded to the dtype at every step, so
# stock's accuracy, not one rounding. (Measured on the cases below: 1.5e-3 and
# 1.2e-2; stock's CPU kernel in the dtype, 1.4e-3 and 9.1e-3.)
GRID_TOLERANCES = {"torch.float16": 4e-3, "torch.bfloat16": 3e-2}
REDUCED_PRECISION = (torch.float16, torch.bfloat16)
REDUCED_NAMES = tuple(str(dtype) for dtype in REDUCED_PRECISION)


@dataclasses.dataclass(frozen=True)
class VerifyCase:
    """One bilinear/zeros call: input (N, C, SIZE, ...) sampled by a grid
    (N, OUT, ..., dims) that zooms into its centre, so about
    (OUT / (ZOOM * SIZE))^dims points land in each input cell."""

    dims: int
    batch: int
    channels: int
    size: int
    out: int
    zoom: float = 0.25

    @property
    def samples_per_cell(self) -> int:
        return round((self.out / (self.zoom * self.size)) ** self.dims)

    @property
    def stock(self):
        return getattr(torch.ops.aten, f"grid_sampler_{self.dims}d_backward")

    @property
    def deterministic(self):
        return getattr(ops, f"grid_sampler_{self.dims}d_backward")

    def describe(self) -> str:
        spatial = ", ".join([str(self.size)] * self.dims)
        out = "x".join([str(self.out)] * self.dims)
        return (f"grid_sampler_{self.dims}d backward, input ({self.batch}, {self.channels}, "
                f"{spatial}), {out} zoom-in grid (~{self.samples_per_cell} points per input "
                f"{'pixel' if self.dims == 2 else 'voxel'})")


CASES = (VerifyCase(dims=2, batch=2, channels=8, size=32, out=64),
         VerifyCase(dims=3, batch=2, channels=4, size=8, out=16))


@dataclasses.dataclass
class VerifyResult:
    case: str
    device: str
    dtype: str
    runs: int
    deterministic_hashes: List[str]
    stock_hashes: List[str]
    max_rel_diff_vs_stock: float
    equals_host_build: Optional[bool]
    # float16 and bfloat16: grad_grid's, apart (max_rel_diff_vs_stock is then
    # grad_input's); None for float32 and float64.
    grid_max_rel_diff_vs_stock: Optional[float] = None

    @property
    def distinct_deterministic(self) -> int:
        return len(set(self.deterministic_hashes))

    @property
    def distinct_stock(self) -> int:
        return len(set(self.stock_hashes))

    @property
    def ok(self) -> bool:
        tolerance = TOLERANCES[self.dtype]
        return (
            self.distinct_deterministic == 1
            and self.max_rel_diff_vs_stock <= tolerance
            and (self.grid_max_rel_diff_vs_stock is None
                 or self.grid_max_rel_diff_vs_stock <= GRID_TOLERANCES[self.dtype])
            and self.equals_host_build is not False
        )

    def to_dict(self) -> Dict:
        data = dataclasses.asdict(self)
        data.update(
            distinct_deterministic=self.distinct_deterministic,
            distinct_stock=self.distinct_stock,
            ok=self.ok,
        )
        return data


def default_case(case: VerifyCase, device: str, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    spatial = [case.size] * case.dims
    out = [case.out] * case.dims
    input = torch.randn(case.batch, case.channels, *spatial, generator=generator, dtype=dtype)
    theta = torch.cat((case.zoom * torch.eye(case.dims, dtype=dtype),
                       torch.zeros(case.dims, 1, dtype=dtype)), dim=1)
    grid = torch.nn.functional.affine_grid(
        theta.expand(case.batch, case.dims, case.dims + 1),
        (case.batch, case.channels, *out), align_corners=False)
    grid = grid + 0.01 * torch.randn(grid.shape, generator=generator, dtype=dtype)
    if dtype in REDUCED_PRECISION:
        grid = on_quarter_pixels(grid, case.size)
    grad_output = torch.randn(case.batch, case.channels, *out, generator=generator, dtype=dtype)
    return grad_output.to(device), input.to(device), grid.to(device)


def on_quarter_pixels(grid: torch.Tensor, size: int) -> torch.Tensor:
    """The grid moved to the nearest quarter pixel (align_corners=False, every side
    `size`). There the coordinates, and the bilinear and trilinear weights (products of
    quarters), are exact in float16 and bfloat16: the forward that the dtype computes
    (its coordinates and weights rounded to the dtype, as stock's CUDA forward rounds
    them, and detgrid's backward with it) is then the same function as in float64,
    and stock in float64 is its gradient. Elsewhere a rounded coordinate can take
    another cell, and the float64 gradient is of another function."""
    pixel = ((grid.double() + 1) * size - 1) / 2
    pixel = torch.round(pixel * 4) / 4
    return ((2 * pixel + 1) / size - 1).to(grid.dtype)


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() and ops.has_cuda_kernels() else "cpu"


def verify_case(case: VerifyCase, device: str = "auto", runs: int = 10,
                dtype: torch.dtype = torch.float32) -> VerifyResult:
    if runs < 2:
        raise ValueError(f"verify needs at least 2 runs to compare their hashes, got {runs}")
    device = resolve_device(device)
    args = default_case(case, device, dtype)
    deterministic = [case.deterministic(*args, *MODES, (True, True)) for _ in range(runs)]
    stock = [case.stock(*args, *MODES, [True, True]) for _ in range(runs)]
    # Stock at reduced precision is no yardstick (see the module docstring).
    reference = stock[0] if dtype not in REDUCED_PRECISION else case.stock(
        *[t.double() for t in args], *MODES, [True, True])
    rel_diffs = [((d.double() - r.double()).abs().max() / r.double().abs().max()).item()
                 for d, r in zip(deterministic[0], reference)]
    reduced = dtype in REDUCED_PRECISION
    equals_cpu = None
    if device != "cpu" and dtype not in REDUCED_PRECISION:
        cpu_args = [t.cpu() for t in args]
        cpu = case.deterministic(*cpu_args, *MODES, (True, True))
        equals_cpu = all(same_bits_or_both_nan(c, d) for c, d in zip(cpu, deterministic[0]))
    return VerifyResult(
        case=case.describe(),
        device=device,
        dtype=str(dtype),
        runs=runs,
        deterministic_hashes=[sha256(*grads) for grads in deterministic],
        stock_hashes=[sha256(*grads) for grads in stock],
        max_rel_diff_vs_stock=rel_diffs[0] if reduced else max(rel_diffs),
        equals_host_build=equals_cpu,
        grid_max_rel_diff_vs_stock=rel_diffs[1] if reduced else None,
    )


def verify(device: str = "auto", runs: int = 10,
           dtype: torch.dtype = torch.float32) -> List[VerifyResult]:
    return [verify_case(case, device, runs, dtype) for case in CASES]


def format_result(result: VerifyResult) -> str:
    lines = [f"detgrid verify: {result.case}, bilinear/zeros, {result.dtype}, on {result.device}"]
    reference = "stock" if result.dtype not in REDUCED_NAMES else "stock in float64"
    if result.device == "cpu":
        lines.append("  no CUDA here: the host build ran (the CUDA source hostified: its math and order)")
    which = "" if result.grid_max_rel_diff_vs_stock is None else " (grad_input)"
    lines += [
        f"  deterministic: {result.distinct_deterministic} distinct SHA-256 over {result.runs} runs "
        f"({result.deterministic_hashes[0][:16]}...)",
        f"  stock:         {result.distinct_stock} distinct SHA-256 over {result.runs} runs",
        f"  max |deterministic - {reference}| / max |{reference}|{which} = "
        f"{result.max_rel_diff_vs_stock:.3g} (at most {TOLERANCES[result.dtype]:g})",
    ]
    if result.grid_max_rel_diff_vs_stock is not None:
        lines.append(f"  the same for grad_grid, stock's arithmetic in {result.dtype[6:]} = "
                     f"{result.grid_max_rel_diff_vs_stock:.3g} "
                     f"(at most {GRID_TOLERANCES[result.dtype]:g})")
    if result.equals_host_build is not None:
        lines.append(f"  CUDA result == host build bit for bit: {result.equals_host_build}")
    lines.append("  OK" if result.ok else "  FAILED")
    return "\n".join(lines)
