"""Where stock PyTorch's CPU backward cannot serve as a reference.

Stock's CPU grid_sampler_2d backward in float16 and bfloat16 goes wrong once
an element offset within one input plane, (H - 1) * stride_H + (W - 1) *
stride_W, passes 2^15 - 1, as if its vectorized kernel held offsets in
integers as narrow as the scalar. Seen on torch 2.13: right at 181x181 and
128x256, wrong (grad_input far off, Inf or NaN in grad_grid) at 182x182 and
128x257, and at 64x64 channels_last with 16 channels (the strides grow by
C); from about 400x400 it crashes with SIGSEGV in mask_gather. The 3-D
backward has no such limit. So nothing in detgrid compares with, or times,
stock's CPU half-precision 2-D backward on a larger input plane.
"""

import torch

from detgrid.bench.workloads import Workload, channels_last

STOCK_CPU_HALF_MAX_PLANE_OFFSET = 2**15 - 1
HALF_DTYPES = (torch.float16, torch.bfloat16)


def largest_plane_offset(input: torch.Tensor) -> int:
    """The largest element offset within one (n, c) plane of `input`."""
    return sum((size - 1) * stride for size, stride in zip(input.shape[2:], input.stride()[2:]))


def stock_cpu_backward_is_reliable(input: torch.Tensor) -> bool:
    """Whether stock's CPU backward gives the right result for an input of
    this shape, dtype and strides (its device is not looked at: a meta
    tensor will do)."""
    return (input.dim() != 4 or input.dtype not in HALF_DTYPES
            or largest_plane_offset(input) <= STOCK_CPU_HALF_MAX_PLANE_OFFSET)


def stock_cpu_workload_is_reliable(workload: Workload, scale: float) -> bool:
    """stock_cpu_backward_is_reliable for the input the workload builds at
    `scale`, without building it."""
    shape, _ = workload.shapes(scale)
    layout = channels_last(workload.dim) if workload.channels_last else torch.contiguous_format
    return stock_cpu_backward_is_reliable(
        torch.empty(shape, dtype=workload.dtype, device="meta", memory_format=layout))


SKIP_REASON = ("stock's CPU float16/bfloat16 2-D backward is wrong beyond 2^15 elements per "
               "input plane (and crashes from ~400x400): see detgrid.bench.stock_limits")
