"""The pipeline's levels, cut from one set of sources; where the upstream files are.

The upstream change's new file is aten_kernels/aten/src/ATen/native/cuda/
GridSamplerDeterministic.cu (``core_sources``). The pipeline, the extension's
speed path until its steps are rebuilt on that core, lives under
aten_kernels/pipeline/ with the same layout: the kit builds its files as they
are. Each level after the first is a speed step that changes no bit. Its
code lives in files of its own (``Level.files``) and joins the first level's
files at seams marked in them:

    // [stack: NAME]                a block present from level NAME on
    ...
    // [end stack: NAME]

    code;  // [stack: NAME]         one line present from level NAME on

    code;  // [stack: NAME replaces: older code;]
                                    one line that reads ``older code;`` before
                                    level NAME (same indentation)

Blocks nest. ``cut(text, upto)`` gives a file as the prefix of the pipeline
that ends with level ``upto`` has it, markers removed; at the last level it is
the source without its marker comments. The extension runs any level through
the same pipeline: ``Level.options`` are the knobs (detgrid.ops) that turn the
later levels' choices off, so ``level="pipeline"`` runs what the first level's
files run.
"""

import re
from typing import Dict, List, Tuple


from detgrid.levels import (  # noqa: F401  (the levels, re-exported for the kit's tools)
    CORE,
    KERNEL_CORE_FILES,
    LEVEL_NAMES,
    LEVELS,
    LEVELS_ROOT,
    TOP,
    Level,
    UPSTREAM_NAMES,
    UPSTREAM_STACK,
    StackError,
    UpstreamPatch,
    kernel_files,
    level_index,
    level_of_file,
    level_options,
)


_BEGIN = re.compile(r"^\s*// \[stack: ([\w-]+)\]\s*$")
_END = re.compile(r"^\s*// \[end stack: ([\w-]+)\]\s*$")
_LINE = re.compile(r"^(?P<code>.*?\S)\s*// \[stack: (?P<name>[\w-]+)"
                   r"(?: replaces: (?P<old>.*))?\]\s*$")
# Anything that looks like a marker: each must be one of the three above.
_ANY = re.compile(r"// \[(end )?stack:")


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
                    raise StackError(f"{where}:{number}: no level {name!r} after the first")
                if pattern is _BEGIN:
                    open_blocks.append((number, name))
                elif pattern is _END:
                    if not open_blocks or open_blocks[-1][1] != name:
                        raise StackError(f"{where}:{number}: [end stack: {name}] closes nothing")
                    open_blocks.pop()
                found.append((number, name))
                break
        else:
            if _ANY.search(line):
                raise StackError(f"{where}:{number}: a marker must end its line: {line.strip()}")
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
UPSTREAM_ROOT = "aten_kernels"  # the upstream files: aten_kernels/aten/...
PIPELINE_ROOT = "aten_kernels/pipeline"  # the pipeline's: aten_kernels/pipeline/aten/...
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


def kernel_sources(kit_root, upto: str = TOP) -> Dict[str, str]:
    """{path under the tree: text} of the pipeline's files of the prefix ending at ``upto``."""
    from pathlib import Path

    source = Path(kit_root) / PIPELINE_ROOT / KERNEL_DIR
    return {f"{KERNEL_DIR}/{name}": cut((source / name).read_text(), upto, where=name)
            for name in kernel_files(upto)}
