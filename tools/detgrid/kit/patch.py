"""``detgrid patch``: apply the deterministic grid_sample backward to a PyTorch checkout.

``plan()`` makes every edit in memory: each finds its anchor semantically (a function by name with
its parameter list and brace-matched body, a statement by its text, a test by what it checks, never
a line number), and any anchor it cannot find refuses the whole change before a byte is written.
A second run finds every edit present and changes nothing. ``patch_apply`` then writes the change
crash-safely as one commit (author and committer from the user's git configuration) and writes that
commit with ``git format-patch``. ``--check`` plans, builds the change in a temporary copy and
checks that it applies, writing nothing.

The change is a stack of patches (detgrid.levels.UPSTREAM_STACK): the core, the cuDNN route, then
the core's speed levels; ``--upto`` names the last one applied, the whole stack by default. Every
edit of a patch is found present on a second run, so ``--upto cudnn`` on a tree with the core
committed adds the cuDNN patch alone, and the default on a tree with both adds the speed levels.

core:

- ``cuda/GridSamplerDeterministic.cu`` (the kit's, ``stack.core_sources(kit, "core")``): the
  deterministic launcher, declared in ``cuda/GridSampler.h`` beside the existing backward launchers;
- ``GridSampler.cu``: in both backward launchers, the deterministic branch (deterministic mode
  with grad_input requested) goes where the alert was, and the alert moves into its else branch:
  grid-only calls keep the existing kernel, which has one writer per element for them, without an
  alert. The branch goes after the launcher's argument checks (on main
  ``check_grid_sampler_{2d,3d}_backward``, which validate grad_output's sizes too, #191915); a
  check after the alert, which the branch would skip, is refused. A checkout with a deterministic
  branch of its own (e.g. #196856's) is refused unless ``--replace-existing-deterministic-path``
  asks to replace it with ours. The launcher reads ``deterministicAlgorithms()`` once per call and
  nothing else depends on it: ``cuda/GridSampler.cpp`` is not edited, so grad_input is
  zero-filled as the existing code does in every mode (a thread that flips the flag mid-call
  cannot hand the atomicAdd kernel unzeroed memory);
- the alert tests of grid_sampler_{2d,3d}_backward_cuda expect no alert; the tests added to
  ``test_nn.py`` (upstream's code, in ``upstream_test_nn.py``) are only those the checkout's own
  deterministic tests lack, with only the helpers and imports they use, and its gradgradcheck
  only where ``derivatives.yaml`` differentiates grid_sampler_2d_backward (#177487).

cudnn:

- ``native/GridSampler.cpp``: the composite ``grid_sampler`` does not pick cuDNN in deterministic
  mode, so F.grid_sample's backward is the deterministic one there too;
- ``cudnn/GridSampler.cpp``: ``cudnn_grid_sampler_backward`` alerts in deterministic mode (added
  where the checkout lacks #180417's alert; a deterministic path of the checkout's own is kept);
- ``test_torch.py``: the cuDNN alert test calls ``torch.cudnn_grid_sampler`` itself, and a test
  that F.grid_sample on a cuDNN-eligible input does not alert; the cuDNN route's tests of
  ``test_nn.py``;
- the docstring and notes page list the op as deterministic (only true with this patch: without
  it the cuDNN route alerts or is silently nondeterministic).

speed levels (``UpstreamPatch.speed_level``), each its own patch:

- ``cuda/GridSamplerDeterministic.cu`` as ``stack.core_sources(kit, level)`` has it (the core's
  file with the diffs of the levels up to this one applied), and nothing else: a level changes no
  bit of grad_input, adds no file and no test.

``--tests-only`` writes only the tests (test_torch.py, test_nn.py) of the patches up to ``--upto``
as a patch of their own: a conformance suite for any deterministic backward (#196856's included).
"""

import argparse
import ast
import collections
import fnmatch
import functools
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from detgrid.kit import patch_apply, stack

KIT_ROOT = Path(__file__).resolve().parents[3]
KERNEL_DIR = stack.KERNEL_DIR
CORE_FILES = stack.CORE_FILES  # the files the core adds (basenames), from stack.core_sources
CORE_SOURCE = f"{KERNEL_DIR}/GridSamplerDeterministic.cu"  # defines DET_LAUNCHER
CORE = stack.CORE  # the first patch: the new file, the dispatch, the core's tests
CUDNN_PATCH = "cudnn"  # the cuDNN route: the composite, the cuDNN backward, docs, their tests
SPEED_LEVELS = tuple(u.name for u in stack.UPSTREAM_STACK if u.speed_level)  # edit the .cu alone
TOP = stack.UPSTREAM_NAMES[-1]  # --upto's default: the whole stack
assert CUDNN_PATCH in stack.UPSTREAM_NAMES and CUDNN_PATCH not in SPEED_LEVELS
DIMS = (2, 3)  # grid_sampler_2d and grid_sampler_3d: one edit, parameterised by dims
LAUNCHERS = {d: f"launch_grid_sampler_{d}d_backward_kernel" for d in DIMS}
DET_LAUNCHER = "launch_grid_sampler_backward_deterministic_kernel"  # for both dims
CU = "aten/src/ATen/native/cuda/GridSampler.cu"
CU_HEADER = "aten/src/ATen/native/cuda/GridSampler.h"  # declares the CUDA launchers
COMPOSITE = "aten/src/ATen/native/GridSampler.cpp"  # grid_sampler(): picks cuDNN or not
CUDNN = "aten/src/ATen/native/cudnn/GridSampler.cpp"
INIT = "torch/__init__.py"
NOTES = ("docs/source/notes/randomness.rst", "docs/source/notes/randomness.md")
TEST_TORCH = "test/test_torch.py"
TEST_NN = "test/test_nn.py"


class AnchorError(Exception):
    """The checkout is not what an edit expects; the change is refused as a whole."""

    def __init__(self, path: str, anchor: str, why: str = "not found"):
        super().__init__(f"{path}: anchor {anchor!r}: {why}")
        self.path, self.anchor, self.why = path, anchor, why


class ExistingDeterministicPath(AnchorError):
    """The checkout has a deterministic grid_sample path already; replacing it is the user's
    explicit choice (--replace-existing-deterministic-path), never a side effect."""


class NotUsable(AnchorError):
    """The path given is no git checkout of PyTorch, or the kit has no kernel sources; the
    message names the path."""

    def __init__(self, path: str, why: str):
        Exception.__init__(self, why)
        self.path, self.anchor, self.why = path, path, why


@dataclass
class Base:
    version_txt: str
    describe: Optional[str]  # an exact tag at HEAD, if any
    head: str

    @property
    def label(self) -> str:
        """patches/<label>.patch: an exact tag, else v<version.txt without the a0 suffix>."""
        if self.describe and re.fullmatch(r"v\d+\.\d+\.\d+(-rc\d+)?", self.describe):
            return self.describe
        return "v" + re.sub(r"a0$", "", self.version_txt) + f"+g{self.head[:12]}"

    def __str__(self) -> str:
        return f"version.txt {self.version_txt}, git describe {self.describe or '-'}, HEAD {self.head}"


@dataclass
class Plan:
    base: Base
    old: Dict[str, Optional[bytes]] = field(default_factory=dict)
    new: Dict[str, bytes] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    tests_only: bool = False
    parts: set = field(default_factory=set)  # the patches (stack.UPSTREAM_NAMES) it edits

    @property
    def changed(self) -> List[str]:
        return sorted(p for p in self.new if self.new[p] != self.old.get(p))


# --------------------------------------------------------------------------- source scanning


