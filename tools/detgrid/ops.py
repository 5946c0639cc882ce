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


# How grad_input's terms are summed (the extension's accumulate knob): in the
# canonical order (the default), exactly after the sort, or exactly with
# integer atomics and no sort (aten_kernels/extension/exact/ExactSum.cuh).
ACCUMULATE_MODES = {"ordered": 0, "exact": 1, "exact_atomic": 2}

_MODE_TABLES = {"interpolation_mode": ("INTERPOLATION_MODES", INTERPOLATION_MODES),
                "padding_mode": ("PADDING_MODES", PADDING_MODES),
                "accumulate": ("ACCUMULATE_MODES", ACCUMULATE_MODES)}


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


def _level_knobs(level: str, **given: int) -> Dict[str, int]:
    """The knobs that run the prefix of the stack ending at `level`, with the ones given
    (nonzero) taking their own values; ValueError in one line for an unknown level."""
    try:
        knobs = levels.level_options(level)
    except levels.StackError as e:
        raise ValueError(str(e)) from None
    return {name: value or knobs.get(name, 0) for name, value in given.items()}


def _refuse_pipeline_knobs(name: str, level: str, **given: int) -> None:
    """The core's builds (levels.CORE_BUILDS) have none of the pipeline's knobs."""
    set_ = [knob for knob, value in given.items() if value not in (0, "ordered")]
    if set_:
        raise ValueError(f"{name}(): level={level!r} runs a build of the upstream core, "
                         f"which has no {', '.join(set_)} (knobs of the pipeline's levels)")


def _core_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                   output_mask, block_size: int, max_blocks: int, level: str) -> Gradients:
    """The grad_input of the upstream core's build ``level`` (aten_kernels/aten/, with the
    speed levels' diffs up to it) and the grid gradient's grad_grid, as the patched
    GridSampler.cu returns them; block_size and max_blocks shape the host build's
    launches."""
    if input.requires_grad or grid.requires_grad or grad_output.requires_grad:
        if torch.is_grad_enabled():
            raise RuntimeError("level='core' is a backward with no derivative of its own; "
                               "call it under torch.no_grad()")
    grad_input = grad_grid = None
    if output_mask[0]:
        grad_input = torch.ops.detgrid._core_grad_input(
            grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
            block_size, max_blocks, level=level)
    if output_mask[1]:
        grad_grid = torch.ops.detgrid._grid_gradient(
            grad_output, input, grid, interpolation_mode, padding_mode, align_corners)
    return grad_input, grad_grid


def _backward_with_options(name: str):
    op = getattr(torch.ops.detgrid, f"_{name}_with_options")

    def backward_with_options(
        grad_output: torch.Tensor,
        input: torch.Tensor,
        grid: torch.Tensor,
        interpolation_mode: Mode,
        padding_mode: Mode,
        align_corners: bool,
        output_mask: Sequence[bool],
        *,
        chunk_points: int = 0,
        block_size: int = 0,
        max_blocks: int = 0,
        grain_size: int = 0,
        key_bits: int = 0,
        index_bits: int = 0,
        keying: int = 0,
        gather: int = 0,
        accumulate: Mode = "ordered",
        serial_fold: int = 0,
        reduce: int = 0,
        channel_group: int = 0,
        separate_fills: int = 0,
        carry_elements: int = 0,
        level: str = levels.TOP,
    ) -> Gradients:
        if level in levels.CORE_BUILDS:
            _refuse_pipeline_knobs(
                f"{name}_with_options", level, chunk_points=chunk_points, grain_size=grain_size,
                key_bits=key_bits, index_bits=index_bits, keying=keying, gather=gather,
                accumulate=accumulate, serial_fold=serial_fold, reduce=reduce,
                channel_group=channel_group, separate_fills=separate_fills,
                carry_elements=carry_elements)
            return _core_backward(grad_output, input, grid,
                                  *_aten_arguments(name, interpolation_mode, padding_mode,
                                                   align_corners, output_mask),
                                  block_size, max_blocks, level)
        knobs = _level_knobs(level, key_bits=key_bits, index_bits=index_bits, keying=keying,
                             gather=gather, serial_fold=serial_fold, reduce=reduce,
                             channel_group=channel_group, separate_fills=separate_fills)
        return op(grad_output, input, grid,
                  *_aten_arguments(name, interpolation_mode, padding_mode, align_corners,
                               output_mask),
                  chunk_points, block_size, max_blocks, grain_size, knobs["key_bits"],
                  knobs["index_bits"], knobs["keying"], knobs["gather"],
                  _mode_number(name, "accumulate", accumulate), knobs["serial_fold"],
                  knobs["reduce"], knobs["channel_group"], knobs["separate_fills"],
                  carry_elements)

    backward_with_options.__name__ = backward_with_options.__qualname__ = (
        f"{name}_with_options")
    backward_with_options.__doc__ = f"""{name} with its internal knobs exposed (0 = default).

    None of them may change a single bit of the result; tests turn them to
    show it. chunk_points must be a multiple of 4096 (the tile size);
    block_size and max_blocks shape CUDA launches, grain_size the host
    executor's parallel_for; key_bits and index_bits (32 or 64) force the
    width of the sort keys and of the index math, which are otherwise 32
    wherever the problem fits; keying=1 sorts one key per tap where the
    default sorts one per point (bilinear and trilinear, dense reduction);
    gather=1 (2) makes the dense reduce's threads take destinations
    (channels) fastest, where the default takes channels fastest from 16
    channels on; serial_fold=1 makes every destination fold its records in
    one thread, where by default a dense chunk first folds in parallel the
    tiles of each destination one of whose keys holds more than 4096 records
    (4096 / 2^dims when keyed per cell); reduce=1 reduces sparsely (runs of
    one destination) where the default reduces over a dense segment table
    wherever it fits; channel_group=1 makes each thread of the dense reduce
    (destinations fastest) and of the hot fold take one channel, where by
    default it takes a group of up to 16 (8 in double); separate_fills=1
    makes a dense chunk's zero fill of its segment table and its
    channels-last copy of grad_output launches of their own, where by
    default the point pass does both (the copy up to 64 channels);
    carry_elements caps the float carry of Half/BFloat16 sums over several
    chunks (8 Mi elements), so that a small problem runs it in blocks.

    level (detgrid.levels.RUNNABLE): "core" runs the upstream core, the
    first patch of patches/stack/ (block_size and max_blocks shape its host
    build's launches; it has none of the other knobs), with grad_grid from
    the grid-gradient kernel. A level of the pipeline runs what that prefix of
    the pipeline runs, the default the whole pipeline: it sets the knobs of
    the later levels' choices (a knob given as well takes its own value).
    The pipeline sums grad_input in an order of its own: its levels share
    their bits with one another, not with the core.

    accumulate (ACCUMULATE_MODES) is the one knob that changes results:
    "exact" and "exact_atomic" sum grad_input's terms exactly, in integers,
    and round once (a prototype; see aten_kernels/extension/exact/), with
    the same bits as each other under every other knob.
    """
    return backward_with_options


