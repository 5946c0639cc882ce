"""The deterministic grid_sampler backward as plain functions.

They are a backward with no derivative of their own: a call whose inputs
require grad while grad mode is on raises (aten_kernels/extension/
autograd.cpp says why); F.grid_sample with detgrid.enable() is the
differentiable route.
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from detgrid import buildinfo
from detgrid import levels

buildinfo.check()  # refuses, in one line, a build made for another torch
import detgrid._C  # noqa: E402,F401  (registers torch.ops.detgrid)

Gradients = Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]
Mode = Union[int, str]

# F.grid_sample's names for aten's mode numbers ("bicubic" is tricubic in 3-D).
INTERPOLATION_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDING_MODES = {"zeros": 0, "border": 1, "reflection": 2}


_MODE_TABLES = {"interpolation_mode": ("INTERPOLATION_MODES", INTERPOLATION_MODES),
                "padding_mode": ("PADDING_MODES", PADDING_MODES)}


def _mode_number(op: str, argument: str, value: Mode) -> Mode:
    """aten's number for a mode given by F.grid_sample's name; a number goes
    on to the operator, which checks its range. Errors are RuntimeErrors in
    aten's one-line form, as the operator's own checks are."""
    if not isinstance(value, str):
        return value
    table, numbers = _MODE_TABLES[argument]
    if value not in numbers:
        raise RuntimeError(f"{op}(): {argument} must be a number or a name in "
                           f"detgrid.ops.{table} ({', '.join(numbers)}), but got {value!r}")
    return numbers[value]


def _output_mask(op: str, output_mask: Sequence[bool]) -> List[bool]:
    """output_mask as the operator's bool[2], refused in one line otherwise."""
    try:
        mask = list(output_mask)
    except TypeError:
        mask = None
    if mask is None or len(mask) != 2 or not all(isinstance(b, bool) for b in mask):
        raise RuntimeError(f"{op}(): output_mask must be two bools (grad_input, grad_grid), "
                           f"but got {output_mask!r}")
    return mask


def _aten_arguments(op: str, interpolation_mode: Mode, padding_mode: Mode, align_corners: bool,
                output_mask: Sequence[bool]) -> Tuple[Mode, Mode, bool, List[bool]]:
    """(interpolation_mode, padding_mode, align_corners, output_mask) as the
    operator's schema takes them, or a one-line RuntimeError."""
    return (_mode_number(op, "interpolation_mode", interpolation_mode),
            _mode_number(op, "padding_mode", padding_mode),
            align_corners,
            _output_mask(op, output_mask))


def _backward(name: str):
    op = getattr(torch.ops.detgrid, name)

    def backward(
        grad_output: torch.Tensor,
        input: torch.Tensor,
        grid: torch.Tensor,
        interpolation_mode: Mode,
        padding_mode: Mode,
        align_corners: bool,
        output_mask: Sequence[bool],
    ) -> Gradients:
        return op(grad_output, input, grid,
                  *_aten_arguments(name, interpolation_mode, padding_mode, align_corners,
                               output_mask))

    backward.__name__ = backward.__qualname__ = name
    backward.__doc__ = (
        f"Deterministic (grad_input, grad_grid) with the contract of "
        f"torch.ops.aten.{name}; an output not asked for in output_mask is None. "
        f"Modes are aten's numbers or F.grid_sample's names (INTERPOLATION_MODES, "
        f"PADDING_MODES).")
    return backward


def _core_level(name: str, level: str) -> str:
    """``level``, refused in one line unless it names a build of the core."""
    if level not in levels.CORE_BUILDS:
        raise ValueError(f"{name}(): unknown level {level!r}; the levels are "
                         f"{', '.join(levels.CORE_BUILDS)}")
    return level


