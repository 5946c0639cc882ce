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
    "GridSamplerDeterministic.cu",
)
LAUNCHER = "launch_grid_sampler_2d_backward_kernel"
DET_LAUNCHER = "launch_grid_sampler_2d_backward_deterministic_kernel"
CU = "aten/src/ATen/native/cuda/GridSampler.cu"
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


def _launcher_args(path: str, f: Func) -> Dict[str, str]:
    names = f.params
    if set(ROLES) <= set(names):
        return {r: r for r in ROLES}
    if len(names) == len(ROLES) and all(names):
        return dict(zip(ROLES, names))  # same order, renamed parameters
    raise AnchorError(path, f"{LAUNCHER}(...) parameters",
                      f"expected the 9 parameters {', '.join(ROLES)}; found {', '.join(names)}")


def _remove_existing_det_branch(body: str) -> Tuple[str, bool]:
    """Remove an ``if (...deterministicAlgorithms()...) { ... }`` block (another deterministic
    path, e.g. PR #196856's) from a launcher body; return the new body and whether it did."""
    m = re.search(r"deterministicAlgorithms\(\)", body)
    if not m:
        return body, False
    ifm = None
    for cand in re.finditer(r"\bif\s*\(", body[: m.start()]):
        ifm = cand
    if ifm is None:
        return body, False
    cond_close = _match(body, ifm.end() - 1, "(", ")")
    if cond_close < m.start():
        return body, False
    k = cond_close + 1
    while body[k].isspace():
        k += 1
    if body[k] != "{":
        return body, False
    end = _match(body, k, "{", "}") + 1
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
        tail = body[ee + 1 :]
        return body[:start] + _dedent(inner, 2).strip("\n") + "\n" + tail.lstrip(" "), True
    tail = body[end:]
    if tail.startswith("\n"):
        tail = tail[1:]
    return body[:start] + tail, True


def _dedent(block: str, n: int) -> str:
    return "\n".join(line[n:] if line.startswith(" " * n) else line for line in block.split("\n"))


def edit_gridsampler_cu(path: str, text: str, notes: List[str]) -> str:
    defs = _find_defs(text, r"\bvoid", LAUNCHER)
    if len(defs) != 1:
        raise AnchorError(path, f"void {LAUNCHER}(...) {{...}}", f"{len(defs)} definitions found")
    f = defs[0]
    body = text[f.body_open : f.body_close + 1]
    if f"{DET_LAUNCHER}(" in body:
        notes.append(f"{path}: deterministic dispatch already present")
        return text
    a = _launcher_args(path, f)
    body, replaced = _remove_existing_det_branch(body)
    if replaced:
        notes.append(f"{path}: replaced an existing deterministic branch in {LAUNCHER} "
                     "(upstream PR #196856's path) with detgrid's")
    alert = re.search(
        r'(?P<comments>(?:^[ \t]*//[^\n]*\n)*)^(?P<ind>[ \t]*)(?P<ctx>(?:at::)?globalContext\(\))'
        r'\.alertNotDeterministic\(\s*"grid_sampler_2d_backward_cuda"\s*\);[ \t]*\n',
        body, re.M)
    if alert is None:
        raise AnchorError(path, 'alertNotDeterministic("grid_sampler_2d_backward_cuda")',
                          f"not found in the body of {LAUNCHER}")
    ind, ctx = alert.group("ind"), alert.group("ctx")
    block = (
        f"{ind}// See Note [Enabling Deterministic Operations]\n"
        f"{ind}// With the input gradient requested, deterministic mode takes the sort-based\n"
        f"{ind}// path of GridSamplerDeterministic.cu: no atomics, every element of\n"
        f"{ind}// grad_input written once (no zero fill needed).\n"
        f"{ind}if ({ctx}.deterministicAlgorithms() && {a['output_mask']}[0]) {{\n"
        f"{ind}  {DET_LAUNCHER}(\n"
        f"{ind}      {a['grad_input']}, {a['grad_grid']}, {a['grad_output']}, {a['input']}, {a['grid']},\n"
        f"{ind}      {a['interpolation_mode']}, {a['padding_mode']}, {a['align_corners']},\n"
        f"{ind}      {a['output_mask']});\n"
        f"{ind}  return;\n"
        f"{ind}}}\n"
        f"{ind}// See Note [Writing Nondeterministic Operations]\n"
        f"{ind}// Nondeterministic because of atomicAdd usage into grad_input; the grid\n"
        f"{ind}// gradient alone has a single writer per element.\n"
        f"{ind}if ({a['output_mask']}[0]) {{\n"
        f"{ind}  {ctx}.alertNotDeterministic(\"grid_sampler_2d_backward_cuda\");\n"
        f"{ind}}}\n"
    )
    body = body[: alert.start()] + block + body[alert.end() :]
    text = text[: f.body_open] + body + text[f.body_close + 1 :]
    return _add_include(path, text, "ATen/native/cuda/GridSamplerDeterministic.h",
                        after=("ATen/native/cuda/GridSampler.h", "ATen/native/cuda/"))


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