def _skip_literal(text: str, i: int) -> int:
    """If text[i] opens a comment or a string/char literal, return the index after it."""
    if text.startswith("//", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        return len(text) if j < 0 else j + 2
    if text[i] in "\"'":
        q, j = text[i], i + 1
        while j < len(text) and text[j] != q:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def _match(text: str, i: int, open_: str, close: str) -> int:
    """Index of the bracket closing text[i] (== open_), skipping comments and literals."""
    depth = 0
    while i < len(text):
        j = _skip_literal(text, i)
        if j != i:
            i = j
            continue
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced")


def _split_top(args: str) -> List[str]:
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [a.strip() for a in out]


@dataclass
class Func:
    start: int  # start of the name match
    params: List[str]  # parameter names
    body_open: int  # index of '{'
    body_close: int  # index of '}'


def _find_defs(text: str, ret: str, name: str) -> List[Func]:
    defs = []
    for m in re.finditer(rf"{ret}\s+{re.escape(name)}\s*\(", text):
        po = m.end() - 1
        try:
            pc = _match(text, po, "(", ")")
        except ValueError:
            continue
        k = pc + 1
        while k < len(text) and text[k].isspace():
            k += 1
        if k >= len(text) or text[k] != "{":
            continue  # a declaration or a call
        params = []
        for p in _split_top(text[po + 1 : pc]):
            p = re.sub(r"/\*.*?\*/", "", p).split("=")[0].strip()
            mm = re.search(r"(\w+)\s*$", p)
            params.append(mm.group(1) if mm else "")
        defs.append(Func(m.start(), params, k, _match(text, k, "{", "}")))
    return defs


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _indent_of(text: str, i: int) -> str:
    ls = _line_start(text, i)
    return re.match(r"[ \t]*", text[ls:]).group(0)


# --------------------------------------------------------------------------- edits


ROLES = ("grad_input", "grad_grid", "grad_output", "input", "grid", "interpolation_mode",
         "padding_mode", "align_corners", "output_mask")


def _launcher_args(path: str, f: Func, launcher: str) -> Dict[str, str]:
    names = f.params
    if set(ROLES) <= set(names):
        return {r: r for r in ROLES}
    if len(names) == len(ROLES) and all(names):
        return dict(zip(ROLES, names))  # same order, renamed parameters
    raise AnchorError(path, f"{launcher}(...) parameters",
                      f"expected the 9 parameters {', '.join(ROLES)}; found {', '.join(names)}")


def _remove_existing_det_branch(body: str) -> Tuple[str, Optional[str]]:
    """Remove an ``if (...deterministicAlgorithms()...) { ... }`` block (another deterministic
    path, e.g. PR #196856's) from a launcher body; return the new body and the removed
    ``if (...) {...}`` text (None when there was none)."""
    m = re.search(r"deterministicAlgorithms\(\)", body)
    if not m:
        return body, None
    ifm = None
    for cand in re.finditer(r"\bif\s*\(", body[: m.start()]):
        ifm = cand
    if ifm is None:
        return body, None
    cond_close = _match(body, ifm.end() - 1, "(", ")")
    if cond_close < m.start():
        return body, None
    k = cond_close + 1
    while body[k].isspace():
        k += 1
    if body[k] != "{":
        return body, None
    end = _match(body, k, "{", "}") + 1
    removed = body[ifm.start() : end]
    # an else branch of that if keeps running as the non-deterministic path
    rest = body[end:]
    em = re.match(r"\s*else\s*\{", rest)
    start = _line_start(body, ifm.start())
    # take the comment lines right above the if along with it
    while True:
        prev = body.rfind("\n", 0, start - 1) + 1
        if start > 0 and re.match(r"[ \t]*//", body[prev:start]):
            start = prev
        else:
            break
    if em:
        eb = end + em.end() - 1
        ee = _match(body, eb, "{", "}")
        inner = body[eb + 1 : ee]
        tail = body[ee + 1 :].lstrip(" ")
        tail = tail[1:] if tail.startswith("\n") else tail  # the else's own line break
        return body[:start] + _dedent(inner, 2).strip("\n") + "\n" + tail, removed
    tail = body[end:]
    if tail.startswith("\n"):
        tail = tail[1:]
    return body[:start] + tail, removed


def _dedent(block: str, n: int) -> str:
    return "\n".join(line[n:] if line.startswith(" " * n) else line for line in block.split("\n"))


CPP_WORDS = frozenset((
    "if", "for", "while", "switch", "return", "sizeof", "alignof", "alignas", "decltype",
    "static_assert", "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "noexcept",
    "operator", "defined", "catch", "throw", "typeid", "namespace", "template", "typename"))


def _calls(code: str) -> List[str]:
    """Free functions called in a piece of code (not methods, keywords or macros), in order."""
    out = []
    for m in re.finditer(r"(?<![.>\w])((?:\w+::)*)([A-Za-z_]\w*)\s*\(", code):
        name = m.group(2)
        if name not in CPP_WORDS and not re.fullmatch(r"[A-Z0-9_]+", name) and name not in out:
            out.append(name)
    return out


# The deterministic launcher's parameters (GridSamplerDeterministic.cu defines it, GridSampler.h
# declares it): (role in _launcher_args, type).
DET_PARAMS = (("grad_input", "const TensorBase&"), ("grad_output", "const TensorBase&"),
              ("input", "const TensorBase&"), ("grid", "const TensorBase&"),
              ("interpolation_mode", "int64_t"), ("padding_mode", "int64_t"),
              ("align_corners", "bool"))
COLUMNS = 80  # PyTorch's clang-format wraps C++ at 80


def _wrap_args(ind: str, args: List[str]) -> str:
    """Arguments at ``ind``, as many to a line as fit in COLUMNS, each line but the last ending
    in a comma (clang-format's bin-packing)."""
    lines, cur = [], ""
    for i, arg in enumerate(args):
        piece = arg + ("," if i < len(args) - 1 else "")
        if cur and len(ind) + len(cur) + 1 + len(piece) > COLUMNS:
            lines.append(cur)
            cur = piece
        else:
            cur = f"{cur} {piece}" if cur else piece
    lines.append(cur)
    return "".join(f"{ind}{line}\n" for line in lines)


ALERT_NOTE = ("// See Note [Writing Nondeterministic Operations]\n",
              "// Nondeterministic because of atomicAdd usage\n")


def _det_block(ind: str, ctx: str, a: Dict[str, str], alert: str, comments: str) -> str:
    """The dispatch that takes the launcher's alert into its else branch. Only grad_input is
    accumulated with atomicAdd: in deterministic mode the deterministic launcher makes grad_input,
    and the existing kernel then runs for grad_grid alone (output_mask[0] cleared), with one writer
    per grad_grid element, so grad_grid keeps the existing kernel's bits. The alert stays, with its
    Note, for grad_input requested outside deterministic mode (warn_only's warning included: that
    mode takes the deterministic path); grid-only calls reach no atomicAdd and do not alert."""
    mask = a["output_mask"]
    inner = ind + "  "
    note = "".join(inner + line.strip() + "\n" for line in comments.splitlines() if line.strip())
    return (
        f"{ind}if ({mask}[0] && {ctx}.deterministicAlgorithms()) {{\n"
        f"{inner}// See Note [Deterministic grid_sampler backward]: grad_input without\n"
        f"{inner}// atomics. The kernel below then computes grad_grid alone, one writer\n"
        f"{inner}// per element.\n"
        f"{inner}{DET_LAUNCHER}(\n"
        + _wrap_args(inner + "    ", [a[role] for role, _ in DET_PARAMS])[:-1] + ");\n"
        f"{inner}{mask}[0] = false;\n"
        f"{ind}}} else if ({mask}[0]) {{\n"
        + (note or "".join(inner + line for line in ALERT_NOTE))
        + f"{inner}{alert.strip()}\n"
        f"{ind}}}\n"
    )


def _add_det_dispatch(path: str, text: str, dims: int, notes: List[str],
                      replace_existing: bool) -> str:
    """Put the deterministic branch in place of launch_grid_sampler_<dims>d_backward_kernel's
    nondeterministic alert. Another deterministic branch found there is replaced only with
    ``replace_existing``; otherwise ExistingDeterministicPath refuses the whole change."""
    launcher = LAUNCHERS[dims]
    defs = _find_defs(text, r"\bvoid", launcher)
    if len(defs) != 1:
        raise AnchorError(path, f"void {launcher}(...) {{...}}", f"{len(defs)} definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    if f"{DET_LAUNCHER}(" in body:
        notes.append(f"{path}: {dims}D deterministic dispatch already present")
        return text
    a = _launcher_args(path, f, launcher)
    body, removed = _remove_existing_det_branch(body)
    if removed is not None:
        calls = ", ".join(f"{c}()" for c in _calls(removed) if c != "globalContext")
        if not replace_existing:
            raise ExistingDeterministicPath(
                path, f"{launcher}(...)",
                f"the checkout has a deterministic path already (calling {calls or 'nothing'}, as "
                "upstream PR #196856 does); nothing was changed. Pass "
                "--replace-existing-deterministic-path to replace it with detgrid's")
        notes.append(f"{path}: replaced an existing deterministic branch in {launcher} "
                     f"(upstream PR #196856's path, calling {calls or 'nothing'}) with detgrid's")
    caller = f"grid_sampler_{dims}d_backward_cuda"
    alert = re.search(
        r'(?P<comments>(?:^[ \t]*//[^\n]*\n)*)^(?P<ind>[ \t]*)(?P<ctx>(?:at::)?globalContext\(\))'
        rf'\.alertNotDeterministic\(\s*"{caller}"\s*\);[ \t]*\n',
        body, re.M)
    if alert is None:
        raise AnchorError(path, f'alertNotDeterministic("{caller}")',
                          f"not found in the body of {launcher}")
    # The branch returns where the alert was: every argument check of the launcher (main's
    # check_grid_sampler_<dims>d_backward validates grad_output's sizes, #191915) must run
    # before it, or the deterministic path would skip it.
    late = re.search(r"\b(check_grid_sampler\w*)\s*\(", _code_only(body[alert.end() :]))
    if late:
        raise AnchorError(path, f"{late.group(1)}(...) in {launcher}",
                          "runs after the nondeterministic alert, where the deterministic branch "
                          "goes: that path would skip the check")
    alert_line = alert.group(0)[len(alert.group("comments")) :]
    block = _det_block(alert.group("ind"), alert.group("ctx"), a, alert_line, alert.group("comments"))
    body = body[: alert.start()] + block + body[alert.end() :]
    return text[: f.body_open] + body + text[f.body_close + 1 :]


def edit_gridsampler_cu(path: str, text: str, notes: List[str],
                        replace_existing: bool = False) -> str:
    """Both launchers dispatch; the launcher's declaration is GridSampler.h's, which the file
    includes already (checked: without it the call would not compile)."""
    if not re.search(r"^#include <ATen/native/cuda/GridSampler\.h>", text, re.M):
        raise AnchorError(path, "#include <ATen/native/cuda/GridSampler.h>",
                          f"not found: it declares {DET_LAUNCHER}")
    for dims in DIMS:
        text = _add_det_dispatch(path, text, dims, notes, replace_existing)
    return text


def _declarations(text: str, name: str) -> List[Tuple[int, int]]:
    """(start of line, end past ';' and its line break) of each declaration (not definition)
    of ``void name(...)``."""
    out = []
    for m in re.finditer(rf"^[ \t]*void\s+{re.escape(name)}\s*\(", text, re.M):
        close = _match(text, m.end() - 1, "(", ")")
        tail = re.match(r"\s*;[ \t]*\n?", text[close + 1 :])
        if tail:
            out.append((m.start(), close + 1 + tail.end()))
    return out


def det_declaration() -> str:
    """The launcher's declaration, in cuda/GridSampler.h's style (``const TensorBase &x``)."""
    params = [f"{t[:-1]} &{n}" if t.endswith("&") else f"{t} {n}" for n, t in DET_PARAMS]
    return f"void {DET_LAUNCHER}(\n" + _wrap_args("    ", params)[:-1] + ");\n"


def edit_cuda_header(path: str, text: str, notes: List[str]) -> str:
    """Declare the deterministic launcher right after the existing backward launchers'
    declarations (both must be there: the header is the one the kit's .cu includes)."""
    if _declarations(text, DET_LAUNCHER):
        notes.append(f"{path}: {DET_LAUNCHER} already declared")
        return text
    found = {dims: _declarations(text, LAUNCHERS[dims]) for dims in DIMS}
    missing = [LAUNCHERS[d] for d in DIMS if len(found[d]) != 1]
    if missing:
        raise AnchorError(path, f"void {missing[0]}(...);",
                          "not declared once: the deterministic launcher is declared beside the "
                          "backward launchers")
    end = max(found[d][0][1] for d in DIMS)
    return text[:end] + "\n" + det_declaration() + text[end:]


def _code_only(text: str) -> str:
    """C++ text without comments and #include lines: what 'is this name used' looks at."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"^[ \t]*#[ \t]*include[^\n]*", "", text, flags=re.M)


def _declared_names(header: str) -> set:
    """Functions and types a header declares (roughly: every name before a '(' and every
    struct/class/enum/using name), keywords and ALL_CAPS macros aside. A forward declaration
    (``class TensorBase;``) does not count: the type is another header's to provide."""
    code = _code_only(header)
    names = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", code))
    names |= set(re.findall(r"\b(?:struct|class|enum|using)\s+(?:class\s+)?([A-Za-z_]\w*)(?!\s*;)", code))
    return {n for n in names if n not in CPP_WORDS and not re.fullmatch(r"[A-Z0-9_]+", n)}


def _uses(code: str, names: set) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", code) for n in names)


def drop_stale_includes(tree: Path, path: str, old: str, new: str, notes: List[str]) -> str:
    """Remove from ``new`` each #include whose header (read from the tree) declares names that
    ``old`` used and ``new`` no longer does: the header of a deterministic branch we replaced.
    A header the tree lacks, or one still used for anything it declares, stays."""
    ours = {f"ATen/native/cuda/{n}" for n in CORE_FILES}
    old_code, new_code = _code_only(old), _code_only(new)
    for m in reversed(list(re.finditer(r"^#include <([^>]+)>[^\n]*\n", new, re.M))):
        header = tree / "aten/src" / m.group(1)
        if m.group(1) in ours or not header.is_file():
            continue
        names = _declared_names(header.read_text(encoding="utf-8", errors="replace"))
        if names and _uses(old_code, names) and not _uses(new_code, names):
            new = new[: m.start()] + new[m.end() :]
            notes.append(f"{path}: removed #include <{m.group(1)}>: nothing it declares is used "
                         "after the replaced deterministic branch")
    return new


def _add_include(path: str, text: str, header: str, after: Tuple[str, ...]) -> str:
    line = f"#include <{header}>\n"
    if line in text:
        return text
    for prefix in after:
        ms = list(re.finditer(rf"^#include <{re.escape(prefix)}[^>]*>[^\n]*\n", text, re.M))
        if ms:
            m = ms[0] if prefix.endswith(".h") else ms[-1]
            return text[: m.end()] + line + text[m.end() :]
    raise AnchorError(path, f"#include <{after[0]}>", f"no place to include <{header}>")


def _statement_end(body: str, start: int) -> int:
    """Index just past the ``;`` (and its line break) ending the statement that starts at body[start]."""
    i = start
    while body[i] != ";":
        j = _skip_literal(body, i)
        if j != i:
            i = j
        elif body[i] == "(":
            i = _match(body, i, "(", ")") + 1
        else:
            i += 1
    nl = body.find("\n", i)
    return len(body) if nl < 0 else nl + 1


CUDNN_CHECKS = (r"\bcheck_grid_sampler_common\s*\(", r"\bTORCH_CHECK\s*\(\s*cond_cudnn_grid_sampler\s*\(")
CUDNN_ALERT = (r'(?:^[ \t]*//[^\n]*\n)*^[ \t]*(?:at::)?globalContext\(\)\.alertNotDeterministic\(\s*'
               r'"cudnn_grid_sampler_backward[^"]*"\s*\);[ \t]*\n')


CUDNN_CALLER = "cudnn_grid_sampler_backward"


def edit_cudnn(path: str, text: str, notes: List[str]) -> str:
    """cudnn_grid_sampler_backward alerts in deterministic mode, right after its own argument
    checks (where #180417 put it): with the composite off cuDNN in deterministic mode, only a
    direct call reaches it. An alert already there (#180417) is kept; so is a deterministic path
    of the checkout's own (#196856 delegates to grid_sampler_2d_backward): nothing there is left
    to alert about."""
    defs = [d for d in _find_defs(text, r"std::tuple<\s*Tensor\s*,\s*Tensor\s*>", CUDNN_CALLER)
            if "not compiled with cuDNN" not in text[d.body_open : d.body_close]]
    if len(defs) != 1:
        raise AnchorError(path, "std::tuple<Tensor, Tensor> cudnn_grid_sampler_backward(...) {...}",
                          f"{len(defs)} cuDNN-enabled definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    if re.search(CUDNN_ALERT, body, re.M):
        notes.append(f"{path}: the cuDNN backward alerts in deterministic mode already (#180417)")
        return text
    if "deterministicAlgorithms()" in body and "grid_sampler_2d_backward(" in body:
        notes.append(f"{path}: the cuDNN backward has a deterministic path of its own "
                     "(delegating to grid_sampler_2d_backward); kept, without an alert")
        return text
    checks = [m for rx in CUDNN_CHECKS for m in re.finditer(rx, body)]
    if not checks:
        raise AnchorError(path, "check_grid_sampler_common(...) / TORCH_CHECK(cond_cudnn_grid_sampler(...))",
                          "not found in cudnn_grid_sampler_backward: the alert goes after "
                          "upstream's argument checks")
    last = max(checks, key=lambda m: m.start())
    at = _statement_end(body, last.start())
    ind = _indent_of(body, last.start())
    block = (f"{ind}// See Note [Writing Nondeterministic Operations]\n"
             f"{ind}// Nondeterministic: cuDNN's sampler backward sums in no fixed order.\n"
             f'{ind}globalContext().alertNotDeterministic("{CUDNN_CALLER}");\n')
    body = body[:at] + block + body[at:]
    text = text[: f.body_open] + body + text[f.body_close + 1 :]
    if "#include <ATen/Context.h>" not in text:
        text = _add_include(path, text, "ATen/Context.h", after=("ATen/Config.h", "ATen/"))
    return text


COMPOSITE_WHY = "// Not cuDNN in deterministic mode: its backward is nondeterministic."


def edit_composite(path: str, text: str, notes: List[str]) -> str:
    """The composite grid_sampler() picks cuDNN only outside deterministic mode: its condition
    for cuDNN (the ``if`` whose condition calls cond_cudnn_grid_sampler and whose branch returns
    cudnn_grid_sampler) gains ``!deterministicAlgorithms()``, with a one-line why."""
    defs = [d for d in _find_defs(text, r"\bTensor", "grid_sampler") if len(d.params) == 5]
    if len(defs) != 1:
        raise AnchorError(path, "Tensor grid_sampler(input, grid, interpolation_mode, padding_mode, "
                          "align_corners) {...}", f"{len(defs)} definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    found = None
    for m in re.finditer(r"\bif\s*\(", body):
        close = _match(body, m.end() - 1, "(", ")")
        cond = body[m.end() : close]
        k = close + 1
        while body[k].isspace():
            k += 1
        if "cond_cudnn_grid_sampler(" in cond and body[k] == "{":
            end = _match(body, k, "{", "}")
            if re.search(r"return\s+(?:at::)?(?:native::)?cudnn_grid_sampler\(", body[k:end]):
                found = (m, close, cond)
                break
    if found is None:
        raise AnchorError(path, "if (cond_cudnn_grid_sampler(...) ...) { return cudnn_grid_sampler(...); }",
                          "not found in grid_sampler")
    m, close, cond = found
    if "deterministicAlgorithms()" in cond:
        notes.append(f"{path}: grid_sampler already leaves cuDNN in deterministic mode")
        return text
    ind = _indent_of(body, m.start())
    last_line = cond.rsplit("\n", 1)
    cont = re.match(r"[ \t]*", last_line[1]).group(0) if len(last_line) == 2 else ind + "    "
    cond_end = m.end() + len(cond.rstrip())
    body = (body[: _line_start(body, m.start())] + f"{ind}{COMPOSITE_WHY}\n"
            + body[_line_start(body, m.start()) : cond_end]
            + f" &&\n{cont}!at::globalContext().deterministicAlgorithms()" + body[cond_end:])
    text = text[: f.body_open] + body + text[f.body_close + 1 :]
    if "#include <ATen/Context.h>" not in text:
        text = _add_include(path, text, "ATen/Context.h", after=("ATen/core/Tensor.h", "ATen/"))
    return text


GS = ":func:`torch.nn.functional.grid_sample`"


def edit_init_doc(path: str, text: str, notes: List[str]) -> str:
    act = re.search(r"normally-nondeterministic operations will act\s+deterministically when "
                    r"``mode=True``:\n\n((?:[ \t]+\S[^\n]*\n|\n(?=[ \t]{6,}\S))+)", text)
    throw = re.search(r"normally-nondeterministic operations will throw a\s+:class:`RuntimeError` "
                      r"when ``mode=True``:\n\n((?:[ \t]+\S[^\n]*\n|\n(?=[ \t]{6,}\S))+)", text)
    if not act or not throw:
        raise AnchorError(path, "use_deterministic_algorithms docstring lists",
                          "'will act deterministically' / 'will throw a RuntimeError' lists not found")
    # the bullet with its continuation lines (e.g. an older "with 5-D input" qualifier)
    gm = re.search(rf"^([ \t]+)\* {re.escape(GS)} when attempting to differentiate a CUDA tensor\n"
                   r"(?:\1  [^\n]*\n)*", throw.group(1), re.M)
    if GS in act.group(1):
        if gm is not None:
            raise AnchorError(path, f"* {GS} ...", "listed as both deterministic and throwing "
                              "(an older detgrid patch?); restore the docstring first")
        notes.append(f"{path}: grid_sample already listed as deterministic")
        return text
    if gm is None:
        raise AnchorError(path, f"* {GS} ... (throw list)", "grid_sample not in the throw list")
    # 2D and 3D backwards are both deterministic now: the whole entry moves
    ind = gm.group(1)
    new_throw = throw.group(1)[: gm.start()] + throw.group(1)[gm.end() :]
    new_act = act.group(1) + f"{ind}* {GS} when attempting to differentiate a CUDA tensor\n"
    # throw list comes after act list
    return (text[: act.start(1)] + new_act + text[act.end(1) : throw.start(1)] + new_throw
            + text[throw.end(1) :])


# test/test_torch.py's alert tests of the launchers, by name, with the caller each checks: with the
# core, grid_sampler_{2d,3d}_backward_cuda have a deterministic path, so neither may expect an alert.
ALERT_TESTS = (
    ("test_nondeterministic_alert_grid_sample_2d", "grid_sampler_2d_backward_cuda"),
    ("test_nondeterministic_alert_grid_sample_3d", "grid_sampler_3d_backward_cuda"),
)
REQUIRED_ALERT_TESTS = tuple(name for name, _ in ALERT_TESTS)
# The cuDNN backward's alert test (#180417's) keeps expecting its alert: it must reach
# cudnn_grid_sampler_backward by a direct call, grid_sample no longer going there in
# deterministic mode. Beside it, grid_sample on a cuDNN-eligible input must not alert.
CUDNN_ALERT_TEST = "test_nondeterministic_alert_grid_sample_2d_cudnn"
CUDNN_ROUTE_TEST = "test_nondeterministic_alert_grid_sample_2d_cudnn_eligible"
CUDNN_TEST_NAMES = ("unittest", "TEST_CUDNN", "skipIfRocm", "onlyCUDA", "skipIfTorchInductor")
CUDNN_TESTS_SOURCE = {
    CUDNN_ALERT_TEST: """\
    @unittest.skipIf(not TEST_CUDNN, "CUDNN not available")
    @skipIfRocm
    @onlyCUDA
    @skipIfTorchInductor("https://github.com/pytorch/pytorch/issues/113707")
    def test_nondeterministic_alert_grid_sample_2d_cudnn(self, device):
        def fn():
            input = torch.empty(1, 1, 2, 2, device=device, requires_grad=True)
            grid = torch.empty(1, 1, 1, 2, device=device)
            # grid_sample leaves cuDNN in deterministic mode: call it directly.
            res = torch.cudnn_grid_sampler(input, grid)
            res.backward(torch.ones_like(res))

        self.check_nondeterministic_alert(
            fn,
            'cudnn_grid_sampler_backward',
            True)

""",
    CUDNN_ROUTE_TEST: """\
    @unittest.skipIf(not TEST_CUDNN, "CUDNN not available")
    @onlyCUDA
    @skipIfTorchInductor("https://github.com/pytorch/pytorch/issues/113707")
    def test_nondeterministic_alert_grid_sample_2d_cudnn_eligible(self, device):
        # Bilinear, zeros padding and align_corners=True: an input cuDNN can take.
        # In deterministic mode grid_sample takes grid_sampler_2d instead, whose
        # backward does not alert.
        def fn():
            input = torch.zeros(1, 1, 2, 2, device=device, requires_grad=True)
            grid = torch.zeros(1, 1, 1, 2, device=device)
            with torch.backends.cudnn.flags(enabled=True):
                res = torch.nn.functional.grid_sample(input, grid, align_corners=True)
                res.backward(torch.ones_like(res))

        self.check_nondeterministic_alert(
            fn,
            'cudnn_grid_sampler_backward',
            False)

""",
}
DIRECT_CUDNN_COMMENT = "# grid_sample leaves cuDNN in deterministic mode: call it directly."


def _method(text: str, name: str) -> Optional[Tuple[int, int]]:
    """(start, end) of the body of ``def name(self, ...)`` in a class: the lines after its
    signature up to the next line indented no deeper than the ``def``."""
    m = re.search(rf"^([ \t]+)def {name}\(self\b[^\n]*\n", text, re.M)
    if m is None:
        return None
    end = re.compile(rf"^{m.group(1)}\S", re.M).search(text, m.end())
    return m.end(), end.start() if end else len(text)


def _expect_no_alert(path: str, text: str, name: str, caller: str, notes: List[str]) -> str:
    """The last argument (should_alert) of the test's check_nondeterministic_alert(fn, caller,
    should_alert) becomes False."""
    span = _method(text, name)
    if span is None:
        if name in REQUIRED_ALERT_TESTS:
            raise AnchorError(path, f"def {name}")
        return text  # the cuDNN alert test exists only where #180417 is
    body = text[span[0] : span[1]]
    c = re.search(r"self\.check_nondeterministic_alert\(", body)
    if c is None:
        raise AnchorError(path, f"self.check_nondeterministic_alert(...) in {name}")
    close = _match(body, c.end() - 1, "(", ")")
    args = _split_top(body[c.end() : close])
    if len(args) != 3 or caller not in args[1]:
        raise AnchorError(path, f"check_nondeterministic_alert(fn, '{caller}', should_alert)",
                          f"arguments {args}")
    if args[2] == "False":
        notes.append(f"{path}: {name} already expects no alert")
        return text
    arg_start = body.rfind(args[2], 0, close)
    ls = _line_start(body, c.start())
    cind = _indent_of(body, c.start())
    comment = (f"{cind}# In deterministic mode the CUDA backward takes its deterministic path\n"
               f"{cind}# (Note [Deterministic grid_sampler backward]): no alert on any device.\n")
    body = body[:ls] + comment + body[ls:arg_start] + "False" + body[arg_start + len(args[2]) :]
    return text[: span[0]] + body + text[span[1] :]


def edit_test_torch(path: str, text: str, notes: List[str]) -> str:
    """The core's part: the launchers' alert tests expect no alert."""
    for name, caller in ALERT_TESTS:
        text = _expect_no_alert(path, text, name, caller, notes)
    return text


def _direct_cudnn_call(path: str, text: str, notes: List[str]) -> str:
    """The cuDNN alert test's grid_sample call becomes torch.cudnn_grid_sampler's: in
    deterministic mode grid_sample no longer reaches cuDNN."""
    span = _method(text, CUDNN_ALERT_TEST)
    body = text[span[0] : span[1]]
    if "torch.cudnn_grid_sampler(" in body:
        notes.append(f"{path}: {CUDNN_ALERT_TEST} calls torch.cudnn_grid_sampler already")
        return text
    calls = list(re.finditer(r"^([ \t]*)(\w+) = (?:torch\.nn\.functional|F)\.grid_sample\("
                             r"(\w+), (\w+)(?:, align_corners=True)?\)[ \t]*\n", body, re.M))
    if len(calls) != 1:
        raise AnchorError(path, f"res = torch.nn.functional.grid_sample(input, grid, "
                          f"align_corners=True) in {CUDNN_ALERT_TEST}",
                          f"{len(calls)} such calls found")
    m = calls[0]
    ind, res, inp, grid = m.groups()
    new = f"{ind}{DIRECT_CUDNN_COMMENT}\n{ind}{res} = torch.cudnn_grid_sampler({inp}, {grid})\n"
    body = body[: m.start()] + new + body[m.end() :]
    return text[: span[0]] + body + text[span[1] :]


def _method_end(text: str, name: str) -> int:
    """Where the next member after method ``name`` (its trailing blank lines included) begins."""
    span = _method(text, name)
    end = span[1]
    while True:  # the decorators of the next member are its own
        prev = text.rfind("\n", 0, end - 1) + 1
        if prev < end and re.match(r"[ \t]+@", text[prev:end]):
            end = prev
        else:
            return end


def edit_test_torch_cudnn(path: str, text: str, notes: List[str]) -> str:
    """The cuDNN patch's part: the cuDNN alert test (added where #180417 is absent) calls
    cudnn_grid_sampler itself and keeps expecting its alert; a test beside it checks that
    grid_sample on a cuDNN-eligible input does not alert."""
    if _method(text, CUDNN_ALERT_TEST) is not None:
        text = _direct_cudnn_call(path, text, notes)
    missing = [n for n in (CUDNN_ALERT_TEST, CUDNN_ROUTE_TEST) if _method(text, n) is None]
    if not missing:
        notes.append(f"{path}: the cuDNN route's alert tests are present already")
        return text
    imported = _module_imports(path, text)
    lacking = [n for n in CUDNN_TEST_NAMES if not imported[n]]
    if lacking:
        raise AnchorError(path, f"imports of {', '.join(CUDNN_TEST_NAMES)}",
                          f"{', '.join(lacking)} not imported: the added tests use them")
    for name in missing:  # in order: the alert test, then the route test after it
        after = CUDNN_ALERT_TEST if name == CUDNN_ROUTE_TEST else ALERT_TESTS[0][0]
        if _method(text, after) is None:
            raise AnchorError(path, f"def {after}")
        at = _method_end(text, after)
        if not text[:at].endswith("\n\n"):
            raise AnchorError(path, f"def {after}", "no blank line after it to add a test at")
        text = text[:at] + CUDNN_TESTS_SOURCE[name] + text[at:]
    return text


# The tests the patch adds to test/test_nn.py's TestNNDeviceType, each only where the checkout's own
# deterministic grid_sample tests (upstream main has six, from #196856) do not already check the
# behaviour. They are upstream's code in a module of their own, read here as text: importing it
# would import torch, which `detgrid patch` must not (a checkout's torch/ may shadow it).
NN_TESTS_FILE = Path(__file__).with_name("upstream_test_nn.py")
NN_TESTS_CLASS = "TestNNDeviceType"
NN_TESTS_TABLE = "ADDED"


@dataclass(frozen=True)
class NNMethod:
    name: str
    source: str  # decorators and method, indented for the class body, as the file has them
    uses: frozenset  # the names of the file's imports and helper methods that it uses itself


@dataclass(frozen=True)
class NNTest(NNMethod):
    # the fields of its row in the file's ADDED table, which says what each means
    checks: str
    covered_if: Optional[Tuple[str, ...]]
    needs_double_backward: bool = False
    in_tree_only_on_cuda: bool = False

    def covered(self, src: str) -> bool:
        """Does this upstream deterministic test's source check it too?"""
        return self.covered_if is not None and all(re.search(p, src) for p in self.covered_if)


@dataclass(frozen=True)
class NNTests:
    helpers: Dict[str, NNMethod]  # by name, in the file's order
    tests: Tuple[NNTest, ...]  # in the file's order, which is the order they are added in
    imports: Dict[str, str]  # each name the file imports -> the import of that name alone

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.tests)

    def needs(self, tests: List[NNTest]) -> set:
        """The helpers and imported names ``tests`` use, through the helpers they call too."""
        needed, todo = set(), [name for t in tests for name in t.uses]
        while todo:
            name = todo.pop()
            if name not in needed:
                needed.add(name)
                todo.extend(self.helpers[name].uses if name in self.helpers else ())
        return needed

    def block(self, tests: List[NNTest], present: frozenset = frozenset()) -> str:
        """The class body text for ``tests``: the helpers they need but ``present``, then the
        tests, each method followed by a blank line."""
        needed = self.needs(tests)
        helpers = [h for name, h in self.helpers.items() if name in needed and name not in present]
        return "".join(m.source + "\n" for m in [*helpers, *tests])


def _import_lines(tree: ast.Module) -> Dict[str, str]:
    """Each name a module's imports bind -> the import of that name alone."""
    lines = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                what = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                from_ = f"from {node.module} " if isinstance(node, ast.ImportFrom) else ""
                lines[(alias.asname or alias.name).split(".")[0]] = from_ + what
    return lines


def _names_used(fn: ast.FunctionDef, known: set) -> frozenset:
    """The names of ``known`` that ``fn`` (its decorators included) uses: as a name, or as an
    attribute of self (a helper)."""
    used = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            used.add(node.attr)
    return frozenset(used & known)


def _method_source(lines: List[str], fn: ast.FunctionDef) -> str:
    """Its lines, from its first decorator (a comment between decorators included) to its end."""
    start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    return "".join(lines[start - 1 : fn.end_lineno])


def _class(tree: ast.Module, path: Path, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise NotUsable(str(path), f"{path}: no class {name}")


def _table(tree: ast.Module, path: Path, name: str) -> dict:
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise NotUsable(str(path), f"{path}: no {name} = {{...}} at module level")


def load_nn_tests(path: Path) -> NNTests:
    """The methods of ``path``'s TestNNDeviceType as text, each test with its row of ADDED."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, str(path))
    cls, rows = _class(tree, path, NN_TESTS_CLASS), _table(tree, path, NN_TESTS_TABLE)
    imports = _import_lines(tree)
    methods = [fn for fn in cls.body if isinstance(fn, ast.FunctionDef)]
    known = set(imports) | {fn.name for fn in methods}
    lines = text.splitlines(keepends=True)
    helpers, tests = {}, []
    for fn in methods:
        found = (fn.name, _method_source(lines, fn), _names_used(fn, known))
        if not fn.name.startswith("test_"):
            helpers[fn.name] = NNMethod(*found)
        elif fn.name in rows:
            tests.append(NNTest(*found, **rows[fn.name]))
        else:
            raise NotUsable(str(path), f"{path}: {fn.name} has no row in {NN_TESTS_TABLE}")
    stray = sorted(set(rows) - {t.name for t in tests})
    if stray:
        raise NotUsable(str(path), f"{path}: {NN_TESTS_TABLE} has rows for no test: {', '.join(stray)}")
    return NNTests(helpers, tuple(tests), imports)


@functools.cache
def upstream_nn_tests() -> NNTests:
    return load_nn_tests(NN_TESTS_FILE)


def _module_imports(path: str, text: str) -> collections.Counter:
    """How many times each name is bound by a module-level import (what F811 counts)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise AnchorError(path, "Python source", f"does not parse: {e.msg} (line {e.lineno})") from None
    names = collections.Counter()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] += 1
    return names


def _test_methods(text: str, cls_start: int, cls_end: int) -> List[Tuple[str, int, int]]:
    """(name, start, end) of each ``def test_*`` of a class (methods at 4 spaces), its decorators
    and the blank lines after it included."""
    out = []
    next_member = re.compile(r"^ {0,4}\S", re.M)
    for m in re.finditer(r"^    def (test_\w+)\(", text[:cls_end], re.M):
        if m.start() < cls_start:
            continue
        start = m.start()
        while True:
            prev = text.rfind("\n", 0, start - 1) + 1
            if re.match(r"    @", text[prev:start]):
                start = prev
            else:
                break
        end = next_member.search(text, text.index("\n", m.end()) + 1, cls_end)
        out.append((m.group(1), start, end.start() if end else cls_end))
    return out


def upstream_deterministic_tests(text: str, cls_start: int, cls_end: int) -> Dict[str, str]:
    """The checkout's own deterministic grid_sample tests (name -> source): test methods that run
    grid_sample under DeterministicGuard or use_deterministic_algorithms, the kit's aside."""
    found = {}
    for name, start, end in _test_methods(text, cls_start, cls_end):
        src = text[start:end]
        if (name not in upstream_nn_tests().names and re.search(r"grid_sample", src)
                and re.search(r"DeterministicGuard\(|use_deterministic_algorithms\(", src)):
            found[name] = src
    return found


# The tests of test_nn.py that go through the cuDNN route: they hold only with the cuDNN patch.
CUDNN_NN_TESTS = ("test_grid_sample_2d_backward_deterministic_cudnn",)


def _tests_for(path: str, double_backward: bool, notes: List[str],
               parts: Tuple[str, ...] = stack.UPSTREAM_NAMES) -> List[NNTest]:
    """The tests of the patches ``parts`` this checkout can run: a gradgradcheck only where
    grid_sampler_2d_backward has a derivative (a test that cannot run would only be skipped)."""
    tests = [t for t in upstream_nn_tests().tests
             if (CUDNN_PATCH if t.name in CUDNN_NN_TESTS else CORE) in parts]
    if double_backward:
        return tests
    left_out = [t.name for t in tests if t.needs_double_backward]
    if left_out:
        notes.append(f"{path}: not adding {', '.join(left_out)}: {DERIVATIVES} has no derivative of "
                     "grid_sampler_2d_backward")
    return [t for t in tests if not t.needs_double_backward]


def _wanted_tests(path: str, text: str, upstream: Dict[str, str], double_backward: bool,
                  notes: List[str], parts: Tuple[str, ...]) -> List[NNTest]:
    """The tests to add: those the checkout can run, has not, and no upstream test covers."""
    wanted = []
    for t in _tests_for(path, double_backward, notes, parts):
        if f"def {t.name}(" in text:
            continue
        by = [name for name, src in upstream.items() if t.covered(src)]
        if by:
            notes.append(f"{path}: not adding {t.name} ({t.checks}): upstream's {by[0]} checks it")
        else:
            wanted.append(t)
    return wanted


COMMON_UTILS = "torch.testing._internal.common_utils"


def _join_common_utils_import(path: str, text: str, names: List[str]) -> str:
    """``names`` appended to the checkout's first ``from ...common_utils import`` statement, in
    its own form (a parenthesised list or lines continued with backslashes)."""
    node = next((n for n in ast.parse(text).body
                 if isinstance(n, ast.ImportFrom) and n.module == COMMON_UTILS), None)
    if node is None:
        raise AnchorError(path, f"from {COMMON_UTILS} import ...")
    lines = text.splitlines(keepends=True)
    end = sum(len(line) for line in lines[: node.end_lineno - 1]) + node.end_col_offset
    added = ", ".join(names)
    if text[end - 1] != ")":
        return text[:end] + ", " + added + text[end:]
    before = text[: end - 1].rstrip()
    if before.endswith(",") and "\n" in text[len(before): end - 1]:  # one name a line
        last = before[before.rfind("\n") + 1:]
        indent = last[: len(last) - len(last.lstrip())]
        return before + "".join(f"\n{indent}{name}," for name in names) + text[len(before):]
    return before + (" " if before.endswith(",") else ", ") + added + text[len(before):]


def _add_imports(path: str, text: str, wanted: List[NNTest], imported: collections.Counter) -> str:
    """The names the added methods use that the checkout does not import: those of common_utils
    join the checkout's common_utils import, others are imported as the kit's file imports them,
    above it."""
    suite = upstream_nn_tests()
    needed = suite.needs(wanted)
    missing = {name: line for name, line in suite.imports.items()
               if name in needed and not imported[name]}
    if not missing:
        return text
    im = re.search(r"^from torch\.testing\._internal\.common_utils import", text, re.M)
    if im is None:
        raise AnchorError(path, f"from {COMMON_UTILS} import ...")
    joined = [name for name, line in missing.items() if line.startswith(f"from {COMMON_UTILS} ")]
    others = [line for name, line in missing.items() if name not in joined]
    text = text[: im.start()] + "".join(line + "\n" for line in others) + text[im.start() :]
    return _join_common_utils_import(path, text, joined) if joined else text


def edit_test_nn(path: str, text: str, notes: List[str], double_backward: bool,
                 parts: Tuple[str, ...] = stack.UPSTREAM_NAMES) -> str:
    """The tests of the patches ``parts`` that the checkout lacks, in the kit file's order: after
    upstream's deterministic tests when there are some, else above the first grid_sample test;
    where some of the kit's tests are there already (an earlier patch of the stack), each test
    goes after the kit test before it, so that the stack gives the tree the whole change gives."""
    cls = re.search(r"^class TestNNDeviceType\b", text, re.M)
    if cls is None:
        raise AnchorError(path, "class TestNNDeviceType")
    nxt = re.compile(r"^\S", re.M).search(text, cls.end())
    cls_end = nxt.start() if nxt else len(text)
    upstream = upstream_deterministic_tests(text, cls.start(), cls_end)
    wanted = _wanted_tests(path, text, upstream, double_backward, notes, parts)
    if not wanted:
        notes.append(f"{path}: deterministic grid_sample tests already present")
        return text
    methods = _test_methods(text, cls.start(), cls_end)
    grid_tests = [m for m in methods if m[0].startswith("test_grid_sample")]
    if not grid_tests:
        raise AnchorError(path, "def test_grid_sample*(...) in TestNNDeviceType")
    present = frozenset(re.findall(r"^    def (\w+)\(", text[cls.start() : cls_end], re.M))
    imported = _module_imports(path, text)
    suite = upstream_nn_tests()
    ours = {m[0]: m for m in methods if m[0] in suite.names}
    if ours:
        # one insertion per test, the last first so that earlier offsets hold; the helpers a
        # test needs and the class lacks go with the first test inserted
        order = list(suite.names)
        spots = []
        for i, t in enumerate(wanted):
            before = [n for n in order[: order.index(t.name)] if n in ours]
            after = [n for n in order[order.index(t.name) + 1 :] if n in ours]
            at = ours[before[-1]][2] if before else ours[after[0]][1]
            spots.append((at, i, t))
        first = min(spots, key=lambda s: (s[0], s[1]))
        for at, i, t in sorted(spots, key=lambda s: (s[0], s[1]), reverse=True):
            block = suite.block([t], present) if (at, i, t) == first else t.source + "\n"
            text = text[:at] + block + text[at:]
    else:
        # after upstream's deterministic tests when there are some, else above the first
        # grid_sample test
        after = [m for m in methods if m[0] in upstream]
        at = after[-1][2] if after else grid_tests[0][1]
        text = text[:at] + suite.block(wanted, present) + text[at:]
    text = _add_imports(path, text, wanted, imported)
    twice = [n for n, k in _module_imports(path, text).items() if k > imported[n] and k > 1]
    if twice:  # never redefine an import (flake8/ruff F811)
        raise AnchorError(path, "imports", f"the edit would import {', '.join(twice)} twice")
    return text


# Where the notes page documents per-op determinism (v2.6.0's "Avoiding nondeterministic
# algorithms" subsections; main added "CUDA grid sampling" right after this one).
NOTES_ANCHOR = "CUDA convolution determinism"
NOTES_TITLE = "CUDA grid sampling"
NOTES_BODY = {
    ".rst": """\
The CUDA backward of :func:`torch.nn.functional.grid_sample` accumulates the
input gradient with atomic additions, so by default its result may change from
run to run. With :code:`torch.use_deterministic_algorithms(True)` (also with
``warn_only=True``) it uses a deterministic implementation instead, for 4-D and
5-D inputs alike: repeated runs then give bitwise identical gradients. In that
mode :func:`torch.nn.functional.grid_sample` does not use cuDNN, whose backward
is nondeterministic, so its forward result may differ in the last bits from the
default mode's.
""",
    ".md": """\
The CUDA backward of {func}`torch.nn.functional.grid_sample` accumulates the
input gradient with atomic additions, so by default its result may change from
run to run. With `torch.use_deterministic_algorithms(True)` (also with
`warn_only=True`) it uses a deterministic implementation instead, for 4-D and
5-D inputs alike: repeated runs then give bitwise identical gradients. In that
mode {func}`torch.nn.functional.grid_sample` does not use cuDNN, whose backward
is nondeterministic, so its forward result may differ in the last bits from the
default mode's.
""",
}


def _rst_headings(text: str) -> List[Tuple[int, str, int]]:
    """(offset, title, level) of each section title; rst levels go by first use of a marker."""
    out, order = [], []
    for m in re.finditer(r"^(\S[^\n]*)\n([-=~^\"'`.*+#:])\2+[ \t]*\n", text, re.M):
        title, marker = m.group(1).strip(), m.group(2)
        if len(m.group(0).split("\n")[1].rstrip()) < len(title):
            continue
        if marker not in order:
            order.append(marker)
        out.append((m.start(), title, order.index(marker)))
    return out


def _md_headings(text: str) -> List[Tuple[int, str, int]]:
    out, pos, fence = [], 0, False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence  # a "# comment" inside a code block is no heading
        elif not fence:
            m = re.match(r"(#+)[ \t]+(.*?)[ \t]*#*[ \t]*$", line.rstrip("\n"))
            if m:
                out.append((pos, m.group(2), len(m.group(1))))
        pos += len(line)
    return out


def edit_randomness(path: str, text: str, notes: List[str]) -> str:
    """Add a grid sampling subsection next to the CUDA convolution one, unless the page already
    talks about grid_sample (then only a note: its wording is upstream's to keep)."""
    if "grid_sample" in text:
        where = f" (in a '{NOTES_TITLE}' section)" if NOTES_TITLE in text else ""
        notes.append(f"{path} mentions grid_sample{where}: review its wording by hand (not edited)")
        return text
    ext = os.path.splitext(path)[1]
    heads = _rst_headings(text) if ext == ".rst" else _md_headings(text)
    anchor = [i for i, h in enumerate(heads) if h[1] == NOTES_ANCHOR]
    if len(anchor) != 1:
        notes.append(f"{path}: no '{NOTES_ANCHOR}' section to put a '{NOTES_TITLE}' one beside; not "
                     "edited (the page defers to use_deterministic_algorithms' docstring, edited)")
        return text
    i = anchor[0]
    level = heads[i][2]
    nxt = next((h[0] for h in heads[i + 1 :] if h[2] <= level), len(text))
    if ext == ".rst":
        marker = re.match(r"[^\n]*\n(.)", text[heads[i][0] :]).group(1)
        head = f"{NOTES_TITLE}\n{marker * len(NOTES_TITLE)}\n"
    else:
        head = f"{'#' * level} {NOTES_TITLE}\n\n"
    section = head + NOTES_BODY[ext] + "\n"
    if nxt == len(text) and not text.endswith("\n\n"):
        section = ("\n" if text.endswith("\n") else "\n\n") + section.rstrip("\n") + "\n"
    return text[:nxt] + section + text[nxt:]


def plan_randomness(tree: Path, p: Plan) -> None:
    """The notes page is optional (and .rst or .md by release): edit whichever exists."""
    for rel in NOTES:
        f = tree / rel
        if f.is_file():
            old = read_text(tree, rel)
            p.old[rel], p.new[rel] = old.encode("utf-8"), edit_randomness(rel, old, p.notes).encode("utf-8")
            return
    p.notes.append(f"no {' or '.join(NOTES)}: no notes page to document grid_sample in")


DERIVATIVES = "tools/autograd/derivatives.yaml"


def has_double_backward(tree: Path) -> bool:
    """Does the checkout differentiate grid_sampler_2d_backward (#177487)? Only then can the
    patch add a gradgradcheck: derivatives.yaml says, by an entry for it whose formulas are
    not all not_implemented."""
    if not (tree / DERIVATIVES).is_file():
        raise AnchorError(DERIVATIVES, DERIVATIVES, "file missing: it says whether grid_sampler_2d_backward "
                          "has a derivative")
    text = read_text(tree, DERIVATIVES)
    entry = re.search(r"^- name: grid_sampler_2d_backward\(.*\n((?:[ \t]+\S.*\n?)*)", text, re.M)
    if entry is None:
        return False
    formulas = [ln for ln in entry.group(1).splitlines() if ":" in ln]
    return any("not_implemented" not in ln for ln in formulas)


def edits(tree: Path, replace_existing: bool, tests_only: bool,
          upto: str = TOP) -> Tuple[Tuple[str, str, Callable], ...]:
    """(patch, path, edit(path, text, notes) -> text) for every file the patches up to ``upto``
    edit in place, in the order they are made (a file edited by both patches: the core's first).
    The speed levels edit no file in place: they only change the core's file (_plan_core_files)."""
    parts = stack.UPSTREAM_NAMES[: stack.UPSTREAM_NAMES.index(upto) + 1]
    nn = functools.partial(edit_test_nn, double_backward=has_double_backward(tree), parts=parts)
    core_tests = ((CORE, TEST_TORCH, edit_test_torch),)
    cudnn_tests = ((CUDNN_PATCH, TEST_TORCH, edit_test_torch_cudnn),)
    if CUDNN_PATCH not in parts:
        cudnn_tests = ()
    tests = (*core_tests, *cudnn_tests, (CUDNN_PATCH if CUDNN_PATCH in parts else CORE, TEST_NN, nn))
    if tests_only:
        return tests
    cu = functools.partial(edit_gridsampler_cu, replace_existing=replace_existing)
    core = ((CORE, CU_HEADER, edit_cuda_header), (CORE, CU, cu))
    cudnn = ((CUDNN_PATCH, COMPOSITE, edit_composite), (CUDNN_PATCH, CUDNN, edit_cudnn),
             (CUDNN_PATCH, INIT, edit_init_doc))
    return (*core, *(cudnn if CUDNN_PATCH in parts else ()), *tests)


# --------------------------------------------------------------------------- plan


def _git(tree: Path, *args: str) -> Optional[str]:
    r = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def read_text(root: Path, rel: str) -> str:
    """A file the patch reads, as UTF-8; AnchorError (one line, naming the file) otherwise."""
    data = (Path(root) / rel).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AnchorError(rel, rel, f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def detect_base(tree: Path) -> Base:
    """The checkout's version and git state; AnchorError naming ``tree`` when it is no git
    checkout of PyTorch (the journal, the commit and the patch file all need git)."""
    tree = Path(tree)
    if not (tree / "version.txt").is_file():
        raise NotUsable(str(tree), f"{tree} is not a PyTorch checkout (no version.txt)")
    top = _git(tree, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != tree.resolve():
        raise NotUsable(str(tree), f"{tree} is not the top of a git checkout")
    head = _git(tree, "rev-parse", "--verify", "-q", "HEAD")
    if head is None:
        raise NotUsable(str(tree), f"{tree} has no commit to build the change on")
    return Base(
        version_txt=read_text(tree, "version.txt").strip(),
        describe=_git(tree, "describe", "--tags", "--exact-match"),
        head=head,
    )


def _param_types(f: Func, text: str) -> List[str]:
    """Each parameter's type, spaces normalised (``const TensorBase &x`` -> ``const TensorBase&``)."""
    po = text.index("(", f.start)
    pc = _match(text, po, "(", ")")
    out = []
    for param in _split_top(text[po + 1 : pc]):
        param = re.sub(r"/\*.*?\*/", "", param).split("=")[0].strip()
        kind = re.sub(r"\w+\s*$", "", param)
        out.append(re.sub(r"\s*([&*])\s*", r"\1", re.sub(r"\s+", " ", kind)).strip())
    return out


def check_kit_core(path: str, source: bytes) -> None:
    """Both dispatches call the kit's launcher, declared in GridSampler.h with DET_PARAMS: a kit
    .cu that does not define it so would give a patched tree that does not compile or link,
    so refuse before planning anything."""
    text = source.decode("utf-8")
    code = _code_only(text)
    want = ", ".join(f"{t} {n}" for n, t in DET_PARAMS)
    defs = _find_defs(code, r"\bvoid", DET_LAUNCHER)
    if len(defs) != 1:
        raise AnchorError(path, f"void {DET_LAUNCHER}({want}) {{...}}",
                          "the kit does not define its launcher" if not defs
                          else f"{len(defs)} definitions of the launcher")
    f = defs[0]
    got = list(zip(f.params, _param_types(f, code)))
    if got != [(n, t) for n, t in DET_PARAMS]:
        raise AnchorError(path, f"void {DET_LAUNCHER}({want}) {{...}}",
                          "the kit defines its launcher with parameters "
                          f"({', '.join(f'{t} {n}' for n, t in got)})")


def kit_root(explicit: Optional[Path] = None) -> Path:
    """Where aten_kernels/ is: ``explicit``, DETGRID_KIT_ROOT (e.g. a `git archive` of the kit),
    else the checkout this module runs from; AnchorError when the kernel sources are not there
    (a non-editable install copies the package, not aten_kernels/)."""
    root = Path(explicit or os.environ.get("DETGRID_KIT_ROOT") or KIT_ROOT)
    if not (root / stack.UPSTREAM_ROOT / KERNEL_DIR).is_dir():
        raise NotUsable(str(root), f"no kernel sources under {root}/aten_kernels: install the kit "
                        "editable (pip install -e KIT) or set DETGRID_KIT_ROOT=KIT")
    return root


def _notes_kernel_names(pl: Plan, kernel_source: str) -> None:
    """Upstream tests that assert another implementation's CUDA kernel names (a profiler check
    such as ``any("make_records" in name ...)``) will fail with this kernel: say so."""
    text = pl.new[TEST_NN].decode("utf-8")
    for name in sorted(set(re.findall(r"""any\(\s*['"](\w+)['"] in \w+ for""", text))):
        if name not in kernel_source:
            users = [t for t, src in _all_test_sources(text).items() if f'"{name}"' in src or f"'{name}'" in src]
            pl.notes.append(f"{TEST_NN}: {', '.join(users)} expects a CUDA kernel named {name!r}, which "
                            "this kernel lacks: kept as written, it will fail until adapted")


def _all_test_sources(text: str) -> Dict[str, str]:
    return {n: text[s:e] for n, s, e in _test_methods(text, 0, len(text))}


def _core_builds(kit: Path, upto: str) -> List[Tuple[str, Dict[str, str]]]:
    """(patch, the core's files as the prefix of the stack ending at that patch has them), for
    every patch of the prefix ending at ``upto``, in order."""
    names = stack.UPSTREAM_NAMES[: stack.UPSTREAM_NAMES.index(upto) + 1]
    try:
        return [(name, stack.core_sources(kit, name)) for name in names]
    except OSError as e:
        raise NotUsable(f"{stack.UPSTREAM_ROOT}/{KERNEL_DIR}",
                        f"{kit}/{stack.UPSTREAM_ROOT}/{KERNEL_DIR}: {e.strerror}: "
                        f"{Path(e.filename).name if e.filename else ''}") from None
    except ValueError as e:  # a level's diff that does not apply to the file before it
        raise NotUsable(f"{stack.LEVELS_ROOT}", f"{kit}/{stack.LEVELS_ROOT}: {e}") from None


def _core_file_parts(builds: List[Tuple[str, Dict[str, str]]], rel: str,
                     old: Optional[bytes]) -> set:
    """The patches whose change of the core's file ``rel`` writing the last build over ``old``
    makes: those after the last build ``old`` is, each that changes the file; all of them, the
    core first, when ``old`` is no build of the prefix (a tree without the file, or another)."""
    texts = [sources[rel].encode("utf-8") for _, sources in builds]
    start = max((i for i, t in enumerate(texts) if t == old), default=None)
    if start is None:
        return {CORE, *(builds[i][0] for i in range(1, len(builds)) if texts[i] != texts[i - 1])}
    return {builds[i][0] for i in range(start + 1, len(builds)) if texts[i] != texts[i - 1]}


def _later_build_of(kit: Path, after: int, rel: str, data: bytes) -> Optional[str]:
    """The last speed level after the first ``after`` patches whose build of ``rel`` is ``data``."""
    found = None
    for name in stack.UPSTREAM_NAMES[after:]:
        if name in SPEED_LEVELS:
            try:
                if stack.core_sources(kit, name)[rel].encode("utf-8") == data:
                    found = name
            except (OSError, ValueError):
                break
    return found


def _plan_core_files(kit: Path, tree: Path, p: Plan, upto: str = TOP) -> None:
    """The core's files as the prefix of the stack ending at ``upto`` has them: the core's, then
    each speed level's diffs applied (stack.core_sources)."""
    builds = _core_builds(kit, upto)
    sources = builds[-1][1]
    check_kit_core(f"{stack.UPSTREAM_ROOT}/{CORE_SOURCE}", sources[CORE_SOURCE].encode("utf-8"))
    for rel, text in sources.items():
        dst = tree / rel
        p.old[rel] = dst.read_bytes() if dst.exists() else None
        p.new[rel] = text.encode("utf-8")
        if p.old[rel] is not None and p.old[rel] != p.new[rel] and not any(
                p.old[rel] == files[rel].encode("utf-8") for _, files in builds):
            # not an earlier patch's file (whose later patches are this change)
            ahead = _later_build_of(kit, len(builds), rel, p.old[rel])
            if ahead is None:
                p.notes.append(f"{rel}: exists and differs; replaced with the kit's")
            else:  # a later patch of the stack is applied: --upto adds patches, never takes any out
                p.new[rel] = p.old[rel]
                p.notes.append(f"{rel}: already as the stack up to {ahead} has it; left as it is")
        if p.new[rel] != p.old[rel]:
            p.parts |= _core_file_parts(builds, rel, p.old[rel])


def _nn_parts(old: str, new: str) -> set:
    """The patches whose tests an edit of test_nn.py added."""
    added = set(re.findall(r"def (test_\w+)\(", new)) - set(re.findall(r"def (test_\w+)\(", old))
    return {CUDNN_PATCH if n in CUDNN_NN_TESTS else CORE for n in added}


def plan(tree: Path, kit: Optional[Path] = None, replace_existing: bool = False,
         tests_only: bool = False, upto: str = TOP) -> Plan:
    """Every edit, in memory; nothing is written. ``replace_existing``: replace a deterministic
    path the checkout has already (refused otherwise). ``tests_only``: only the tests (the alert
    tests, the tests added to test_nn.py), for any deterministic backward to be run against.
    ``upto``: the last patch of the stack (stack.UPSTREAM_NAMES) applied, the whole stack by
    default. ``Plan.parts`` says which patches the change holds edits of."""
    if upto not in stack.UPSTREAM_NAMES:
        raise UsageError(f"--upto {upto!r}: the patches are {', '.join(stack.UPSTREAM_NAMES)}")
    tree = Path(tree)
    p = Plan(base=detect_base(tree), tests_only=tests_only)
    if not tests_only:
        _plan_core_files(kit_root(kit), tree, p, upto)
    for part, rel, fn in edits(tree, replace_existing, tests_only, upto):
        if not (tree / rel).is_file():
            raise AnchorError(rel, rel, "file missing")
        old = p.new[rel].decode("utf-8") if rel in p.new else read_text(tree, rel)
        try:
            new = fn(rel, old, p.notes)
        except ValueError as e:
            raise AnchorError(rel, getattr(fn, "func", fn).__name__, f"cannot parse: {e}") from None
        if rel == TEST_NN:
            p.parts |= _nn_parts(old, new)
        elif new != old:
            p.parts.add(part)
        p.old.setdefault(rel, old.encode("utf-8"))
        p.new[rel] = new.encode("utf-8")
    if tests_only:
        return p
    # only the tree's headers tell whether an include served the deterministic branch we replaced
    p.new[CU] = drop_stale_includes(tree, CU, p.old[CU].decode("utf-8"), p.new[CU].decode("utf-8"),
                                    p.notes).encode("utf-8")
    if CUDNN_PATCH in stack.UPSTREAM_NAMES[: stack.UPSTREAM_NAMES.index(upto) + 1]:
        before = dict(p.new)
        plan_randomness(tree, p)
        if any(p.new[r] != p.old.get(r) for r in p.new if r not in before):
            p.parts.add(CUDNN_PATCH)
    _notes_kernel_names(p, p.new[CORE_SOURCE].decode("utf-8"))
    return p


# --------------------------------------------------------------------------- commit message


def _added_tests(pl: Plan, rel: str) -> List[str]:
    before = set(re.findall(r"def (test_\w+)\(", (pl.old[rel] or b"").decode("utf-8")))
    return [n for n in re.findall(r"def (test_\w+)\(", pl.new[rel].decode("utf-8")) if n not in before]


def _updated_alert_tests(pl: Plan) -> List[str]:
    old, new = (pl.old[TEST_TORCH] or b"").decode("utf-8"), pl.new[TEST_TORCH].decode("utf-8")
    changed = []
    for name, _ in ALERT_TESTS:
        a, b = _method(old, name), _method(new, name)
        if a and b and old[a[0] : a[1]] != new[b[0] : b[1]]:
            changed.append(name)
    return changed


def _kept_upstream_tests(pl: Plan) -> List[str]:
    text = pl.new[TEST_NN].decode("utf-8")
    cls = re.search(r"^class TestNNDeviceType\b", text, re.M)
    nxt = re.compile(r"^\S", re.M).search(text, cls.end())
    return sorted(upstream_deterministic_tests(text, cls.start(), nxt.start() if nxt else len(text)))


TESTS_ONLY_SUBJECT = "Add tests for a deterministic CUDA grid_sample backward"


def _tests_only_intro() -> List[str]:
    return ["", textwrap.fill(
        "Tests that any deterministic CUDA backward of grid_sample must pass, whatever its "
        "implementation: under torch.use_deterministic_algorithms(True) the backward does not "
        "alert, repeats bit for bit, is as accurate as the default backward against a float64 "
        "oracle, and leaves grid-only calls to the default kernel. On a build without one they "
        "fail.", 72)]


CORE_TEXT = (
    "Under torch.use_deterministic_algorithms(True), the CUDA backward of grid_sample scatters "
    "grad_input with atomicAdd and so alerts (grid_sampler_2d_backward_cuda, "
    "grid_sampler_3d_backward_cuda). With grad_input requested, deterministic mode now takes "
    "GridSamplerDeterministic.cu (Note [Deterministic grid_sampler backward]). Per chunk of at "
    "most 2^19 records, a thread per output point writes a record per tap, keyed by the "
    "grad_input position it lands on; at::cuda::cub's radix sort orders the records by key, "
    "stably, and unique_by_key finds where each position's run begins; runs are summed in "
    "partials of 256 records, and a thread per (run, channel) adds a run's partials in order. "
    "Half and BFloat16 sums are kept in float and rounded once. Keys and index math are 32-bit "
    "where canUse32BitIndexMath allows. The sort buffers stay within 64 MiB per chunk (CUB's "
    "own temporary storage aside) and come from the caching allocator; Half and BFloat16 sums "
    "over several chunks take a float scratch of grad_input's size. The terms are the existing kernel's, up to FMA contraction, summed in "
    "another order. The existing kernel then computes grad_grid alone, with one writer per "
    "element. Calls with only grad_grid requested keep the existing kernel and no longer "
    "alert: they reach no atomicAdd.")
CUDNN_TEXT = (
    "In deterministic mode the composite grid_sampler no longer picks cuDNN for bilinear "
    "sampling with zeros padding and align_corners=True: cuDNN's backward is nondeterministic. "
    "grid_sample takes grid_sampler_2d there, forward and backward, so its forward result in "
    "that mode may differ in the last bits from cuDNN's.")
# A speed level's paragraph (its patch changes GridSamplerDeterministic.cu alone).
SPEED_LEVEL_TEXTS = {
    "grouped-channels": (
        "In GridSamplerDeterministic.cu's run sums and stored partials, a thread takes a run and "
        "a group of up to kChannelGroup = 4 channels, where it took a run and one channel: the "
        "run's record ids, weights and grad_output offsets are read once per group, and each "
        "channel's terms are formed and added in the same order as for a lone channel, so "
        "grad_input's bits do not change. A thread keeps up to four accumulators; a chunk "
        "launches runs x ceil(C/4) threads instead of runs x C."),
}
SPEED_LEVEL_TEXT = ("A speed change of GridSamplerDeterministic.cu alone (Note [Deterministic "
                    "grid_sampler backward]): grad_input's bits do not change.")
CUDNN_ALERT_TEXT = ("cudnn_grid_sampler_backward, which a direct call of torch.cudnn_grid_sampler "
                    "still reaches, alerts in deterministic mode.")


def _cudnn_test_changes(pl: Plan) -> List[str]:
    old, new = (pl.old.get(TEST_TORCH) or b"").decode("utf-8"), pl.new[TEST_TORCH].decode("utf-8")
    lines = []
    a, b = _method(old, CUDNN_ALERT_TEST), _method(new, CUDNN_ALERT_TEST)
    if a is None and b is not None:
        lines.append(f"- test_torch.py: adds {CUDNN_ALERT_TEST}, calling torch.cudnn_grid_sampler")
    elif a and b and old[a[0] : a[1]] != new[b[0] : b[1]]:
        lines.append(f"- test_torch.py: {CUDNN_ALERT_TEST} calls torch.cudnn_grid_sampler directly")
    if _method(old, CUDNN_ROUTE_TEST) is None and _method(new, CUDNN_ROUTE_TEST) is not None:
        lines.append(f"- test_torch.py: adds {CUDNN_ROUTE_TEST} (grid_sample on a cuDNN-eligible "
                     "input does not alert)")
    return lines


def commit_message(pl: Plan) -> str:
    """Subject, body and test plan, saying only what this plan changes: the core's subject when
    it holds core edits, else the cuDNN patch's when it holds the cuDNN route's, else the first
    speed level's it holds."""
    changed = set(pl.changed)
    titles = {u.name: u.title for u in stack.UPSTREAM_STACK}
    if pl.tests_only:
        parts = [TESTS_ONLY_SUBJECT, "", "See #68959", *_tests_only_intro()]
    elif CORE in pl.parts or not pl.parts:
        parts = [titles[CORE], "", "Fixes #68959"]
    elif CUDNN_PATCH in pl.parts:
        parts = [titles[CUDNN_PATCH], "", "See #68959"]
    else:
        level = next(name for name in SPEED_LEVELS if name in pl.parts)
        parts = [titles[level], "", "See #68959"]
    if not pl.tests_only and CORE in pl.parts:
        parts += ["", textwrap.fill(CORE_TEXT, 72)]
    if COMPOSITE in changed or CUDNN in changed:
        text = CUDNN_TEXT if COMPOSITE in changed else ""
        if CUDNN in changed:
            text = f"{text} {CUDNN_ALERT_TEXT}".strip()
        parts += ["", textwrap.fill(text, 72)]
    docs = [d for d, rel in (("the use_deterministic_algorithms docstring", INIT),
                             ("the reproducibility notes", NOTES[0]),
                             ("the reproducibility notes", NOTES[1])) if rel in changed]
    if docs:
        parts += ["", textwrap.fill(f"Docs: {' and '.join(dict.fromkeys(docs))} list grid_sample's "
                                    "CUDA backward as deterministic.", 72)]
    if not pl.tests_only:
        for name in SPEED_LEVELS:
            if name in pl.parts:
                parts += ["", textwrap.fill(SPEED_LEVEL_TEXTS.get(name, SPEED_LEVEL_TEXT), 72)]
    added, alerts = _added_tests(pl, TEST_NN), _updated_alert_tests(pl)
    cudnn_tests = _cudnn_test_changes(pl) if TEST_TORCH in pl.new else []
    run = [*added, *(t for t in _kept_upstream_tests(pl) if t not in added)]
    if not pl.tests_only and not added and any(name in pl.parts for name in SPEED_LEVELS):
        # a speed level's commit adds no test: the deterministic tests the tree has check it
        nn = pl.new[TEST_NN].decode("utf-8")
        run = [*(n for n in upstream_nn_tests().names if f"def {n}(" in nn), *run]
    if added or alerts or cudnn_tests:
        parts += ["", "Tests:"]
        parts += [f"- test_nn.py: adds {n}" for n in added]
        parts += [f"- test_torch.py: {n} expects no alert" for n in alerts]
        parts += cudnn_tests
    parts += ["", "Test Plan:"]
    if run:
        parts.append(f"python test/test_nn.py -k '{' or '.join(run)}'")
    parts.append("python test/test_torch.py -k test_nondeterministic_alert_grid_sample")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- --check


def check(tree: Path, pl: Plan) -> Tuple[bool, str]:
    """Build the planned change in a temporary copy of the files it touches, as a patch, and
    check with `git apply --check` that the patch applies to ``tree`` (nothing in it is written).
    Python files the change edits must still compile."""
    if not pl.changed:
        return True, "already applied: nothing to change"
    for rel in pl.changed:
        if rel.endswith(".py"):
            try:
                compile(pl.new[rel], rel, "exec")
            except SyntaxError as e:
                return False, f"{rel}: the change would not compile: {e.msg} (line {e.lineno})"
    env = dict(os.environ, GIT_AUTHOR_NAME="detgrid --check", GIT_AUTHOR_EMAIL="check@localhost",
               GIT_COMMITTER_NAME="detgrid --check", GIT_COMMITTER_EMAIL="check@localhost")
    with tempfile.TemporaryDirectory(prefix="detgrid-check-") as tmp:
        copy = Path(tmp) / "copy"
        for rel in pl.changed:
            if pl.old[rel] is not None:
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                (copy / rel).write_bytes(pl.old[rel])
        copy.mkdir(exist_ok=True)

        def git(*args):
            return subprocess.run(["git", "-C", str(copy), *args], capture_output=True, env=env, check=True)

        try:
            git("init", "-q")
            git("add", "-A")
            git("commit", "-q", "--allow-empty", "-m", "before")
            for rel in pl.changed:
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                (copy / rel).write_bytes(pl.new[rel])
            git("add", "-A")
            diff = Path(tmp) / "change.patch"
            diff.write_bytes(git("diff", "--cached", "--binary").stdout)
        except subprocess.CalledProcessError as e:
            return False, f"could not build the change in {copy}: git {e.cmd[3]} failed"
        r = subprocess.run(["git", "apply", "--check", str(diff)], cwd=tree, capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"the change does not apply: {r.stderr.strip().splitlines()[0]}"
    return True, f"applies: {len(pl.changed)} files ({', '.join(pl.changed)})"


# --------------------------------------------------------------------------- lint (new files)


def lint_new_files(tree: Path, files: Dict[str, bytes]) -> List[str]:
    """The checkout's grep linters (.lintrunner.toml) and newline rules on the files we add."""
    problems = []
    cfg = tree / ".lintrunner.toml"
    linters = []
    if cfg.is_file():
        import tomllib
        try:
            config = tomllib.loads(read_text(tree, ".lintrunner.toml"))
        except tomllib.TOMLDecodeError as e:
            raise AnchorError(".lintrunner.toml", ".lintrunner.toml", f"not TOML: {e}") from None
        for ln in config.get("linter", []):
            cmd = ln.get("command", [])
            pats = [c.split("=", 1)[1] for c in cmd if c.startswith("--pattern=")]
            allow = [c.split("=", 1)[1] for c in cmd if c.startswith("--allowlist-pattern=")]
            if any("grep_linter" in c for c in cmd) and pats:
                linters.append((ln["code"], ln.get("include_patterns", []),
                                ln.get("exclude_patterns", []), pats, allow))
    for rel, data in files.items():
        text = data.decode("utf-8")
        if not text.endswith("\n") or text.endswith("\n\n"):
            problems.append(f"{rel}: NEWLINE: must end with exactly one newline")
        for code, inc, exc, pats, allow in linters:
            if not any(fnmatch.fnmatch(rel, p) for p in inc) or any(fnmatch.fnmatch(rel, p) for p in exc):
                continue
            for no, line in enumerate(text.splitlines(), 1):
                for pat in pats:
                    rx = pat.replace("[[:blank:]]", r"[ \t]")
                    try:
                        re.compile(rx)
                    except re.error:  # grep -E treats an unbalanced "(" literally
                        rx = re.escape(pat)
                    if re.search(rx, line) and not any(re.search(a, line) for a in allow):
                        problems.append(f"{rel}:{no}: {code}: {line.strip()[:80]}")
    return problems


# --------------------------------------------------------------------------- CLI

EXIT_OK, EXIT_ANCHOR, EXIT_DIRTY, EXIT_CHECK, EXIT_USAGE = 0, 1, 2, 3, 4


class UsageError(Exception):
    """A bad argument or environment, found before anything is written; one line for the user."""


def validate_out(out: Path) -> Path:
    """The patch file's path must be writable before the tree is touched."""
    out = Path(out).absolute()
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: {out.parent} is not an existing directory")
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UsageError(f"--out {out}: not writable")
    return out


def refuse_pending(tree: Path) -> None:
    """Planning on a tree that an interrupted apply left half-written would describe that state."""
    journal = patch_apply.journal_path(tree)
    if journal.exists():
        raise NotUsable(str(tree), f"{journal} records an interrupted apply: run `detgrid patch "
                        f"--pytorch {tree}` to finish or roll it back first")


def default_out(base: Base, kit: Path, tests_only: bool = False) -> Path:
    return kit / "patches" / f"{base.label}{'-tests' if tests_only else ''}.patch"


def refuse_bad_combination(args: argparse.Namespace) -> None:
    """--tests-only changes no kernel or dispatch, so it has no deterministic path to replace."""
    if args.tests_only and args.replace_existing_deterministic_path:
        raise UsageError("--tests-only changes only the tests; --replace-existing-deterministic-path "
                         "has nothing to replace there")


def _refuse_dirty(tree: Path, pl: Plan, allow_dirty: bool) -> Optional[str]:
    """Why the tree must not be patched, or None. Files the change writes must always be clean
    (not modified, not untracked): the commit would otherwise carry the user's edits. Other
    uncommitted changes are refused too unless --allow-dirty; they stay out of the commit."""
    touched = patch_apply.dirty(tree, sorted(pl.new))
    if touched:
        return (f"{tree}: files the change writes have uncommitted changes ({', '.join(touched[:5])}"
                f"{' ...' if len(touched) > 5 else ''}); commit or stash them")
    others = patch_apply.dirty(tree)
    if others and not allow_dirty:
        return (f"{tree} has uncommitted changes ({', '.join(others[:5])}{' ...' if len(others) > 5 else ''}); "
                "commit or stash them, or pass --allow-dirty to leave them out of the commit")
    return None


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (AnchorError, UsageError, patch_apply.ApplyError) as e:
        print(f"detgrid patch: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, UsageError) else EXIT_ANCHOR
    except KeyboardInterrupt:  # before the apply started (the apply turns it into ApplyError)
        print("detgrid patch: interrupted before anything was written", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    refuse_bad_combination(args)
    tree = Path(args.pytorch).absolute()
    if not tree.is_dir():
        raise UsageError(f"--pytorch {tree}: no such directory")
    base = detect_base(tree)
    print(f"base: {base.label} ({base})")
    if args.check:
        refuse_pending(tree)  # --check writes nothing, so it cannot finish one
    else:
        done = patch_apply.recover(tree)
        if done:
            print(f"recovered: {done}")
    pl = plan(tree, replace_existing=args.replace_existing_deterministic_path,
              tests_only=args.tests_only, upto=args.upto)
    for n in pl.notes:
        print(f"note: {n}")
    if args.check:
        ok, msg = check(tree, pl)
        print(msg)
        return EXIT_OK if ok else EXIT_CHECK
    why = _refuse_dirty(tree, pl, args.allow_dirty)
    if why:
        print(f"detgrid patch: {why}; nothing was changed", file=sys.stderr)
        return EXIT_DIRTY
    for problem in lint_new_files(tree, {r: pl.new[r] for r in pl.changed if pl.old[r] is None}):
        print(f"lint: {problem}")
    if not pl.changed:
        print("already applied: nothing to change")
        return EXIT_OK
    out = validate_out(Path(args.out) if args.out else default_out(base, kit_root(), args.tests_only))
    author = patch_apply.identity(tree)
    commit = patch_apply.apply(tree, {rel: pl.new[rel] for rel in pl.changed}, commit_message(pl), out)
    for rel in pl.changed:
        print(f"{'created' if pl.old[rel] is None else 'patched'} {rel}")
    print(f"committed {commit[:12]} as {author}")
    print(f"wrote {out}")
    return EXIT_OK


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "patch",
        help="apply the deterministic grid_sample backward to a PyTorch checkout as one commit, "
        "and write it as a format-patch file",
    )
    p.add_argument("--pytorch", required=True, metavar="PATH", help="PyTorch git checkout")
    p.add_argument("--check", action="store_true",
                   help="only plan the change, build it in a temporary copy and check that it "
                   "applies; writes nothing")
    p.add_argument("--allow-dirty", action="store_true",
                   help="patch although files the change does not touch have uncommitted changes "
                   "(they stay out of the commit); files it touches must be clean regardless")
    p.add_argument("--replace-existing-deterministic-path", action="store_true",
                   help="on a checkout that already has a deterministic grid_sample backward "
                   "(e.g. #196856's), delete it and put detgrid's in its place; without this flag "
                   "such a checkout is refused and left untouched")
    p.add_argument("--tests-only", action="store_true",
                   help="only the tests (test/test_torch.py's alert tests expecting no alert, the "
                   "tests added to test/test_nn.py), as a commit and patch of their own: a "
                   "conformance suite for any deterministic grid_sample backward; no kernel, no "
                   "dispatch")
    p.add_argument("--upto", metavar="PATCH", default=TOP, choices=stack.UPSTREAM_NAMES,
                   help="apply the upstream stack (patches/stack/) up to this patch: "
                   f"{', '.join(stack.UPSTREAM_NAMES)}; default the whole stack. Each patch's "
                   "edits are found present on a later run, so a tree with the earlier ones "
                   "committed gets the rest alone")
    p.add_argument("--out", metavar="FILE",
                   help="patch file (default patches/<base>.patch in the kit, "
                   "patches/<base>-tests.patch with --tests-only)")
    p.set_defaults(handler=run)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from detgrid.kit.parsing import ArgumentParser  # a bad argument in one line, as `detgrid patch`

    parser = ArgumentParser(prog="detgrid")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main(["patch", *sys.argv[1:]]))
