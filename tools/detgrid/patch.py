"""``detgrid patch``: apply the deterministic grid_sample backward to a PyTorch checkout.

Plan every edit in memory (each edit finds its anchor semantically: a function by name with its
parameter list and brace-matched body, a statement by its text, never a line number), verify all of
them, then write all files atomically (temporary files, then renames; originals restored on any
error). A second run finds every edit already present and changes nothing. The produced patch is a
``git format-patch``-style file built from the planned contents.
"""

import argparse
import difflib
import fnmatch
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

KIT_ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = "aten/src/ATen/native/cuda"
KERNEL_FILES = (
    "GridSamplerDeterministic.h",
    "GridSamplerDeterministic.cuh",
    "GridSamplerDeterministicPipeline.cuh",
    "GridSamplerDeterministic.cu",
)
DET_HEADER = "GridSamplerDeterministic.h"
DIMS = (2, 3)  # grid_sampler_2d and grid_sampler_3d: one edit, parameterised by dims
LAUNCHERS = {d: f"launch_grid_sampler_{d}d_backward_kernel" for d in DIMS}
DET_LAUNCHERS = {d: f"launch_grid_sampler_{d}d_backward_deterministic_kernel" for d in DIMS}
LAUNCHER, DET_LAUNCHER = LAUNCHERS[2], DET_LAUNCHERS[2]
CU = "aten/src/ATen/native/cuda/GridSampler.cu"
CUDA_CPP = "aten/src/ATen/native/cuda/GridSampler.cpp"  # allocates grad_input, calls the launchers
COMPOSITE = "aten/src/ATen/native/GridSampler.cpp"
CUDNN = "aten/src/ATen/native/cudnn/GridSampler.cpp"
INIT = "torch/__init__.py"
NOTES = ("docs/source/notes/randomness.rst", "docs/source/notes/randomness.md")
TEST_TORCH = "test/test_torch.py"
TEST_NN = "test/test_nn.py"
REGEN_HINT = "python -m detgrid patch --pytorch {tree} --out {out}"

EXIT_OK, EXIT_ANCHOR, EXIT_DIRTY, EXIT_CHECK = 0, 1, 2, 3


class AnchorError(Exception):
    def __init__(self, path: str, anchor: str, why: str = "not found"):
        super().__init__(f"{path}: anchor {anchor!r}: {why}")
        self.path, self.anchor, self.why = path, anchor, why


@dataclass
class Base:
    version_txt: str
    describe: Optional[str]
    head: Optional[str]
    is_git: bool

    @property
    def label(self) -> str:
        """patches/<label>.patch: an exact tag, else v<version.txt without the a0 suffix>."""
        if self.describe and re.fullmatch(r"v\d+\.\d+\.\d+(-rc\d+)?", self.describe):
            return self.describe
        v = "v" + re.sub(r"a0$", "", self.version_txt)
        return v if not self.head else f"{v}+g{self.head[:12]}"

    def __str__(self) -> str:
        s = f"version.txt {self.version_txt}"
        if self.is_git:
            s += f", git describe {self.describe or '-'}, HEAD {self.head or '-'}"
        return s


@dataclass
class Plan:
    base: Base
    old: Dict[str, Optional[bytes]] = field(default_factory=dict)
    new: Dict[str, bytes] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

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


def _det_block(ind: str, ctx: str, det: str, a: Dict[str, str]) -> str:
    """The dispatch that replaces a launcher's alert: deterministic path first, and no alert
    after it (the only way left to grad_input's atomicAdd is with deterministic mode off)."""
    return (
        f"{ind}// See Note [Enabling Deterministic Operations]\n"
        f"{ind}// With the input gradient requested, deterministic mode takes the sort-based\n"
        f"{ind}// path of GridSamplerDeterministic.cu: no atomics, every element of\n"
        f"{ind}// grad_input written once (no zero fill needed).\n"
        f"{ind}if ({ctx}.deterministicAlgorithms() && {a['output_mask']}[0]) {{\n"
        f"{ind}  {det}(\n"
        f"{ind}      {a['grad_input']}, {a['grad_grid']}, {a['grad_output']}, {a['input']}, {a['grid']},\n"
        f"{ind}      {a['interpolation_mode']}, {a['padding_mode']}, {a['align_corners']},\n"
        f"{ind}      {a['output_mask']});\n"
        f"{ind}  return;\n"
        f"{ind}}}\n"
        f"{ind}// A requested grad_input is accumulated below with atomicAdd, which is\n"
        f"{ind}// nondeterministic, but deterministic mode never gets here with it requested:\n"
        f"{ind}// nothing to alert about (Note [Writing Nondeterministic Operations]). The\n"
        f"{ind}// grid gradient alone has a single writer per element.\n"
    )


