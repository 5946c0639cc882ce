"""What detgrid.ops' level= runs, and the upstream change as patches.

Two implementations live here until the pipeline's speed steps are rebuilt on
the core (issue 60):

- the upstream core (aten_kernels/aten/): the first patch of patches/stack/,
  run by level="core", and its speed levels, each a later patch of the
  stack stored as its diff to the core's file (aten_kernels/levels/<name>/),
  run by level=<name>: the core with the diffs up to that level applied.
  They keep the core's bits;
- the pipeline (aten_kernels/pipeline/): the extension's speed path, its
  levels cut from one set of sources (detgrid.kit.stack). A level's
  ``options`` are the knobs that turn its own choice off, so the whole
  pipeline with the options of the levels after L runs what the prefix ending
  at L runs. The pipeline sums in an order of its own: its levels share their
  bits with one another, not with the core.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class UpstreamPatch:
    name: str  # as `detgrid patch --upto` and detgrid.ops' level= say it
    patch: str  # patches/stack/<patch>.patch and .md
    title: str  # the commit's subject line
    # A speed level of the core: it changes the core's file by the diff in
    # aten_kernels/levels/<name>/ and no bit of grad_input.
    speed_level: bool = False


# patches/stack/, in order: the core, the cuDNN route, then the core's speed
# levels.
UPSTREAM_STACK: Tuple[UpstreamPatch, ...] = (
    UpstreamPatch("core", "01-core",
                  "Add a deterministic CUDA backward for grid_sampler_2d/3d"),
    UpstreamPatch("cudnn", "02-cudnn",
                  "grid_sampler: leave cuDNN in deterministic mode"),
    UpstreamPatch("grouped-channels", "03-grouped-channels",
                  "grid_sampler deterministic backward: one record walk per "
                  "four channels", speed_level=True),
)
UPSTREAM_NAMES = tuple(p.name for p in UPSTREAM_STACK)
# A speed level's diffs to the core's files: <LEVELS_ROOT>/<name>/<file>.diff.
LEVELS_ROOT = "aten_kernels/levels"
CORE = UPSTREAM_NAMES[0]
# The builds of the core's file that level= runs: the core, then each prefix
# of the stack that ends with a speed level, named by that level.
CORE_BUILDS = (CORE, *(p.name for p in UPSTREAM_STACK if p.speed_level))


@dataclass(frozen=True)
class Level:
    name: str  # as the markers and detgrid.ops' level= say it
    files: Tuple[str, ...]  # new pipeline files (basenames), from this level on
    options: Dict[str, int] = field(default_factory=dict)  # knobs that stop at this level


KERNEL_CORE_FILES = (
    "GridSamplerDeterministic.h",
    "GridSamplerDeterministic.cuh",
    "GridSamplerDeterministicPipeline.cuh",
    "GridSamplerDeterministic.cu",
)

# The pipeline's levels. Each level's options turn off its own choice and
# every later one: a prefix runs with the options of the level after it.
LEVELS: Tuple[Level, ...] = (
    Level("pipeline", KERNEL_CORE_FILES),
    Level("index32", (), {"key_bits": 64, "index_bits": 64}),
    Level("dense", ("GridSamplerDeterministicDense.cuh",), {"reduce": 1}),
    Level("cells", ("GridSamplerDeterministicCells.cuh",), {"keying": 1}),
    Level("channels-fastest", ("GridSamplerDeterministicChannelsFastest.cuh",), {"gather": 1}),
    Level("hot-fold", ("GridSamplerDeterministicHotFold.cuh",), {"serial_fold": 1}),
    Level("channel-groups", ("GridSamplerDeterministicChannelGroups.cuh",), {"channel_group": 1}),
    Level("fused-fills", ("GridSamplerDeterministicFusedFills.cuh",), {"separate_fills": 1}),
)
LEVEL_NAMES = tuple(lv.name for lv in LEVELS)
TOP = LEVEL_NAMES[-1]
# Every name level= takes: the core's builds, then the pipeline's prefixes.
RUNNABLE = (*CORE_BUILDS, *LEVEL_NAMES)


class StackError(ValueError):
    """A marker the grammar above does not allow (the message says where)."""


def level_index(name: str) -> int:
    if name not in LEVEL_NAMES:
        raise StackError(f"unknown level {name!r}; the levels are {', '.join(RUNNABLE)}")
    return LEVEL_NAMES.index(name)


def level_options(name: str) -> Dict[str, int]:
    """The knobs that make the whole pipeline run what the prefix ending at ``name`` runs."""
    options: Dict[str, int] = {}
    for lv in LEVELS[level_index(name) + 1:]:
        options.update(lv.options)
    return options


def kernel_files(upto: str = TOP) -> Tuple[str, ...]:
    """The pipeline's files (basenames) of the prefix ending at ``upto``, in order."""
    return tuple(f for lv in LEVELS[: level_index(upto) + 1] for f in lv.files)


def level_of_file(name: str) -> Optional[str]:
    return next((lv.name for lv in LEVELS if name in lv.files), None)