grid_sampler_2d_backward = _backward("grid_sampler_2d_backward")
grid_sampler_3d_backward = _backward("grid_sampler_3d_backward")
grid_sampler_2d_backward_with_options = _backward_with_options("grid_sampler_2d_backward")
grid_sampler_3d_backward_with_options = _backward_with_options("grid_sampler_3d_backward")


WORK_COUNTER_FIELDS = ("launches", "chunks", "launches_per_chunk", "items_sorted",
                       "key_bits", "key_bytes", "workspace_bytes", "sort_scratch_bytes",
                       "elements_swept", "atomics", "longest_fold", "channel_merges",
                       "longest_fill", "reduce_items", "record_visits")


def work_counters(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: Mode,
    padding_mode: Mode,
    align_corners: bool,
    output_mask: Sequence[bool],
    *,
    chunk_points: int = 0,
    key_bits: int = 0,
    index_bits: int = 0,
    keying: int = 0,
    gather: int = 0,
    accumulate: Mode = "ordered",
    serial_fold: int = 0,
    reduce: int = 0,
    channel_group: int = 0,
    separate_fills: int = 0,
    carry_elements: int = 0,
    level: str = levels.TOP,
) -> Dict[str, int]:
    """What the CUDA pipeline does for this backward call, counted exactly.

    The pipeline runs with an executor that runs no stage, so but for
    longest_fold only the tensors' sizes, strides and dtype matter: meta
    tensors will do, and the counts are the same on every machine.
    Fields: kernel launches (a CUB call counts as one), chunks,
    launches_per_chunk (those of the first chunk), items_sorted (radix-sort
    items: one per point or one per record, as the pipeline keys the call),
    key_bits (bits it sorts), key_bytes, workspace_bytes (detgrid's
    buffers), sort_scratch_bytes (an estimate of CUB's radix-sort scratch:
    its copy of the keys and payloads),
    elements_swept (grad_input elements the dense reduces visit, summed over
    chunks; 0 for the sparse reduction, which zero-fills and visits runs),
    atomics (integer atomics at most, with accumulate="exact" or
    "exact_atomic": the words each term can span, and one per thread of the
    scale's pre-pass; the ordered pipeline issues none), longest_fold (the
    most records, or stored partials, one thread of the ordered pipeline's
    reduces adds in sequence: it depends on where the points land, so it is
    measured by running the call on the host where the tensors are CPU
    tensors with data, and is -1 for meta tensors or an exact accumulation),
    channel_merges (record merges of the ordered pipeline's reduces, summed
    over channel passes: each chunk's sorted items times the threads that
    walk a destination's records, one per channel or, with channel groups,
    one per group of up to 16 channels; -1 for an exact accumulation),
    longest_fill (the most words of a dense chunk's segment table one thread
    of a point pass zero-fills, where the point pass fills it; 0 where the
    table is left to a fill of its own, as a short last chunk's is).
    reduce_items and record_visits count the run sums of the core's builds
    and are -1 for the pipeline's levels, which have no such reduce (see
    below). Also `points` and `records` (points x taps), from the shapes.

    level="core" counts the upstream core's host build, which counts what
    its CUDA build launches, sorts and allocates: workspace_bytes holds
    CUB's temporary storage (sort_scratch_bytes is 0), chunks are its
    sorts (one a chunk), launches_per_chunk is launches over chunks,
    longest_fold is counted from the longest run of one grad_input position
    in a chunk where the tensors are CPU tensors (-1 otherwise), and
    channel_merges is -1 (the core has no such walk).
    The core's builds count their run sums where the tensors are CPU tensors
    (where the points land decides them; -1 otherwise), summed over chunks:
    reduce_items, the run-sum items launched that have work, one per run of
    records with a grad_input position (the run of out-of-bounds taps left
    out) and group of channels; record_visits, the reads of a record's id,
    weights and grad_output offset, once per record of those runs and group
    of channels, by the run sums and the stored partials together. A group
    is CORE_CHANNEL_GROUPS[level] channels (the last one shorter): 1 at
    level="core", 4 (kChannelGroup) at "grouped-channels", where both
    fields are the core's times ceil(C / 4) / C. Both are 0 for a grid-only
    call.
    """
    dims = input.dim() - 2
    interpolation_mode, padding_mode, align_corners, output_mask = _aten_arguments(
        f"grid_sampler_{dims}d_backward", interpolation_mode, padding_mode, align_corners,
        output_mask)
    if level in levels.CORE_BUILDS:
        _refuse_pipeline_knobs(
            "work_counters", level, chunk_points=chunk_points, key_bits=key_bits,
            index_bits=index_bits, keying=keying, gather=gather, accumulate=accumulate,
            serial_fold=serial_fold, reduce=reduce, channel_group=channel_group,
            separate_fills=separate_fills, carry_elements=carry_elements)
        counters = _core_work_counters(grad_output, input, grid, interpolation_mode,
                                       padding_mode, align_corners, output_mask, level)
    else:
        counters = _pipeline_work_counters(
            grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
            output_mask, chunk_points, accumulate, carry_elements,
            _level_knobs(level, key_bits=key_bits, index_bits=index_bits, keying=keying,
                         gather=gather, serial_fold=serial_fold, reduce=reduce,
                         channel_group=channel_group, separate_fills=separate_fills))
    points = grid.numel() // dims
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


