"""Where the upstream files are, and the core's file as each patch of the stack has it.

The upstream change's new file is aten_kernels/aten/src/ATen/native/cuda/
GridSamplerDeterministic.cu, the first patch of the stack (detgrid.levels).
Each speed level after it is stored as its diff to that file
(aten_kernels/levels/<name>/), which ``core_sources`` applies in order.
"""

from typing import Dict

from detgrid.levels import (  # noqa: F401  (the stack, re-exported for the kit's tools)
    CORE,
    CORE_BUILDS,
    LEVELS_ROOT,
    TOP,
    UPSTREAM_NAMES,
    UPSTREAM_STACK,
    StackError,
    UpstreamPatch,
)


KERNEL_DIR = "aten/src/ATen/native/cuda"
UPSTREAM_ROOT = "aten_kernels"  # the upstream files: aten_kernels/aten/...
CORE_FILES = ("GridSamplerDeterministic.cu",)  # the files the core adds to the tree


def core_sources(kit_root, upto: str = CORE) -> Dict[str, str]:
    """{path under the tree: text} of the core's files as the prefix of the upstream stack
    ending at ``upto`` has them: the core's, with the diffs of the speed levels up to ``upto``
    applied in order."""
    from pathlib import Path

    from detgrid.kit import textdiff

    if upto not in UPSTREAM_NAMES:
        raise StackError(f"unknown patch {upto!r}; the stack is {', '.join(UPSTREAM_NAMES)}")
    source = Path(kit_root) / UPSTREAM_ROOT / KERNEL_DIR
    texts = textdiff.apply_folders(
        {name: (source / name).read_text() for name in CORE_FILES},
        [Path(kit_root) / LEVELS_ROOT / part.name
         for part in UPSTREAM_STACK[: UPSTREAM_NAMES.index(upto) + 1] if part.speed_level])
    return {f"{KERNEL_DIR}/{name}": text for name, text in texts.items()}
