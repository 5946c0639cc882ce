"""`detgrid verify`: the kit's main job on its embedded default case.

Runs the deterministic backward K times on a high-collision case (a zoom-in
grid: many sample points per input pixel, the case where stock's atomicAdd
order varies most), hashes every result, compares it with stock, and on CUDA
also with the host executor, which must agree bit for bit.
"""

import dataclasses
from typing import Dict, List, Optional

import torch

from detgrid import ops
from detgrid.workloads import sha256

# One 2-D bilinear/zeros call: input (N, C, H, W) sampled by a grid that
# zooms into its centre, so about (OUT / (ZOOM * SIZE))^2 = 64 points land
# in each input cell.
BATCH, CHANNELS, SIZE, OUT, ZOOM = 2, 8, 32, 64, 0.25
MODES = (0, 0, False)  # bilinear, zeros, align_corners=False


@dataclasses.dataclass
class VerifyResult:
    device: str
    dtype: str
    runs: int
    deterministic_hashes: List[str]
    stock_hashes: List[str]
    max_rel_diff_vs_stock: float
    equals_cpu_executor: Optional[bool]

    @property
    def distinct_deterministic(self) -> int:
        return len(set(self.deterministic_hashes))

    @property
    def distinct_stock(self) -> int:
        return len(set(self.stock_hashes))

    @property
    def ok(self) -> bool:
        tolerance = 1e-5 if self.dtype == "torch.float32" else 1e-12
        return (
            self.distinct_deterministic == 1
            and self.max_rel_diff_vs_stock <= tolerance
            and self.equals_cpu_executor is not False
        )

    def to_dict(self) -> Dict:
        data = dataclasses.asdict(self)
        data.update(
            distinct_deterministic=self.distinct_deterministic,
            distinct_stock=self.distinct_stock,
            ok=self.ok,
        )
        return data


def default_case(device: str, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input = torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=generator, dtype=dtype)
    theta = torch.tensor([[ZOOM, 0.0, 0.0], [0.0, ZOOM, 0.0]], dtype=dtype)
    grid = torch.nn.functional.affine_grid(
        theta.expand(BATCH, 2, 3), (BATCH, CHANNELS, OUT, OUT), align_corners=False)
    grid = grid + 0.01 * torch.randn(grid.shape, generator=generator, dtype=dtype)
    grad_output = torch.randn(BATCH, CHANNELS, OUT, OUT, generator=generator, dtype=dtype)
    return grad_output.to(device), input.to(device), grid.to(device)


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() and ops.has_cuda_kernels() else "cpu"


def verify(device: str = "auto", runs: int = 10, dtype: torch.dtype = torch.float32) -> VerifyResult:
    device = resolve_device(device)
    args = default_case(device, dtype)
    deterministic = [ops.grid_sampler_2d_backward(*args, *MODES, (True, True)) for _ in range(runs)]
    stock = [torch.ops.aten.grid_sampler_2d_backward(*args, *MODES, [True, True]) for _ in range(runs)]
    max_diff = max(
        ((d - s).abs().max() / s.abs().max()).item()
        for d, s in zip(deterministic[0], stock[0])
    )
    equals_cpu = None
    if device != "cpu":
        cpu_args = [t.cpu() for t in args]
        cpu = ops.grid_sampler_2d_backward(*cpu_args, *MODES, (True, True))
        equals_cpu = sha256(*cpu) == sha256(*deterministic[0])
    return VerifyResult(
        device=device,
        dtype=str(dtype),
        runs=runs,
        deterministic_hashes=[sha256(*grads) for grads in deterministic],
        stock_hashes=[sha256(*grads) for grads in stock],
        max_rel_diff_vs_stock=max_diff,
        equals_cpu_executor=equals_cpu,
    )


def format_result(result: VerifyResult) -> str:
    lines = [
        f"detgrid verify: grid_sampler_2d backward, bilinear/zeros, {result.dtype}, "
        f"input ({BATCH}, {CHANNELS}, {SIZE}, {SIZE}), {OUT}x{OUT} zoom-in grid "
        f"(~{round((OUT / (ZOOM * SIZE)) ** 2)} points per input pixel), on {result.device}",
    ]
    if result.device == "cpu":
        lines.append("  no CUDA here: the host executor ran (the same math and order as the CUDA kernel)")
    lines += [
        f"  deterministic: {result.distinct_deterministic} distinct SHA-256 over {result.runs} runs "
        f"({result.deterministic_hashes[0][:16]}...)",
        f"  stock:         {result.distinct_stock} distinct SHA-256 over {result.runs} runs",
        f"  max |deterministic - stock| / max |stock| = {result.max_rel_diff_vs_stock:.3g}",
    ]
    if result.equals_cpu_executor is not None:
        lines.append(f"  CUDA result == host executor bit for bit: {result.equals_cpu_executor}")
    lines.append("  OK" if result.ok else "  FAILED")
    return "\n".join(lines)
