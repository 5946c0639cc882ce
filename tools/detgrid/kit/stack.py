"""The upstream change as a stack of levels, cut from one set of sources.

The ATen files under aten_kernels/ hold the whole stack: the kit builds them as
they are. Each level after the core is a speed step that changes no bit. Its
code lives in files of its own (``Level.files``) and joins the core's files at
seams marked in them:

    // [stack: NAME]                a block present from level NAME on
    ...
    // [end stack: NAME]

    code;  // [stack: NAME]         one line present from level NAME on

    code;  // [stack: NAME replaces: older code;]
                                    one line that reads ``older code;`` before
                                    level NAME (same indentation)

Blocks nest. ``cut(text, upto)`` gives a file as the prefix of the stack that
ends with level ``upto`` has it, markers removed; at the last level it is the
source without its marker comments. The extension runs any level through the
same pipeline: ``Level.options`` are the knobs (detgrid.ops) that turn the later
levels' choices off, so ``level="core"`` runs what the core's files run.
"""

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


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


_BEGIN = re.compile(r"^\s*// \[stack: ([\w-]+)\]\s*$")
_END = re.compile(r"^\s*// \[end stack: ([\w-]+)\]\s*$")
_LINE = re.compile(r"^(?P<code>.*?\S)\s*// \[stack: (?P<name>[\w-]+)"
                   r"(?: replaces: (?P<old>.*))?\]\s*$")


def markers(text: str, where: str = "") -> List[Tuple[int, str]]:
    """(line number, level) of every marker; StackError for an unknown level or a block
    that does not close."""
    found, open_blocks = [], []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in (_BEGIN, _END, _LINE):
            m = pattern.match(line)
            if m:
                name = m.group("name") if pattern is _LINE else m.group(1)
                if name not in LEVEL_NAMES or name == LEVEL_NAMES[0]:
                    raise StackError(f"{where}:{number}: no level {name!r} after the core")
                if pattern is _BEGIN:
                    open_blocks.append((number, name))
                elif pattern is _END:
                    if not open_blocks or open_blocks[-1][1] != name:
                        raise StackError(f"{where}:{number}: [end stack: {name}] closes nothing")
                    open_blocks.pop()
                found.append((number, name))
                break
    if open_blocks:
        number, name = open_blocks[-1]
        raise StackError(f"{where}:{number}: [stack: {name}] is never closed")
    return found


def cut(text: str, upto: str = TOP, where: str = "") -> str:
    """``text`` as the prefix of the stack ending at level ``upto`` has it."""
    markers(text, where)
    keep_upto = level_index(upto)
    out: List[str] = []
    dropping: List[str] = []  # the open blocks that are not in the prefix
    lines = text.splitlines(keepends=True)
    for line in lines:
        begin, end, one = _BEGIN.match(line), _END.match(line), _LINE.match(line.rstrip("\n"))
        if begin:
            if level_index(begin.group(1)) > keep_upto or dropping:
                dropping.append(begin.group(1))
            continue
        if end:
            if dropping and dropping[-1] == end.group(1):
                dropping.pop()
                # a block between blank lines leaves one of them
                if out and not out[-1].strip():
                    out.append("\0")
            continue
        if dropping:
            continue
        if one:
            newline = "\n" if line.endswith("\n") else ""
            code, name, old = one.group("code"), one.group("name"), one.group("old")
            if level_index(name) <= keep_upto:
                out.append(code + newline)
            elif old is not None:
                indent = code[: len(code) - len(code.lstrip())]
                out.append(indent + old.strip() + newline)
            continue
        if line.strip() == "" and out and out[-1] == "\0":
            out.pop()
            continue
        out.append(line)
    return "".join(x for x in out if x != "\0")


KERNEL_DIR = "aten/src/ATen/native/cuda"


def kernel_sources(kit_root, upto: str = TOP) -> Dict[str, str]:
    """{path under the tree: text} of the ATen files of the prefix ending at ``upto``."""
    from pathlib import Path

    source = Path(kit_root) / "aten_kernels" / KERNEL_DIR
    return {f"{KERNEL_DIR}/{name}": cut((source / name).read_text(), upto, where=name)
            for name in kernel_files(upto)}
