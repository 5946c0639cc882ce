"""What detgrid.ops' level= runs, and the upstream change as patches.

The upstream core (aten_kernels/aten/) is the first patch of patches/stack/,
run by level="core". Each speed level is a later patch of the stack, stored
as its diff to the core's file (aten_kernels/levels/<name>/) and run by
level=<name>: the core with the diffs up to that level applied. Every build
gives the core's bits. The extension's default backward runs the whole
stack (TOP).
"""

from dataclasses import dataclass
from typing import Tuple


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


# What level= runs when none is given: the whole stack.
TOP = CORE_BUILDS[-1]


class StackError(ValueError):
    """A patch or build name the stack does not have (the message lists them)."""