def _backward_with_options(name: str):
    def backward_with_options(
        grad_output: torch.Tensor,
        input: torch.Tensor,
        grid: torch.Tensor,
        interpolation_mode: Mode,
        padding_mode: Mode,
        align_corners: bool,
        output_mask: Sequence[bool],
        *,
        block_size: int = 0,
        max_blocks: int = 0,
        level: str = levels.TOP,
    ) -> Gradients:
        level = _core_level(f"{name}_with_options", level)
        interpolation_mode, padding_mode, align_corners, output_mask = _aten_arguments(
            name, interpolation_mode, padding_mode, align_corners, output_mask)
        grad_input = grad_grid = None
        if output_mask[0]:
            grad_input = torch.ops.detgrid._core_grad_input(
                grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                block_size, max_blocks, level=level)
        if output_mask[1]:
            grad_grid = torch.ops.detgrid._grid_gradient(
                grad_output, input, grid, interpolation_mode, padding_mode, align_corners)
        return grad_input, grad_grid

    backward_with_options.__name__ = backward_with_options.__qualname__ = (
        f"{name}_with_options")
    backward_with_options.__doc__ = f"""{name} at one build of the upstream stack, with the
    host build's launch shape exposed.

    level (detgrid.levels.CORE_BUILDS) names the build: "core" runs the first
    patch of patches/stack/, a speed level the core with the stack's diffs up
    to it; the default is the whole stack, which {name} runs. Every build
    gives the same bits. grad_grid comes from the grid-gradient kernel at
    every level. block_size and max_blocks (0: the defaults) set the blocks
    and the grid of the host build's grad_input launches; they move no bit, and tests
    turn them to show it. On CUDA the kernels' own shapes are used, and a
    shape given there is an error.
    """
    return backward_with_options


grid_sampler_2d_backward = _backward("grid_sampler_2d_backward")
grid_sampler_3d_backward = _backward("grid_sampler_3d_backward")
grid_sampler_2d_backward_with_options = _backward_with_options("grid_sampler_2d_backward")
grid_sampler_3d_backward_with_options = _backward_with_options("grid_sampler_3d_backward")


WORK_COUNTER_FIELDS = ("launches", "chunks", "launches_per_chunk", "items_sorted",
                       "key_bits", "key_bytes", "workspace_bytes", "threads", "longest_fold",
                       "reduce_items", "record_visits")


def work_counters(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: Mode,
    padding_mode: Mode,
    align_corners: bool,
    output_mask: Sequence[bool],
    *,
    level: str = levels.TOP,
) -> Dict[str, int]:
    """What the CUDA backward at build ``level`` (detgrid.levels.CORE_BUILDS) does for
    this call, counted exactly by its host build, which counts what the CUDA build
    launches, sorts and allocates.

    From the shapes alone (meta tensors will do; the same on every machine):
    launches (kernel launches, a CUB call as one, the grid gradient's one launch
    included where grad_grid is requested), chunks (one radix sort each),
    launches_per_chunk (grad_input's launches in one chunk: those of the call, a Half or
    BFloat16 scratch's fill and rounding, left out), items_sorted,
    key_bits (the key bits the radix sort reads: up to the highest key's) and key_bytes
    (the width of a key), workspace_bytes (the peak of
    detgrid's buffers and CUB's temporary storage, one allocator), threads (the
    threads grad_input's launches start).
    Where the points land, counted by running the host build where the tensors
    are CPU tensors with data, -1 otherwise: longest_fold (the most terms one
    thread adds in sequence: see core_longest_fold), reduce_items (run-sum items
    with work: one per run of records with a grad_input position, the run of
    out-of-bounds taps left out, and group of channels) and record_visits (reads
    of a record's id, weights and grad_output offset by the run sums and the
    stored partials: once per record of those runs and group of channels). A
    group is CORE_CHANNEL_GROUPS[level] channels, the last one shorter.
    Also `points` and `records` (points x taps), from the shapes. A call that
    does not request grad_input counts the grid gradient alone.
    """
    dims = input.dim() - 2
    level = _core_level("work_counters", level)
    interpolation_mode, padding_mode, align_corners, output_mask = _aten_arguments(
        f"grid_sampler_{dims}d_backward", interpolation_mode, padding_mode, align_corners,
        output_mask)
    points = grid.numel() // dims
    counters = dict.fromkeys(WORK_COUNTER_FIELDS, 0)
    if output_mask[0]:
        counters.update(_grad_input_counters(grad_output, input, grid, interpolation_mode,
                                             padding_mode, align_corners, level))
    if output_mask[1] and points:
        counters["launches"] += 1  # the grid gradient: one thread per point
    taps_per_axis = {0: 2, 1: 1, 2: 4}[interpolation_mode]
    counters["points"] = points
    counters["records"] = points * taps_per_axis ** dims if output_mask[0] else 0
    return counters


