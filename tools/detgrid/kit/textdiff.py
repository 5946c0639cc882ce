"""Unified diffs of one file, made and applied in pure Python.

A speed level of the upstream core is stored as the diff it makes to the
core's file (aten_kernels/levels/<level>/); the sources of a prefix of the
stack are the core with its levels' diffs applied in order. setup.py loads
this file by path, as it does toolchain.py, since a build has neither the
detgrid package nor, on every machine, a `patch` program.
"""

import difflib
import re
from pathlib import Path
from typing import Dict, Iterable, List

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DiffError(ValueError):
    """A diff that does not apply to the text given (the message says where)."""


def make(old: str, new: str, name: str) -> str:
    """The unified diff (three lines of context) that takes ``old`` to ``new``."""
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{name}", tofile=f"b/{name}"))


def apply(old: str, diff: str, name: str = "") -> str:
    """``old`` with ``diff`` applied; every context and removed line must match exactly."""
    source = old.splitlines(keepends=True)
    out: List[str] = []
    at = 0  # lines of ``source`` consumed
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines) and not lines[i].startswith("@@"):
        i += 1
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            raise DiffError(f"{name}: line {i + 1} of the diff is not a hunk header")
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        if start < at:
            raise DiffError(f"{name}: hunks overlap at line {start + 1}")
        out.extend(source[at:start])
        at = start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, text = lines[i][:1], lines[i][1:]
            if tag in (" ", "-"):
                if at >= len(source) or source[at] != text:
                    raise DiffError(f"{name}: the diff does not apply at line {at + 1}")
                if tag == " ":
                    out.append(text)
                at += 1
            elif tag == "+":
                out.append(text)
            elif tag != "\\":  # "\ No newline at end of file"
                raise DiffError(f"{name}: line {i + 1} of the diff is not a diff line")
            i += 1
    out.extend(source[at:])
    return "".join(out)


def apply_folders(texts: Dict[str, str], folders: Iterable[Path]) -> Dict[str, str]:
    """``texts`` ({file name: text}) with each folder's diffs applied in order: a folder holds
    ``<file name>.diff`` for every file it changes or adds (a new file's diff is from empty)."""
    texts = dict(texts)
    for folder in folders:
        for diff in sorted(Path(folder).glob("*.diff")):
            name = diff.name[: -len(".diff")]
            texts[name] = apply(texts.get(name, ""), diff.read_text(encoding="utf-8"),
                                f"{Path(folder).name}/{diff.name}")
    return texts
