"""The levels of the upstream stack (patches/stack/): the core, then one speed step each.

detgrid.ops runs any level (level=): a level's ``options`` are the knobs that turn its own
choice off, so the whole stack with the options of the levels after L runs what the prefix
ending at L runs. detgrid.kit.stack cuts the ATen sources into the same levels.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Level:
    name: str  # as the markers and detgrid.ops' level= say it
    patch: str  # patches/stack/<patch>.patch and .md
    title: str  # the patch's subject line
    files: Tuple[str, ...]  # new ATen files (basenames), from this level on
    options: Dict[str, int] = field(default_factory=dict)  # knobs that stop at this level


KERNEL_CORE_FILES = (
    "GridSamplerDeterministic.h",
    "GridSamplerDeterministic.cuh",
    "GridSamplerDeterministicPipeline.cuh",
    "GridSamplerDeterministic.cu",
)

# Each level's options turn off its own choice and every later one: a prefix
# of the stack runs with the options of the level after it.
LEVELS: Tuple[Level, ...] = (
    Level("core", "01-core",
          "Deterministic CUDA grid_sampler backward: grad_input by a stable sort, no atomics",
          KERNEL_CORE_FILES),
    Level("index32", "02-index32",
          "grid_sampler deterministic backward: 32-bit sort keys and index math where they fit",
          (), {"key_bits": 64, "index_bits": 64}),
    Level("dense", "03-dense-reduce",
          "grid_sampler deterministic backward: a dense reduce over a segment table",
          ("GridSamplerDeterministicDense.cuh",), {"reduce": 1}),
    Level("cells", "04-cell-keys",
          "grid_sampler deterministic backward: one sort key per point for bilinear and trilinear",
          ("GridSamplerDeterministicCells.cuh",), {"keying": 1}),
    Level("channels-fastest", "05-channels-fastest",
          "grid_sampler deterministic backward: channels fastest from 16 channels",
          ("GridSamplerDeterministicChannelsFastest.cuh",), {"gather": 1}),
    Level("hot-fold", "06-hot-fold",
          "grid_sampler deterministic backward: fold hot destinations in parallel",
          ("GridSamplerDeterministicHotFold.cuh",), {"serial_fold": 1}),
    Level("channel-groups", "07-channel-groups",
          "grid_sampler deterministic backward: one walk of a destination's records per "
          "group of channels",
          ("GridSamplerDeterministicChannelGroups.cuh",), {"channel_group": 1}),
    Level("fused-fills", "08-fused-fills",
          "grid_sampler deterministic backward: the point pass zero-fills the segment table "
          "and copies grad_output channels last",
          ("GridSamplerDeterministicFusedFills.cuh",), {"separate_fills": 1}),
)
LEVEL_NAMES = tuple(lv.name for lv in LEVELS)
TOP = LEVEL_NAMES[-1]


class StackError(ValueError):
    """A marker the grammar above does not allow (the message says where)."""


def level_index(name: str) -> int:
    if name not in LEVEL_NAMES:
        raise StackError(f"unknown level {name!r}; the levels are {', '.join(LEVEL_NAMES)}")
    return LEVEL_NAMES.index(name)


def level_options(name: str) -> Dict[str, int]:
    """The knobs that make the whole stack run what the prefix ending at ``name`` runs."""
    options: Dict[str, int] = {}
    for lv in LEVELS[level_index(name) + 1:]:
        options.update(lv.options)
    return options


def kernel_files(upto: str = TOP) -> Tuple[str, ...]:
    """The ATen files (basenames) of the prefix ending at ``upto``, in stack order."""
    return tuple(f for lv in LEVELS[: level_index(upto) + 1] for f in lv.files)


def level_of_file(name: str) -> Optional[str]:
    return next((lv.name for lv in LEVELS if name in lv.files), None)