GS = ":func:`torch.nn.functional.grid_sample`"


def edit_init_doc(path: str, text: str, notes: List[str]) -> str:
    act = re.search(r"normally-nondeterministic operations will act\s+deterministically when "
                    r"``mode=True``:\n\n((?:[ \t]+\S[^\n]*\n|\n(?=[ \t]{6,}\S))+)", text)
    throw = re.search(r"normally-nondeterministic operations will throw a\s+:class:`RuntimeError` "
                      r"when ``mode=True``:\n\n((?:[ \t]+\S[^\n]*\n|\n(?=[ \t]{6,}\S))+)", text)
    if not act or not throw:
        raise AnchorError(path, "use_deterministic_algorithms docstring lists",
                          "'will act deterministically' / 'will throw a RuntimeError' lists not found")
    if GS in act.group(1):
        notes.append(f"{path}: grid_sample already listed as deterministic")
        return text
    gm = re.search(rf"^([ \t]+)\* {re.escape(GS)} when attempting to differentiate a CUDA tensor\n",
                   throw.group(1), re.M)
    if gm is None:
        raise AnchorError(path, f"* {GS} ... (throw list)", "grid_sample not in the throw list")
    ind = gm.group(1)
    new_throw = (throw.group(1)[: gm.start()]
                 + f"{ind}* {GS} when attempting to differentiate a CUDA tensor\n"
                 f"{ind}  with 5-D input\n" + throw.group(1)[gm.end() :])
    new_act = (act.group(1) + f"{ind}* {GS} when attempting to differentiate a CUDA tensor\n"
               f"{ind}  with 4-D input\n")
    # throw list comes after act list
    return (text[: act.start(1)] + new_act + text[act.end(1) : throw.start(1)] + new_throw
            + text[throw.end(1) :])


def edit_test_torch(path: str, text: str, notes: List[str]) -> str:
    m = re.search(r"^([ \t]+)def test_nondeterministic_alert_grid_sample_2d\(self, device\):\n", text, re.M)
    if m is None:
        raise AnchorError(path, "def test_nondeterministic_alert_grid_sample_2d")
    ind = m.group(1)
    end = re.compile(rf"^{ind}\S", re.M).search(text, m.end())
    end = end.start() if end else len(text)
    body = text[m.end() : end]
    c = re.search(r"self\.check_nondeterministic_alert\(", body)
    if c is None:
        raise AnchorError(path, "self.check_nondeterministic_alert(...) in test_nondeterministic_alert_grid_sample_2d")
    close = _match(body, c.end() - 1, "(", ")")
    args = _split_top(body[c.end() : close])
    if len(args) != 3 or "grid_sampler_2d_backward_cuda" not in args[1]:
        raise AnchorError(path, "check_nondeterministic_alert(fn, 'grid_sampler_2d_backward_cuda', should_alert)",
                          f"arguments {args}")
    if args[2] == "False":
        notes.append(f"{path}: 2D alert test already expects no alert")
        return text
    arg_start = body.rfind(args[2], 0, close)
    cind = _indent_of(body, c.start())
    comment = (f"{cind}# The CUDA backward of 2D grid_sample has a deterministic implementation\n"
               f"{cind}# (GridSamplerDeterministic.cu), so there is no alert on any device.\n")
    body = (body[: _line_start(body, c.start())] + comment + body[_line_start(body, c.start()) : arg_start]
            + "False" + body[arg_start + len(args[2]) :])
    return text[: m.end()] + body + text[end:]