def _add_det_dispatch(path: str, text: str, dims: int, notes: List[str]) -> str:
    """Put the deterministic branch in place of launch_grid_sampler_<dims>d_backward_kernel's
    nondeterministic alert (replacing another deterministic branch found there)."""
    launcher, det = LAUNCHERS[dims], DET_LAUNCHERS[dims]
    defs = _find_defs(text, r"\bvoid", launcher)
    if len(defs) != 1:
        raise AnchorError(path, f"void {launcher}(...) {{...}}", f"{len(defs)} definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    if f"{det}(" in body:
        notes.append(f"{path}: {dims}D deterministic dispatch already present")
        return text
    a = _launcher_args(path, f, launcher)
    body, removed = _remove_existing_det_branch(body)
    if removed is not None:
        calls = ", ".join(f"{c}()" for c in _calls(removed) if c != "globalContext")
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
    block = _det_block(alert.group("ind"), alert.group("ctx"), det, a)
    body = body[: alert.start()] + block + body[alert.end() :]
    return text[: f.body_open] + body + text[f.body_close + 1 :]


def edit_gridsampler_cu(path: str, text: str, notes: List[str]) -> str:
    for dims in DIMS:
        text = _add_det_dispatch(path, text, dims, notes)
    return _add_include(path, text, f"ATen/native/cuda/{DET_HEADER}",
                        after=("ATen/native/cuda/GridSampler.h", "ATen/native/cuda/"))


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
    ours = {f"ATen/native/cuda/{n}" for n in KERNEL_FILES}
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


def edit_composite(path: str, text: str, notes: List[str]) -> str:
    defs = _find_defs(text, r"\bTensor", "grid_sampler")
    if len(defs) != 1:
        raise AnchorError(path, "Tensor grid_sampler(...) {...}", f"{len(defs)} definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    m = re.search(r"\bif\s*\(\s*(?=[^;{]*\bcond_cudnn_grid_sampler\s*\()", body)
    if m is None:
        raise AnchorError(path, "if (cond_cudnn_grid_sampler(...) ...)",
                          "composite grid_sampler does not choose cuDNN this way")
    cond_close = _match(body, m.end() - 1, "(", ")")
    if "deterministicAlgorithms()" in body[m.start() : cond_close]:
        notes.append(f"{path}: composite already avoids cuDNN in deterministic mode")
        return text
    ind = _indent_of(body, m.start())
    first = re.match(r"\s*", body[m.end() :]).end() + m.end()
    new = (
        f"// cuDNN's grid sampler backward is nondeterministic; in deterministic mode\n"
        f"{ind}// grid_sampler_2d's CUDA backward is deterministic, so use it instead.\n"
        f"{ind}if (!at::globalContext().deterministicAlgorithms() &&\n{ind}    "
    )
    body = body[: m.start()] + new + body[first:]
    text = text[: f.body_open] + body + text[f.body_close + 1 :]
    if "#include <ATen/Context.h>" not in text:
        text = _add_include(path, text, "ATen/Context.h", after=("ATen/native/GridSampler.h", "ATen/"))
    return text


def edit_cudnn(path: str, text: str, notes: List[str]) -> str:
    defs = [d for d in _find_defs(text, r"std::tuple<\s*Tensor\s*,\s*Tensor\s*>", "cudnn_grid_sampler_backward")
            if "not compiled with cuDNN" not in text[d.body_open : d.body_close]]
    if len(defs) != 1:
        raise AnchorError(path, "std::tuple<Tensor, Tensor> cudnn_grid_sampler_backward(...) {...}",
                          f"{len(defs)} cuDNN-enabled definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    if "deterministicAlgorithms()" in body and "grid_sampler_2d_backward(" in body:
        notes.append(f"{path}: cuDNN backward already delegates in deterministic mode")
        return text
    names = f.params
    if len(names) != 3:
        raise AnchorError(path, "cudnn_grid_sampler_backward(input, grid, grad_output)",
                          f"parameters {names}")
    inp, grid, gout = names
    # an alert added upstream (PR #180417) becomes unreachable once we delegate: drop it
    body2 = re.sub(r'(?:^[ \t]*//[^\n]*\n)*^[ \t]*(?:at::)?globalContext\(\)\.alertNotDeterministic\(\s*'
                   r'"cudnn_grid_sampler_backward[^"]*"\s*\);[ \t]*\n', "", body, flags=re.M)
    if body2 != body:
        notes.append(f"{path}: removed the cuDNN backward's nondeterministic alert (now delegates)")
    body = body2
    block = (
        "\n  // See Note [Enabling Deterministic Operations]\n"
        "  // cudnn_grid_sampler is grid_sample with bilinear interpolation, zeros\n"
        "  // padding and align_corners=True; cuDNN's backward is nondeterministic, so\n"
        "  // in deterministic mode use grid_sampler_2d's deterministic CUDA backward.\n"
        "  if (at::globalContext().deterministicAlgorithms()) {\n"
        "    return at::grid_sampler_2d_backward(\n"
        f"        {gout},\n        {inp},\n        {grid},\n"
        "        static_cast<int64_t>(GridSamplerInterpolation::Bilinear),\n"
        "        static_cast<int64_t>(GridSamplerPadding::Zeros),\n"
        "        /*align_corners=*/true,\n"
        "        {true, true});\n"
        "  }"
    )
    body = "{" + block + body[1:]
    text = text[: f.body_open] + body + text[f.body_close + 1 :]
    if "#include <ATen/ops/" in text:
        text = _add_include(path, text, "ATen/ops/grid_sampler_2d_backward.h", after=("ATen/ops/",))
    if "#include <ATen/Context.h>" not in text:
        text = _add_include(path, text, "ATen/Context.h", after=("ATen/Config.h", "ATen/"))
    return text


def _enclosing_if(body: str, pos: int) -> Optional[str]:
    """Condition of the innermost ``if (...) {`` whose block contains body[pos]."""
    best = None
    for m in re.finditer(r"\bif\s*\(", body[:pos]):
        cond_close = _match(body, m.end() - 1, "(", ")")
        k = re.compile(r"\s*").match(body, cond_close + 1).end()
        if k < len(body) and body[k] == "{" and _match(body, k, "{", "}") > pos:
            best = body[m.end() : cond_close]
    return best


def _skip_zero_fill(path: str, text: str, dims: int, notes: List[str]) -> str:
    """grid_sampler_<dims>d_backward_cuda allocates a requested grad_input with zeros_like; in
    deterministic mode the launcher writes every element (GridSamplerDeterministic.h), so
    allocate it with empty_like there. The non-deterministic path keeps its zeros. Optional:
    an unfamiliar shape leaves the (correct, one fill slower) allocation alone, with a note."""
    name = f"grid_sampler_{dims}d_backward_cuda"
    skip = f"{path}: {name}: grad_input allocation not in the expected shape; kept its zero fill"
    defs = _find_defs(text, r"std::tuple<\s*Tensor\s*,\s*Tensor\s*>", name)
    # grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
    if len(defs) != 1 or len(defs[0].params) != 7:
        notes.append(skip)
        return text
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    if "deterministicAlgorithms()" in body:
        notes.append(f"{path}: {name} already skips the zero fill in deterministic mode")
        return text
    inp, mask = f.params[1], f.params[6]
    zs = list(re.finditer(rf"^(?P<ind>[ \t]*)return (?P<ns>(?:at::)?)zeros_like\((?P<args>\s*{inp}\b[^;]*)\);"
                          r"[ \t]*\n", body, re.M))
    cond = _enclosing_if(body, zs[0].start()) if len(zs) == 1 else None
    # the allocation must be the one made only when grad_input is requested (output_mask[0]),
    # exactly when the launcher takes the deterministic path in deterministic mode
    flags = {f"{mask}[0]"} | set(re.findall(rf"\b(?:auto|bool)\s+(\w+)\s*=\s*{mask}\[0\];", body))
    if cond is None or re.sub(r"\s", "", cond) not in flags:
        notes.append(skip)
        return text
    z = zs[0]
    ind, ns, args = z.group("ind"), z.group("ns"), z.group("args")
    new = (
        f"{ind}// The deterministic backward writes every element of grad_input, so it\n"
        f"{ind}// needs no zero fill (see launch_grid_sampler_{dims}d_backward_kernel).\n"
        f"{ind}if (at::globalContext().deterministicAlgorithms()) {{\n"
        f"{ind}  return {ns}empty_like({args});\n"
        f"{ind}}}\n"
        f"{ind}return {ns}zeros_like({args});\n"
    )
    body = body[: z.start()] + new + body[z.end() :]
    return text[: f.body_open] + body + text[f.body_close + 1 :]


def edit_cuda_backward_alloc(path: str, text: str, notes: List[str]) -> str:
    new = text
    for dims in DIMS:
        new = _skip_zero_fill(path, new, dims, notes)
    if new == text:
        return text
    if "#include <ATen/Context.h>" not in new:
        new = _add_include(path, new, "ATen/Context.h", after=("ATen/native/cuda/GridSampler.h", "ATen/"))
    if "#include <ATen/ops/" in new and "#include <ATen/ops/empty_like.h>" not in new:
        new = _add_include(path, new, "ATen/ops/empty_like.h", after=("ATen/ops/empty.h", "ATen/ops/"))
    return new


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


def _expect_no_alert(path: str, text: str, dims: int, notes: List[str]) -> str:
    """test_nondeterministic_alert_grid_sample_<dims>d: should_alert becomes False."""
    name, caller = f"test_nondeterministic_alert_grid_sample_{dims}d", f"grid_sampler_{dims}d_backward_cuda"
    m = re.search(rf"^([ \t]+)def {name}\(self, device\):\n", text, re.M)
    if m is None:
        raise AnchorError(path, f"def {name}")
    ind = m.group(1)
    end = re.compile(rf"^{ind}\S", re.M).search(text, m.end())
    end = end.start() if end else len(text)
    body = text[m.end() : end]
    c = re.search(r"self\.check_nondeterministic_alert\(", body)
    if c is None:
        raise AnchorError(path, f"self.check_nondeterministic_alert(...) in {name}")
    close = _match(body, c.end() - 1, "(", ")")
    args = _split_top(body[c.end() : close])
    if len(args) != 3 or caller not in args[1]:
        raise AnchorError(path, f"check_nondeterministic_alert(fn, '{caller}', should_alert)",
                          f"arguments {args}")
    if args[2] == "False":
        notes.append(f"{path}: {dims}D alert test already expects no alert")
        return text
    arg_start = body.rfind(args[2], 0, close)
    cind = _indent_of(body, c.start())
    comment = (f"{cind}# The CUDA backward of {dims}D grid_sample has a deterministic implementation\n"
               f"{cind}# (GridSamplerDeterministic.cu), so there is no alert on any device.\n")
    body = (body[: _line_start(body, c.start())] + comment + body[_line_start(body, c.start()) : arg_start]
            + "False" + body[arg_start + len(args[2]) :])
    return text[: m.end()] + body + text[end:]


def edit_test_torch(path: str, text: str, notes: List[str]) -> str:
    for dims in DIMS:
        text = _expect_no_alert(path, text, dims, notes)
    return text


NN_TESTS = '''\
    def _grid_sample_grads(self, input, grid, grad_output, **kwargs):
        input = input.detach().clone().requires_grad_()
        grid = grid.detach().clone().requires_grad_()
        out = F.grid_sample(input, grid, **kwargs)
        out.backward(grad_output)
        return input.grad, grid.grad

    def _check_grid_sample_backward_reproducible(self, input, grid, grad_output, modes):
        # Repeated runs in deterministic mode must agree bit for bit.
        for mode, padding_mode, align_corners in product(
                modes, ('zeros', 'border', 'reflection'), (False, True)):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            with DeterministicGuard(True):
                expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                for _ in range(3):
                    actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                    self.assertEqual(actual[0], expected[0], atol=0, rtol=0)
                    self.assertEqual(actual[1], expected[1], atol=0, rtol=0)
                # Only the grid gradient requested: nothing to alert about.
                g = grid.detach().clone().requires_grad_()
                F.grid_sample(input, g, **kwargs).backward(grad_output)

    def _check_grid_sample_backward_matches_default(self, input, grid, grad_output, modes):
        for mode, padding_mode, align_corners in product(
                modes, ('zeros', 'border', 'reflection'), (False, True)):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            with DeterministicGuard(True):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            self.assertEqual(actual[0], expected[0])
            self.assertEqual(actual[1], expected[1])

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_2d_backward_deterministic(self, device, dtype):
        # A zoom-in grid: many samples land on each input pixel, which is where
        # atomicAdd ordering would show.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 7, 9, device=device, dtype=dtype)
        grid = torch.rand(2, 40, 37, 2, device=device, dtype=dtype) * 0.6 - 0.3
        grad_output = torch.randn(2, 3, 40, 37, device=device, dtype=dtype)
        self._check_grid_sample_backward_reproducible(
            input, grid, grad_output, ('bilinear', 'nearest', 'bicubic'))

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_3d_backward_deterministic(self, device, dtype):
        # A zoom-in grid: many samples land on each input voxel.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 4, 5, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 9, 11, 10, 3, device=device, dtype=dtype) * 0.6 - 0.3
        grad_output = torch.randn(2, 3, 9, 11, 10, device=device, dtype=dtype)
        self._check_grid_sample_backward_reproducible(
            input, grid, grad_output, ('bilinear', 'nearest'))

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_2d_backward_deterministic_matches_default(self, device, dtype):
        torch.manual_seed(0)
        input = torch.randn(2, 4, 11, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 23, 29, 2, device=device, dtype=dtype) * 2.4 - 1.2
        grad_output = torch.randn(2, 4, 23, 29, device=device, dtype=dtype)
        self._check_grid_sample_backward_matches_default(
            input, grid, grad_output, ('bilinear', 'nearest', 'bicubic'))

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_3d_backward_deterministic_matches_default(self, device, dtype):
        torch.manual_seed(0)
        input = torch.randn(2, 4, 5, 7, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 8, 9, 7, 3, device=device, dtype=dtype) * 2.4 - 1.2
        grad_output = torch.randn(2, 4, 8, 9, 7, device=device, dtype=dtype)
        self._check_grid_sample_backward_matches_default(
            input, grid, grad_output, ('bilinear', 'nearest'))

    @onlyCUDA
    @unittest.skipIf(not TEST_CUDNN, 'CUDNN not available')
    def test_grid_sample_2d_backward_deterministic_cudnn(self, device):
        # Bilinear, zeros, align_corners=True is the combination the composite
        # grid_sampler can hand to cuDNN; cudnn_grid_sampler can also be called
        # directly. In deterministic mode both backwards are the deterministic one.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 8, 8, device=device)
        grid = torch.rand(2, 32, 32, 2, device=device) * 0.5 - 0.25
        grad_output = torch.randn(2, 3, 32, 32, device=device)
        kwargs = dict(mode='bilinear', padding_mode='zeros', align_corners=True)
        with DeterministicGuard(True):
            expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            for _ in range(3):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                self.assertEqual(actual, expected, atol=0, rtol=0)
                i = input.detach().clone().requires_grad_()
                g = grid.detach().clone().requires_grad_()
                torch.cudnn_grid_sampler(i, g).backward(grad_output)
                self.assertEqual(i.grad, expected[0], atol=0, rtol=0)
                self.assertEqual(g.grad, expected[1], atol=0, rtol=0)

'''
NN_TEST_NAMES = tuple(re.findall(r"def (test_\w+)\(", NN_TESTS))


def edit_test_nn(path: str, text: str, notes: List[str]) -> str:
    present = [n for n in NN_TEST_NAMES if f"def {n}(" in text]
    if len(present) == len(NN_TEST_NAMES):
        notes.append(f"{path}: deterministic grid_sample tests already present")
        return text
    if present:  # inserting the block again would redefine these
        raise AnchorError(path, "def test_grid_sample_*_backward_deterministic*",
                          f"only some of the tests present ({', '.join(present)}; an older detgrid "
                          "patch?); restore the file first")
    cls = re.search(r"^class TestNNDeviceType\b", text, re.M)
    if cls is None:
        raise AnchorError(path, "class TestNNDeviceType")
    nxt = re.compile(r"^\S", re.M).search(text, cls.end())
    cls_end = nxt.start() if nxt else len(text)
    m = re.compile(r"^    def test_grid_sample\w*\(", re.M).search(text, cls.end(), cls_end)
    if m is None:
        raise AnchorError(path, "def test_grid_sample*(...) in TestNNDeviceType")
    at = m.start()
    while True:  # put the new tests above that test's decorators
        prev = text.rfind("\n", 0, at - 1) + 1
        if re.match(r"    @", text[prev:at]):
            at = prev
        else:
            break
    for name in ("onlyCUDA", "dtypes", "product", "TEST_CUDNN", "unittest"):
        if not re.search(rf"^(?:from|import)\b[^\n]*\b{name}\b|^\s+[^\n]*\b{name}\b[^\n]*(?:,|\\)\s*$", text, re.M):
            raise AnchorError(path, f"import of {name}", "the new tests need it")
    text = text[:at] + NN_TESTS + text[at:]
    if not re.search(r"^from torch\.testing\._internal\.common_utils import[^\n]*\bDeterministicGuard\b",
                     text, re.M) and "DeterministicGuard," not in text:
        im = re.search(r"^from torch\.testing\._internal\.common_utils import", text, re.M)
        if im is None:
            raise AnchorError(path, "from torch.testing._internal.common_utils import ...")
        text = (text[: im.start()] + "from torch.testing._internal.common_utils import DeterministicGuard\n"
                + text[im.start() :])
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
5-D inputs alike and also when the forward pass used cuDNN: repeated runs then
give bitwise identical gradients.
""",
    ".md": """\
The CUDA backward of {func}`torch.nn.functional.grid_sample` accumulates the
input gradient with atomic additions, so by default its result may change from
run to run. With `torch.use_deterministic_algorithms(True)` (also with
`warn_only=True`) it uses a deterministic implementation instead, for 4-D and
5-D inputs alike and also when the forward pass used cuDNN: repeated runs then
give bitwise identical gradients.
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
            old = f.read_bytes()
            p.old[rel], p.new[rel] = old, edit_randomness(rel, old.decode("utf-8"), p.notes).encode("utf-8")
            return
    p.notes.append(f"no {' or '.join(NOTES)}: no notes page to document grid_sample in")


EDITS = (
    (CU, edit_gridsampler_cu),
    (CUDA_CPP, edit_cuda_backward_alloc),
    (COMPOSITE, edit_composite),
    (CUDNN, edit_cudnn),
    (INIT, edit_init_doc),
    (TEST_TORCH, edit_test_torch),
    (TEST_NN, edit_test_nn),
)


# --------------------------------------------------------------------------- plan / apply


def _git(tree: Path, *args: str) -> Optional[str]:
    r = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def detect_base(tree: Path) -> Base:
    vt = tree / "version.txt"
    if not vt.is_file():
        raise AnchorError("version.txt", "version.txt", "not a PyTorch checkout")
    is_git = _git(tree, "rev-parse", "--show-toplevel") is not None and \
        Path(_git(tree, "rev-parse", "--show-toplevel")).resolve() == tree.resolve()
    return Base(
        version_txt=vt.read_text().strip(),
        describe=_git(tree, "describe", "--tags", "--exact-match") if is_git else None,
        head=_git(tree, "rev-parse", "HEAD") if is_git else None,
        is_git=is_git,
    )


def dirty_paths(tree: Path) -> List[str]:
    r = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True)
    return [line[3:] for line in r.stdout.splitlines() if line.strip()]


def check_kit_header(path: str, header: bytes) -> None:
    """The dispatch calls one launcher per dims: a kit header that lacks one would give a
    patched tree that does not compile, so refuse before planning anything."""
    code = _code_only(header.decode("utf-8"))
    for dims, det in DET_LAUNCHERS.items():
        if not re.search(rf"\bvoid\s+{det}\s*\(", code):
            raise AnchorError(path, f"void {det}(...);", f"the kit does not declare the {dims}D launcher")


def plan(tree: Path, kit_root: Optional[Path] = None) -> Plan:
    # DETGRID_KIT_ROOT: take aten_kernels/ from another checkout of the kit (e.g. `git archive HEAD`)
    kit_root = Path(kit_root or os.environ.get("DETGRID_KIT_ROOT") or KIT_ROOT)
    tree = Path(tree)
    p = Plan(base=detect_base(tree))
    for name in KERNEL_FILES:
        src = kit_root / "aten_kernels" / KERNEL_DIR / name
        rel = f"{KERNEL_DIR}/{name}"
        dst = tree / rel
        p.old[rel] = dst.read_bytes() if dst.exists() else None
        p.new[rel] = src.read_bytes()
        if p.old[rel] is not None and p.old[rel] != p.new[rel]:
            p.notes.append(f"{rel}: exists and differs; replaced with the kit's")
    check_kit_header(f"aten_kernels/{KERNEL_DIR}/{DET_HEADER}", p.new[f"{KERNEL_DIR}/{DET_HEADER}"])
    for rel, fn in EDITS:
        f = tree / rel
        if not f.is_file():
            raise AnchorError(rel, rel, "file missing")
        old = f.read_bytes()
        try:
            new = fn(rel, old.decode("utf-8"), p.notes).encode("utf-8")
        except ValueError as e:
            raise AnchorError(rel, fn.__name__, f"cannot parse: {e}")
        p.old[rel], p.new[rel] = old, new
    # only the tree's headers tell whether an include served the deterministic branch we replaced
    p.new[CU] = drop_stale_includes(tree, CU, p.old[CU].decode("utf-8"), p.new[CU].decode("utf-8"),
                                    p.notes).encode("utf-8")
    plan_randomness(tree, p)
    return p


def apply(tree: Path, pl: Plan, fail_after: Optional[int] = None) -> List[str]:
    """Write every changed file: temporaries first, then renames; restore all on any error."""
    tree = Path(tree)
    changed = pl.changed
    tmps: Dict[str, Path] = {}
    done: List[str] = []
    try:
        for rel in changed:
            dst = tree / rel
            tmp = dst.with_name(f".{dst.name}.detgrid-tmp")
            tmp.write_bytes(pl.new[rel])
            if dst.exists():
                os.chmod(tmp, dst.stat().st_mode & 0o7777)
            tmps[rel] = tmp
        for i, rel in enumerate(changed):
            if fail_after is not None and i == fail_after:
                raise OSError(f"simulated failure before writing {rel}")
            os.replace(tmps.pop(rel), tree / rel)
            done.append(rel)
    except BaseException:
        for rel in done:
            dst = tree / rel
            if pl.old[rel] is None:
                dst.unlink()
            else:
                dst.write_bytes(pl.old[rel])
        raise
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
    return changed


# --------------------------------------------------------------------------- patch file

COMMIT_MESSAGE = """\
Subject: [PATCH] Add deterministic CUDA backward for grid_sampler_2d/3d

Fixes #68959

Under torch.use_deterministic_algorithms(True), the CUDA backward of
grid_sample raised "grid_sampler_2d_backward_cuda does not have a
deterministic implementation" (grid_sampler_3d_backward_cuda for 5-D
inputs) because grad_input is scattered with atomicAdd. This adds a
deterministic path for both, taken when deterministic algorithms are on
and the input gradient is requested:

1. point pass, one thread per output point: grid gradient (single writer)
   and one (destination pixel or voxel, record id, weight) record per tap;
2. stable radix sort of the records by destination (at::cuda::cub);
3. reduce without atomics, one writer per grad_input element, in a
   canonical order that does not depend on GPU model, launch
   configuration or chunking: over every element when grad_input has no
   more pixels than a chunk has records (zeros written by the same pass),
   else over the touched pixels after a zero fill.

Workspace comes from the caching allocator and is bounded independently
of the grid values and of the input size (chunks of about 2^21 records,
about 64 MiB). Non-finite grid
coordinates never form an index. When only the grid gradient is
requested the existing kernel runs and no alert is raised (it has a
single writer per element). grid_sampler_{2d,3d}_backward_cuda allocate
grad_input with empty_like instead of zeros_like in deterministic mode,
since the deterministic path writes every element.

In deterministic mode the composite grid_sampler no longer picks cuDNN,
and cudnn_grid_sampler_backward delegates to grid_sampler_2d_backward
(cudnn_grid_sampler is bilinear/zeros/align_corners=True).

Test Plan:
python test/test_nn.py -k test_grid_sample_2d_backward_deterministic
python test/test_nn.py -k test_grid_sample_3d_backward_deterministic
python test/test_torch.py -k test_nondeterministic_alert_grid_sample
"""


def _diff_file(rel: str, old: Optional[bytes], new: bytes) -> str:
    a = old.decode("utf-8").splitlines(keepends=True) if old is not None else []
    b = new.decode("utf-8").splitlines(keepends=True)
    head = f"diff --git a/{rel} b/{rel}\n"
    if old is None:
        head += "new file mode 100644\n"
    lines = list(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{rel}", f"b/{rel}", n=3))
    out = []
    for ln in lines:
        if ln.startswith(("---", "+++")):
            out.append(ln.rstrip("\n").rstrip() + "\n" if not ln.endswith("\n") else ln)
            continue
        if not ln.endswith("\n"):
            ln += "\n\\ No newline at end of file\n"
        out.append(ln)
    # difflib writes "--- a/x\t" style headers with dates only when given; normalise anyway
    out = [re.sub(r"^(---|\+\+\+) (\S+).*\n", r"\1 \2\n", ln) if ln.startswith(("--- ", "+++ ")) else ln
           for ln in out]
    return head + "".join(out)


def render_patch(pl: Plan) -> str:
    parts = [
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n",
        "From: detgrid <detgrid@users.noreply.github.com>\n",
        COMMIT_MESSAGE,
        f"\nGenerated by `detgrid patch` against {pl.base.label} (version.txt {pl.base.version_txt}).\n",
        "---\n",
    ]
    for rel in pl.changed:
        parts.append(_diff_file(rel, pl.old[rel], pl.new[rel]))
    parts.append("-- \ndetgrid patch\n")
    return "".join(parts)


def default_out(pl: Plan) -> Path:
    return KIT_ROOT / "patches" / f"{pl.base.label}.patch"


def check_patch(tree: Path, patch_file: Path) -> Tuple[bool, str]:
    """Does patch_file apply cleanly to tree (or is it already applied)?"""
    def git_apply(*extra):
        return subprocess.run(["git", "apply", "--check", *extra, str(patch_file.resolve())],
                              cwd=tree, capture_output=True, text=True)
    r = git_apply()
    if r.returncode == 0:
        return True, f"{patch_file} applies cleanly"
    if git_apply("--reverse").returncode == 0:
        return True, f"{patch_file} is already applied"
    return False, f"{patch_file} does not apply: {r.stderr.strip()}"


# --------------------------------------------------------------------------- lint (new files)


def lint_new_files(tree: Path, files: Dict[str, bytes]) -> List[str]:
    """The checkout's grep linters (.lintrunner.toml) and newline rules on the files we add."""
    problems = []
    cfg = tree / ".lintrunner.toml"
    linters = []
    if cfg.is_file():
        import tomllib
        for ln in tomllib.loads(cfg.read_text()).get("linter", []):
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


def run(args: argparse.Namespace) -> int:
    tree = Path(args.pytorch).resolve()
    try:
        base = detect_base(tree)
    except AnchorError as e:
        print(f"detgrid patch: {e}", file=sys.stderr)
        return EXIT_ANCHOR
    print(f"base: {base.label} ({base})")
    if args.check:
        patch_file = Path(args.out) if args.out else KIT_ROOT / "patches" / f"{base.label}.patch"
        ok, msg = check_patch(tree, patch_file)
        print(msg)
        return EXIT_OK if ok else EXIT_CHECK
    try:
        pl = plan(tree)
    except AnchorError as e:
        print(f"detgrid patch: {e} (base {base.label}: {base}); nothing was changed", file=sys.stderr)
        return EXIT_ANCHOR
    for n in pl.notes:
        print(f"note: {n}")
    if pl.changed and base.is_git and not args.allow_dirty:
        dirty = dirty_paths(tree)
        if dirty:
            print(f"detgrid patch: {tree} has uncommitted changes ({', '.join(dirty[:5])}"
                  f"{' ...' if len(dirty) > 5 else ''}); commit or stash them, or pass --allow-dirty;"
                  " nothing was changed", file=sys.stderr)
            return EXIT_DIRTY
    for problem in lint_new_files(tree, {r: pl.new[r] for r in pl.changed if pl.old[r] is None}):
        print(f"lint: {problem}")
    if not pl.changed:
        print("already applied: nothing to change")
        return EXIT_OK
    patch_text = render_patch(pl)
    try:
        written = apply(tree, pl, fail_after=_fail_after())
    except Exception as e:  # rolled back by apply()
        print(f"detgrid patch: writing failed ({e}); every file was restored", file=sys.stderr)
        return EXIT_ANCHOR
    for rel in written:
        print(f"{'created' if pl.old[rel] is None else 'patched'} {rel}")
    out = Path(args.out) if args.out else default_out(pl)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(patch_text)
    os.replace(tmp, out)
    print(f"wrote {out}")
    return EXIT_OK


def _fail_after() -> Optional[int]:
    v = os.environ.get("DETGRID_PATCH_FAIL_AFTER")  # test hook: simulate a write failure
    return int(v) if v else None


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "patch",
        help="apply the deterministic grid_sample backward to a PyTorch checkout and write a "
        "format-patch file",
    )
    p.add_argument("--pytorch", required=True, metavar="PATH", help="PyTorch source tree")
    p.add_argument("--check", action="store_true",
                   help="only verify that the checked-in patch (or --out FILE) applies")
    p.add_argument("--allow-dirty", action="store_true", help="patch a tree with uncommitted changes")
    p.add_argument("--out", metavar="FILE", help="patch file (default patches/<base>.patch)")
    p.set_defaults(handler=run)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="detgrid")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main(["patch", *sys.argv[1:]]))