# The upstream core's chunk and partial sizes (kMaxChunkRecords and
# kPartialRecords in aten_kernels/aten/.../GridSamplerDeterministic.cu).
CORE_CHUNK_RECORDS = 1 << 19
CORE_PARTIAL_RECORDS = 256
# Channels one thread of each core build's run sums and stored partials takes
# per walk of a run's records: one at the core, kChannelGroup from the level
# grouped-channels on (in the source as detgrid.kit.stack.core_sources gives
# it). Every build in levels.CORE_BUILDS has its entry.
CORE_CHANNEL_GROUPS = {"core": 1, "grouped-channels": 4}


def core_longest_fold(longest_run: int) -> int:
    """The most terms one thread of the core adds in sequence, for a chunk whose longest run
    of one grad_input position holds ``longest_run`` records: the run's first partial (up
    to CORE_PARTIAL_RECORDS records) and then its stored partials, one per further
    CORE_PARTIAL_RECORDS records (a partial is itself at most CORE_PARTIAL_RECORDS). The
    same at every core build: from grouped-channels on, a thread's channels advance through
    the records and the stored partials together, each channel a chain of this length."""
    if longest_run <= 0:
        return longest_run  # -1: not counted (no data to run on)
    first = min(longest_run, CORE_PARTIAL_RECORDS)
    return first + -(-(longest_run - first) // CORE_PARTIAL_RECORDS)


def _grad_input_counters(grad_output, input, grid, interpolation_mode, padding_mode,
                         align_corners, level) -> Dict[str, int]:
    """work_counters' fields for grad_input at build ``level``, from its host build's
    counts."""
    (launches, items_sorted, sort_end_bit, key_bytes, workspace_bytes, threads,
     longest_run, runs, landed_runs, landed_records, sorts) = torch.ops.detgrid._core_counters(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners, level)
    del runs
    # Each run-sum item takes a run and a group of channels: ceil(C / group) per run.
    groups = -(-input.size(1) // CORE_CHANNEL_GROUPS[level])
    # Half and BFloat16 sums over several chunks wait in a float scratch: its fill
    # before the chunks and its rounding into grad_input after them are the call's, not
    # a chunk's.
    per_call = 2 if sorts > 1 and input.dtype in (torch.half, torch.bfloat16) else 0
    return dict(
        launches=launches, chunks=sorts,
        launches_per_chunk=(launches - per_call) // sorts if sorts else 0,
        items_sorted=items_sorted, key_bits=sort_end_bit, key_bytes=key_bytes,
        workspace_bytes=workspace_bytes, threads=threads,
        longest_fold=core_longest_fold(longest_run),
        reduce_items=landed_runs * groups if landed_runs >= 0 else -1,
        record_visits=landed_records * groups if landed_records >= 0 else -1)


def backward_route(device_type: str, deterministic: bool, warn_only: bool,
                   output_mask: Sequence[bool]) -> str:
    """Which kernel serves aten::grid_sampler_{2d,3d}_backward on a device
    where detgrid is enabled, with torch.use_deterministic_algorithms in the
    given state: "stock" or "detgrid". The C++ overrides and detgrid's own
    operators take this same decision (aten_kernels/extension/routing.h).

    Outside deterministic mode stock's kernel runs. In it, a call that
    requests grad_input runs detgrid's; a call for grad_grid alone runs
    stock's kernel on CPU, and detgrid's grid-gradient kernel (stock's
    arithmetic) on CUDA, where every released torch's kernel alerts on any
    call. warn_only changes no route.
    """
    if device_type not in ("cpu", "cuda"):
        raise RuntimeError(f"backward_route(): device_type must be 'cpu' or 'cuda', "
                           f"but got {device_type!r}")
    return torch.ops.detgrid._backward_route(
        device_type, bool(deterministic), bool(warn_only),
        _output_mask("backward_route", output_mask))


def grid_gradient(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: Mode,
    padding_mode: Mode,
    align_corners: bool,
) -> torch.Tensor:
    """grad_grid alone, by the grid-gradient kernel that serves a grid-only
    call on the detgrid route (on CUDA in deterministic mode), on the
    tensors' device: stock's arithmetic, the bits of the grad_grid that
    detgrid's full backward returns."""
    dims = input.dim() - 2
    mode, padding, align_corners, _ = _aten_arguments(
        f"grid_sampler_{dims}d_backward", interpolation_mode, padding_mode, align_corners,
        [False, True])
    return torch.ops.detgrid._grid_gradient(grad_output, input, grid, mode, padding,
                                            align_corners)


def has_cuda_kernels() -> bool:
    """Whether this build of detgrid compiled the CUDA kernels."""
    return bool(torch.ops.detgrid._has_cuda_kernels())
