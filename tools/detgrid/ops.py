"""The deterministic grid_sampler backward as plain functions."""

from typing import Optional, Sequence, Tuple

import torch

import detgrid._C  # noqa: F401  (registers torch.ops.detgrid)

Gradients = Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]

INTERPOLATION_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDING_MODES = {"zeros": 0, "border": 1, "reflection": 2}


def grid_sampler_2d_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: Sequence[bool],
) -> Gradients:
    """Deterministic (grad_input, grad_grid) with the contract of
    torch.ops.aten.grid_sampler_2d_backward; an output not asked for in
    output_mask is None."""
    return torch.ops.detgrid.grid_sampler_2d_backward(
        grad_output, input, grid, interpolation_mode, padding_mode,
        align_corners, list(output_mask))


def grid_sampler_2d_backward_with_options(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: Sequence[bool],
    *,
    chunk_points: int = 0,
    block_size: int = 0,
    max_blocks: int = 0,
    grain_size: int = 0,
) -> Gradients:
    """The same backward with its internal knobs exposed (0 = default).

    None of them may change a single bit of the result; tests turn them to
    show it. chunk_points must be a multiple of 4096 (the tile size);
    block_size and max_blocks shape CUDA launches, grain_size the host
    executor's parallel_for.
    """
    return torch.ops.detgrid._grid_sampler_2d_backward_with_options(
        grad_output, input, grid, interpolation_mode, padding_mode,
        align_corners, list(output_mask), chunk_points, block_size,
        max_blocks, grain_size)


def has_cuda_kernels() -> bool:
    """Whether this build of detgrid compiled the CUDA kernels."""
    return bool(torch.ops.detgrid._has_cuda_kernels())