NN_TESTS = '''\
    def _grid_sample_2d_grads(self, input, grid, grad_output, **kwargs):
        input = input.detach().clone().requires_grad_()
        grid = grid.detach().clone().requires_grad_()
        out = F.grid_sample(input, grid, **kwargs)
        out.backward(grad_output)
        return input.grad, grid.grad

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_2d_backward_deterministic(self, device, dtype):
        # A zoom-in grid: many samples land on each input pixel, which is where
        # atomicAdd ordering would show. Repeated runs must agree bit for bit.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 7, 9, device=device, dtype=dtype)
        grid = torch.rand(2, 40, 37, 2, device=device, dtype=dtype) * 0.6 - 0.3
        grad_output = torch.randn(2, 3, 40, 37, device=device, dtype=dtype)
        for mode, padding_mode, align_corners in product(
                ('bilinear', 'nearest', 'bicubic'), ('zeros', 'border', 'reflection'), (False, True)):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            with DeterministicGuard(True):
                expected = self._grid_sample_2d_grads(input, grid, grad_output, **kwargs)
                for _ in range(3):
                    actual = self._grid_sample_2d_grads(input, grid, grad_output, **kwargs)
                    self.assertEqual(actual[0], expected[0], atol=0, rtol=0)
                    self.assertEqual(actual[1], expected[1], atol=0, rtol=0)
                # Only the grid gradient requested: nothing to alert about.
                g = grid.detach().clone().requires_grad_()
                F.grid_sample(input, g, **kwargs).backward(grad_output)

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_2d_backward_deterministic_matches_default(self, device, dtype):
        torch.manual_seed(0)
        input = torch.randn(2, 4, 11, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 23, 29, 2, device=device, dtype=dtype) * 2.4 - 1.2
        grad_output = torch.randn(2, 4, 23, 29, device=device, dtype=dtype)
        for mode, padding_mode, align_corners in product(
                ('bilinear', 'nearest', 'bicubic'), ('zeros', 'border', 'reflection'), (False, True)):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            expected = self._grid_sample_2d_grads(input, grid, grad_output, **kwargs)
            with DeterministicGuard(True):
                actual = self._grid_sample_2d_grads(input, grid, grad_output, **kwargs)
            self.assertEqual(actual[0], expected[0])
            self.assertEqual(actual[1], expected[1])

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
            expected = self._grid_sample_2d_grads(input, grid, grad_output, **kwargs)
            for _ in range(3):
                actual = self._grid_sample_2d_grads(input, grid, grad_output, **kwargs)
                self.assertEqual(actual, expected, atol=0, rtol=0)
                i = input.detach().clone().requires_grad_()
                g = grid.detach().clone().requires_grad_()
                torch.cudnn_grid_sampler(i, g).backward(grad_output)
                self.assertEqual(i.grad, expected[0], atol=0, rtol=0)
                self.assertEqual(g.grad, expected[1], atol=0, rtol=0)

'''


def edit_test_nn(path: str, text: str, notes: List[str]) -> str:
    if "def test_grid_sample_2d_backward_deterministic(" in text:
        notes.append(f"{path}: deterministic grid_sample tests already present")
        return text
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


def note_randomness(tree: Path, notes: List[str]) -> None:
    for rel in NOTES:
        p = tree / rel
        if p.is_file() and "grid_sample" in p.read_text():
            notes.append(f"{rel} mentions grid_sample: review its wording by hand (not edited)")


EDITS = (
    (CU, edit_gridsampler_cu),
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
    note_randomness(tree, p.notes)
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
Subject: [PATCH] Add deterministic CUDA backward for grid_sampler_2d

Fixes #68959

Under torch.use_deterministic_algorithms(True), the CUDA backward of 2D
grid_sample raised "grid_sampler_2d_backward_cuda does not have a
deterministic implementation" because grad_input is scattered with
atomicAdd. This adds a deterministic path, taken when deterministic
algorithms are on and the input gradient is requested:

1. point pass, one thread per output point: grid gradient (single writer)
   and one (destination pixel, record id, weight) record per tap;
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
single writer per element). 3D still alerts.

In deterministic mode the composite grid_sampler no longer picks cuDNN,
and cudnn_grid_sampler_backward delegates to grid_sampler_2d_backward
(cudnn_grid_sampler is bilinear/zeros/align_corners=True).

Test Plan:
python test/test_nn.py -k test_grid_sample_2d_backward_deterministic
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