def _core_work_counters(grad_output, input, grid, interpolation_mode, padding_mode,
                        align_corners, output_mask, level) -> Dict[str, int]:
    """work_counters' fields for the upstream core's build ``level``, from its host build's
    counts."""
    counters = dict.fromkeys(WORK_COUNTER_FIELDS, 0)
    if not output_mask[0]:
        return counters  # the existing kernel's grid-only route: no sort, no workspace
    (launches, items_sorted, sort_end_bit, key_bytes, workspace_bytes, threads,
     longest_run, runs, landed_runs, landed_records, sorts) = torch.ops.detgrid._core_counters(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners, level)
    del sort_end_bit, threads, runs
    # Each run-sum item takes a run and a group of channels: ceil(C / group) per run.
    groups = -(-input.size(1) // CORE_CHANNEL_GROUPS[level])
    # One sort per chunk (chunks shrink below CORE_CHUNK_RECORDS records where many
    # channels' stored partials would not fit).
    chunks = sorts
    counters.update(
        launches=launches, chunks=chunks,
        launches_per_chunk=launches // chunks if chunks else 0,
        items_sorted=items_sorted, key_bits=8 * key_bytes, key_bytes=key_bytes,
        # CUB's temporary storage is allocated from the same allocator: in workspace_bytes
        workspace_bytes=workspace_bytes, sort_scratch_bytes=0,
        longest_fold=core_longest_fold(longest_run), channel_merges=-1,
        reduce_items=landed_runs * groups if landed_runs >= 0 else -1,
        record_visits=landed_records * groups if landed_records >= 0 else -1)
    return counters


def _pipeline_work_counters(grad_output, input, grid, interpolation_mode, padding_mode,
                            align_corners, output_mask, chunk_points, accumulate,
                            carry_elements, knobs) -> Dict[str, int]:
    dims = input.dim() - 2
    values = torch.ops.detgrid._backward_work_counters(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
        output_mask, chunk_points, knobs["key_bits"], knobs["index_bits"], knobs["keying"],
        knobs["gather"],
        _mode_number(f"grid_sampler_{dims}d_backward", "accumulate", accumulate),
        knobs["serial_fold"], knobs["reduce"], knobs["channel_group"],
        knobs["separate_fills"], carry_elements)
    # The fields after the operator's are the core's run sums': -1, the pipeline has none.
    return {**dict.fromkeys(WORK_COUNTER_FIELDS, -1), **dict(zip(WORK_COUNTER_FIELDS, values))}


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
