"""Audits of detgrid's compiled CUDA kernels, read from the machine code.

Two units are audited, each from an sm_90 build's compiler output alone, so
that CI runs it without a GPU.

The upstream core (`core`: aten_kernels/aten/src/ATen/native/cuda/
GridSamplerDeterministic.cu, built against torch's headers alone, see
CORE_SCOPE). It computes the existing kernel's terms with nvcc's contraction
of ``a*b+c``, by design, so its fused multiply-adds are counted and reported
per kernel family, not failed. It fails on: a stack frame or spill in a
kernel of its own (CUB's kernels' frames are reported, not failed), a
`.FTZ` form of FADD, FMUL, FFMA or FMNMX in its arithmetic or the ATen
helpers it inlines, and its budget (CORE_BUDGET: kernels, CUB's included,
bytes of sm_90 `.text`, and lines of new ATen code). It prints every
kernel's registers and records the unit for benchmarks/machine_code.json.

Each speed level's core build (`core --level LEVEL`, detgrid.levels.CORE_BUILDS
after the core: the core's file as the prefix of the upstream stack ending at
that level has it, which `cut-core` writes), built as the core is: the same
rules (a stack frame or spill of its own, flush to zero), and on the top
build (the last speed level's) the whole upstream stack's budget instead of
the core's (STACK_BUDGET: kernels, CUB's included, and bytes of sm_90
`.text`; the 700 lines are the core's alone). `levels --core-build` sets the
core builds side by side (lines, kernels, `.text`, and the registers of each
run-sum kernel, RUN_SUM_KERNELS: what a speed level costs) and records each
under its level's name in benchmarks/machine_code.json.

The pipeline (aten_kernels/pipeline/, the extension's speed path, its levels
cut from one set of sources by detgrid.kit.stack), on a build of its
GridSamplerDeterministic.cu (with --exact, on a build of
aten_kernels/extension/exact/ExactCuda.cu, of the exact accumulation's
kernels only: see EXACT; with --grid-gradient, on a build of
aten_kernels/extension/GridGradient.cu: see GRID_GRADIENT).
Its host executors' bit equality rests on the four checks:

* resources (`ptxas -v`): no detgrid kernel has a stack frame or spills,
  except those --allow-spills names (CI names none); CUB's scan of the hot
  fold's term is reported (CUB_KERNEL);
* fused arithmetic (`nvdisasm -g -gi`, SASS with inlined line info): no
  FFMA, DFMA or HFMA2 in detgrid's own arithmetic. The CUDA == host bit
  equality rests on every operation being rounded on its own; the only
  fused operations allowed are those the compiler expands a correctly
  rounded division into (a source line calling __fdiv_rn / __ddiv_rn), an
  explicit fused multiply-add (__fma_rn: one rounding, as the host's
  std::fma) and those inside CUDA's own math headers (fmod), also where
  the compiler gives fmod's expansion the preceding line of ours: a fused
  instruction counts as ours only on a line with a multiplication. HFMA2 with a -RZ, RZ
  operand pair only materialises a constant and is not arithmetic;
* flush to zero: no `.FTZ` form of FADD, FMUL, FFMA or FMNMX in detgrid's
  arithmetic, which a --use_fast_math or -ftz=true build would produce and
  which would break bit equality with the host for subnormals;
* machine-code budget (--cubin, the unit's own build): every kernel of ours
  is one of the unit's named stage kernels (no generic stage runner such as
  for_each_kernel<Stage>), and the unit, CUB's kernels included, has at most
  KERNEL_BUDGET kernels and TEXT_BUDGET bytes of `.text` (issue 32).

A build of a prefix of the pipeline (`cut` writes a level's ATen files as the
stack cuts them) is audited with the same checks. `levels` then prints each
level's lines and the built levels' kernels and `.text`, with the whole
pipeline's budget (PIPELINE_BUDGET), the core's and the whole stack's, and
records them in benchmarks/machine_code.json (the one writer of that file):
under ``levels`` the core's record (``core``, what `detgrid report` cites),
then each speed level's core build, beside the pipeline's levels; its
top-level arch, kernels and text_bytes are the upstream change's, the core's.
The whole pipeline over its budget is reported ("over budget"), not failed
(--strict fails on it); the core over its budget fails, and so does the top
core build over the whole stack's. A level's build
fails the audit as the whole pipeline's does, except that with
--report-spills its stack frames and spills are reported, not failed (the
levels' record counts them).

It also measures each reduce kernel's inner loop and registers (the smallest loop that
holds the fold's FMUL and FADD, plus the static size of any subroutine it
calls) and its setup (what one grad_input element, or one sparse run, costs
before the fold's loops start), for benchmarks/NOTES.md, and fails when the
setup of a 2-D fp32 dense reduce exceeds SETUP_LIMIT. With --exact it
measures the exact reduces' record loop and ScatterTerms' loop over terms,
with the integer atomics in it; the exact kernels get no spill allowance.
"""

import argparse
import collections
import dataclasses
import json
import re
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Scope:
    """The kernels an audit calls ours (a regex on mangled names) and the
    source files whose instructions it calls ours."""
    kernel: re.Pattern
    sources: Tuple[str, ...]


# Kernels of ours: everything in GridSamplerDeterministic.cu's anonymous
# namespace (CUB's kernels live in at_cuda_detail and are not audited).
OUR_KERNEL = re.compile(r"GridSamplerDeterministic_cu")
# CUB's kernels, named by CUB. The hot fold's sum over its slots is CUB's
# scan of a term of ours (HotKeys), whose type its name carries: its stack
# frame holds CUB's unrolled tile across each call of the term, which is
# not inlined so that the tile does not copy it per item. Its fused and
# flush-to-zero arithmetic is audited as ours; its frame is reported
# (cub_frames), not failed, and its name is CUB's.
CUB_KERNEL = re.compile(r"^_ZN\d+at_cuda_detail3cub")
OUR_SOURCES = (
    "GridSamplerDeterministic.cuh", "GridSamplerDeterministicPipeline.cuh",
    "GridSamplerDeterministic.cu", "GridSamplerDeterministicDense.cuh",
    "GridSamplerDeterministicCells.cuh", "GridSamplerDeterministicChannelsFastest.cuh",
    "GridSamplerDeterministicHotFold.cuh")
PIPELINE = Scope(OUR_KERNEL, OUR_SOURCES)

# The unit's kernels, one per stage, each named after what it computes.
# The reduces (dense with destinations fastest, dense with channels fastest,
# sparse, and the parallel fold of hot destinations) are the ones whose fold
# the audit measures.
REDUCE_KERNELS = ("sum_segments_per_destination_kernel", "sum_segments_channels_fastest_kernel",
                  "sum_runs_kernel", "fold_hot_destinations_kernel")
STAGE_KERNELS = ("grid_sampler_point_records_kernel", "mark_segment_bounds_kernel",
                 "gather_grad_output_channels_last_kernel", "round_float_sums_kernel"
                 ) + REDUCE_KERNELS
# What the unit ran every stage through before issue 32: one kernel per
# stage type, 491 of them, whose name says nothing of the stage.
GENERIC_RUNNERS = ("for_each_kernel", "for_each_row_kernel")
# The unit's budget (issue 32), CUB's kernels included: stock's whole
# GridSampler.cu is 32 kernels and 6.48 MiB of sm_90 `.text`.
KERNEL_BUDGET = 128
TEXT_BUDGET = 3 * 2**20


@dataclasses.dataclass(frozen=True)
class LevelBudget:
    """A unit's budget (issue 41): kernels (CUB's included) and bytes of sm_90 `.text` of its
    GridSamplerDeterministic.cu, and lines of its ATen files (None: no line budget)."""
    kernels: int
    text_bytes: int
    lines: Optional[int] = None


# The upstream core's budget (issue 41, with the core rebuilt as one file): kernels, CUB's
# included, and sm_90 `.text` of its GridSamplerDeterministic.cu, and its lines of new ATen
# code. The core meets it, and the audit fails past it. The 700 lines: issue 41's 600 predate
# tricubic (5-D bicubic, the mode torch 2.15 added), which the core now serves in 99 lines of
# its own; the kernels and `.text` are issue 41's, unchanged.
CORE_LEVEL = "core"  # stands for detgrid.kit.stack.CORE, the upstream core
CORE_BUDGET = LevelBudget(40, 1 * 2**20, 700)
# The whole pipeline's (issue 41's "whole stack" budget, when the pipeline was the upstream
# change): reported, not failed, past it (`levels --strict` fails).
TOP_LEVEL = "top"  # stands for detgrid.kit.stack.TOP, the whole pipeline
PIPELINE_BUDGET = LevelBudget(128, 2 * 2**20)
LEVEL_BUDGETS = {CORE_LEVEL: CORE_BUDGET, TOP_LEVEL: PIPELINE_BUDGET}
# The whole upstream stack's budget ("the whole stack: <= 100 named kernels and 1.6 MiB"):
# kernels, CUB's included, and sm_90 `.text` of the core's file as the top core build (the
# prefix of the stack ending at its last speed level, detgrid.levels.CORE_BUILDS[-1]) has it.
# No line budget: the core's 700 lines are the core's alone. The audit fails past it.
STACK_BUDGET = LevelBudget(100, int(1.6 * 2**20))
# The core's run sums, whose registers the core builds' audit sets side by side: what a speed
# level of the stack costs in registers.
RUN_SUM_KERNELS = ("sum_runs_kernel", "sum_run_partials_kernel")

# The upstream core: its kernels are those of its file's anonymous namespace
# (OUR_KERNEL); its arithmetic is its own file's and that of the existing
# kernel's helpers it inlines (ATen's GridSampler.cuh, UpSample.cuh), where the
# audit looks for flush-to-zero forms. CUB's kernels in its unit (the sort and
# unique_by_key) are CUB's alone: their stack frames are reported, not failed.
CORE_SOURCES = ("GridSamplerDeterministic.cu", "GridSampler.cuh", "UpSample.cuh")
CORE_SCOPE = Scope(OUR_KERNEL, CORE_SOURCES)

# The exact accumulation's kernels (--exact): those whose stage (the
# kernel's first template argument) is one of detgrid::exact's. ExactCuda.cu
# includes GridSamplerDeterministic.cu whole, so its build also holds the
# pipeline's kernels (in ExactCuda.cu's anonymous namespace): they are the
# release build's and audited there, not twice. These stages inline the
# pipeline's arithmetic (mul_rn, divide), so its sources
# count as ours too.
EXACT_STAGES = ("FindGradOutputBound", "ScatterTerms", "ReduceExactDense", "ReduceExactSparse",
                "RoundSums")
EXACT = Scope(re.compile(r"IN7detgrid5exact\d+(" + "|".join(EXACT_STAGES) + r")I"),
              OUR_SOURCES + ("ExactSum.cuh", "ExactBackward.cuh", "ExactCuda.cu"))
# The extension's grad_grid (--grid-gradient): the kernels of GridGradient.cu,
# built as setup.py builds it (-fmad=false), so that every operation is
# rounded on its own, as in its host build; its arithmetic is its own file's
# and that of the existing helpers it inlines.
GRID_GRADIENT = Scope(re.compile(r"grid_sampler_[23]d_grid_gradient_kernel"),
                      ("GridGradient.cu", "GridSampler.cuh", "UpSample.cuh"))
# The exact stages that loop over terms (ScatterTerms, one per thread
# invocation) or over an element's records (the reduces).
EXACT_LOOP_STAGES = ("ScatterTerms", "ReduceExactDense", "ReduceExactSparse")
# Source lines whose fused instructions are one correctly rounded operation
# each: a division's expansion, or an explicit fused multiply-add.
ROUNDED_INTRINSICS = ("__fdiv_rn", "__ddiv_rn", "__fma_rn")

FUSED = re.compile(r"^(FFMA|DFMA|HFMA2)(\.|$)")
FTZ_ARITHMETIC = re.compile(r"^(FADD|FMUL|FFMA|FMNMX|FADD32I|FMUL32I|FFMA32I)\b.*\.FTZ")
CONSTANT_IDIOM = re.compile(r"-RZ,\s*RZ")
# Global integer atomics: ATOM(G) returns the old value, RED(G) does not.
# (REDUX is a warp reduction, ATOMS a shared-memory atomic.)
GLOBAL_ATOMIC = re.compile(r"^(ATOMG?|REDG?)(\.|$)")

# The fp32 dense reduces a 2-D bilinear call with 32-bit indices runs
# (either thread order, keyed per tap or per cell), whose per-element setup
# issue 23 bounds. The per-tap fold takes its taps per point at run time,
# so its kernels serve 2-D and 3-D calls alike.
DENSE_2D_FP32 = re.compile(
    r"ReduceDense(ChannelsFastest|ChannelGroups)?<[\w:]*DenseFold<[\w:]*"
    r"(DestinationSegments<int>|CellSegments<int, 2>), float, int>")
SETUP_LIMIT = 80
# Every fp32 reduce (any index width, keying and thread order, and the hot
# fold's): what each level's machine_code.json record lists.
FP32_REDUCE = re.compile(r"(, float, (int|long)>|<float, (int|long)>)")


@dataclasses.dataclass
class Resources:
    registers: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> bool:
        return self.stack_frame > 0 or self.spill_stores > 0 or self.spill_loads > 0


@dataclasses.dataclass
class Instruction:
    offset: int
    opcode: str
    operands: str
    source: Optional[Tuple[str, int]]  # innermost (file, line), if known
    target: Optional[str] = None  # branch or call target label
    # In a subroutine the compiler emitted (the `$__internal_...` slow paths
    # of division and fmod, reached by CALL): library code, not ours.
    in_subroutine: bool = False
    predicate: str = ""  # "@P0", "@!P1", ...; empty when unconditional


@dataclasses.dataclass
class Function:
    name: str
    instructions: List[Instruction]
    labels: Dict[str, int]  # label -> offset


def parse_ptxas(text: str) -> Dict[str, Resources]:
    """Per mangled kernel name, the resources `ptxas -v` reports."""
    resources: Dict[str, Resources] = {}
    current: Optional[Resources] = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = resources.setdefault(m.group(1), Resources())
            continue
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = resources.setdefault(m.group(1), Resources())
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current.registers = int(m.group(1))
    return resources


_FUNCTION = re.compile(r"^\.text\.(\S+):$")
_LINE_INFO = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+|\$[\w$.]+):")
_TARGET = re.compile(r"`\(([^)]+)\)")


def parse_sass(text: str) -> Dict[str, Function]:
    """Functions of `nvdisasm -c -g -gi` output, with each instruction's
    innermost source location."""
    functions: Dict[str, Function] = {}
    current: Optional[Function] = None
    source: Optional[Tuple[str, int]] = None
    pending_labels: List[str] = []
    # A location is a block of //## lines, innermost frame first, each
    # further line the call site it was inlined at.
    in_location_block = False
    in_subroutine = False
    for line in text.splitlines():
        m = _FUNCTION.match(line.strip())
        if m:
            current = functions.setdefault(m.group(1), Function(m.group(1), [], {}))
            source, pending_labels, in_location_block = None, [], False
            in_subroutine = False
            continue
        if current is None:
            continue
        m = _LINE_INFO.search(line)
        if m:
            if not in_location_block:
                source = (m.group(1), int(m.group(2)))
            in_location_block = True
            continue
        in_location_block = False
        m = _LABEL.match(line.strip())
        if m:
            pending_labels.append(m.group(1))
            in_subroutine = in_subroutine or m.group(1).startswith("$")
            continue
        m = _INSTRUCTION.search(line)
        if m:
            offset = int(m.group(1), 16)
            for label in pending_labels:
                current.labels[label] = offset
            pending_labels = []
            target = _TARGET.search(m.group(4))
            current.instructions.append(Instruction(
                offset, m.group(3), m.group(4).strip(), source,
                target.group(1) if target else None, in_subroutine,
                (m.group(2) or "").strip()))
            if m.group(3).startswith("RET"):
                in_subroutine = False
    return functions


def is_ours(ins: Instruction, sources: Tuple[str, ...] = OUR_SOURCES) -> bool:
    """Whether the instruction is detgrid's own code: innermost source line
    in our files, outside compiler-emitted subroutines."""
    return (not ins.in_subroutine and ins.source is not None
            and ins.source[0].endswith(sources))


class SourceLines:
    """Reads source lines once, to tell a division's expansion from our own
    arithmetic."""

    def __init__(self):
        self._files: Dict[str, List[str]] = {}

    def line(self, source: Tuple[str, int]) -> str:
        path, number = source
        if path not in self._files:
            try:
                with open(path, encoding="utf-8") as f:
                    self._files[path] = f.read().splitlines()
            except OSError:
                self._files[path] = []
        lines = self._files[path]
        return lines[number - 1] if 0 < number <= len(lines) else ""


def fused_violations(functions: Dict[str, Function], lines: SourceLines,
                     scope: Scope = PIPELINE) -> List[str]:
    found = []
    for function in functions.values():
        if not scope.kernel.search(function.name):
            continue
        for ins in function.instructions:
            if not FUSED.match(ins.opcode) or CONSTANT_IDIOM.search(ins.operands):
                continue
            if not is_ours(ins, scope.sources):
                continue  # CUDA's math headers, or a library subroutine
            line = lines.line(ins.source)
            if any(name in line for name in ROUNDED_INTRINSICS):
                continue
            if "*" not in line:
                # A contraction of ours needs a multiplication on its line.
                # Inlined library code the compiler emits without line
                # info of its own (fmodf's expansion) inherits the line
                # before it, which may be a comparison or a negation.
                continue
            found.append(f"{ins.opcode} {ins.operands} at {ins.source[0]}:{ins.source[1]} "
                         f"in {function.name}")
    return found


def ftz_violations(functions: Dict[str, Function], scope: Scope = PIPELINE) -> List[str]:
    found = []
    for function in functions.values():
        if not scope.kernel.search(function.name):
            continue
        for ins in function.instructions:
            if FTZ_ARITHMETIC.match(ins.opcode) and is_ours(ins, scope.sources):
                found.append(f"{ins.opcode} {ins.operands} at {ins.source[0]}:{ins.source[1]} "
                             f"in {function.name}")
    return found


def resource_violations(resources: Dict[str, Resources], allowed: Iterable[str],
                        scope: Scope = PIPELINE) -> List[str]:
    """Our kernels with a stack frame or spills, other than those whose
    demangled name matches one of the `allowed` patterns."""
    allowed = [re.compile(pattern) for pattern in allowed]
    found = []
    for name, r in sorted(resources.items()):
        if not scope.kernel.search(name) or not r.spills or CUB_KERNEL.search(name):
            continue
        readable = demangle(name)
        if any(pattern.search(readable) for pattern in allowed):
            continue
        found.append(f"{readable}: {r.stack_frame} B stack frame, {r.spill_stores} B spill "
                     f"stores, {r.spill_loads} B spill loads")
    return found


def cub_frames(resources: Dict[str, Resources], scope: Scope = PIPELINE) -> List[str]:
    """CUB's kernels that take a term of ours, with their stack frames and spills."""
    found = []
    for name, r in sorted(resources.items()):
        if scope.kernel.search(name) and CUB_KERNEL.search(name) and r.spills:
            readable = _NAMESPACES.sub("", demangle(name))
            term = re.search(r"TermIterator<(\w+<\w+<[^>]*>\s*>)", readable)
            found.append(f"{kernel_name(name)} of {term.group(1) if term else readable}: "
                         f"{r.stack_frame} B stack frame, {r.spill_stores} B spill stores, "
                         f"{r.spill_loads} B spill loads")
    return found


def loops(function: Function) -> List[Tuple[int, int]]:
    """(first, last) instruction index of every backward branch's loop."""
    index_of = {ins.offset: i for i, ins in enumerate(function.instructions)}
    found = []
    for i, ins in enumerate(function.instructions):
        if ins.opcode.startswith("BRA") and ins.target in function.labels:
            start = index_of.get(function.labels[ins.target])
            if start is not None and start <= i:
                found.append((start, i))
    return found


def enclosing_loop(function: Function, inner: Tuple[int, int]) -> Optional[Tuple[int, int]]:
    """The smallest loop that strictly contains `inner` (a loop with several
    backward branches counts from its head to its last one)."""
    last_branch: Dict[int, int] = {}
    for start, end in loops(function):
        last_branch[start] = max(end, last_branch.get(start, end))
    around = [(start, end) for start, end in last_branch.items()
              if start <= inner[0] and inner[1] <= end and (start, end) != inner
              and start != inner[0]]
    return min(around, key=lambda loop: loop[1] - loop[0], default=None)


def subroutine_size(function: Function, label: str) -> int:
    """Static instruction count of a called subroutine, to its first RET."""
    start = function.labels.get(label)
    if start is None:
        return 0
    count = 0
    for ins in function.instructions:
        if ins.offset < start:
            continue
        count += 1
        if ins.opcode.startswith("RET"):
            break
    return count


@dataclasses.dataclass
class LoopCost:
    body: int  # instructions of the loop body, branch included
    calls: int  # CALLs in it (64-bit division and the like)
    callee: int  # static instructions of the subroutines they call
    loop: Tuple[int, int] = (0, 0)  # its first and last instruction index

    @property
    def total(self) -> int:
        return self.body + self.callee


def smallest_loop_cost(function: Function,
                       holds: Callable[[List[Instruction]], bool]) -> Optional[LoopCost]:
    """The cheapest loop whose body `holds`: its instructions, with the
    static size of each subroutine it calls (an upper bound on what a call
    executes)."""
    best = None
    for start, end in loops(function):
        body = function.instructions[start:end + 1]
        if not holds(body):
            continue
        calls = [ins for ins in body if ins.opcode.startswith("CALL") and ins.target]
        cost = LoopCost(len(body), len(calls),
                        sum(subroutine_size(function, ins.target) for ins in calls),
                        (start, end))
        if best is None or cost.total < best.total:
            best = cost
    return best


def _our_opcodes(body: Iterable[Instruction], sources: Tuple[str, ...]) -> set:
    return {ins.opcode.split(".")[0] for ins in body if is_ours(ins, sources)}


def inner_loop_cost(function: Function, multiply: str = "FMUL",
                    add: str = "FADD") -> Optional[LoopCost]:
    """The smallest loop holding the fold's multiply and add (attributed to
    our sources): the instructions one record costs when the loop runs once
    per record."""
    return smallest_loop_cost(
        function, lambda body: {multiply, add} <= _our_opcodes(body, OUR_SOURCES))


def successors(function: Function, i: int) -> List[int]:
    """Where control may go after instruction i: the next instruction unless
    i always leaves (an unconditional branch, EXIT or RET), and a branch's
    target."""
    ins = function.instructions[i]
    op = ins.opcode.split(".")[0]
    found = []
    if op == "BRA" and ins.target in function.labels:
        found += [k for k, other in enumerate(function.instructions)
                  if other.offset == function.labels[ins.target]]
    always = ins.predicate in ("", "@PT")
    if not (always and op in ("BRA", "EXIT", "RET")) and i + 1 < len(function.instructions):
        found.append(i + 1)
    return found


def path_cost(function: Function, start: int, goal: int, within: Tuple[int, int],
              counted: Callable[[Instruction], bool] = lambda ins: False,
              count: int = 0) -> Optional[int]:
    """The fewest instructions executed from `start` until `goal` is first
    reached (goal itself not included), staying within instructions `within`
    and never returning to `start`, on a path that executes exactly `count`
    instructions `counted` says yes to."""
    first, last = within
    distance = {(start, 0): 0}
    queue = collections.deque([(start, 0)])
    while queue:
        i, seen = queue.popleft()
        if i == goal:
            if seen == count:
                return distance[(i, seen)]
            continue
        step = seen + (1 if counted(function.instructions[i]) else 0)
        if step > count:
            continue
        # Once from start to goal: never back to start (around its loop).
        for j in successors(function, i):
            if first <= j <= last and j != start and (j, step) not in distance:
                distance[(j, step)] = distance[(i, seen)] + 1
                queue.append((j, step))
    return None


def setup_cost(function: Function, record_loop: Tuple[int, int]) -> Optional[int]:
    """Instructions from the head of the loop over elements (or runs) to the
    head of the fold's loop over partials, which holds the record loop: the
    index math, segment loads and merge set-up one element pays before its
    first record. Static: the fewest on any path between the two heads."""
    partials = enclosing_loop(function, record_loop)
    elements = partials and enclosing_loop(function, partials)
    if elements is None:
        return None
    return path_cost(function, elements[0], partials[0], elements)


def record_cost(function: Function, record_loop: Tuple[int, int],
                multiplies: int, multiply: str = "FMUL") -> Optional[int]:
    """Instructions one record costs in a record loop that folds several
    channels at once (ReduceDenseChannelGroups), when it folds `multiplies`
    of them: the fewest on a path once around the loop that executes that
    many of our multiplies."""
    first, last = record_loop

    def counted(ins: Instruction) -> bool:
        return ins.opcode.split(".")[0] == multiply and is_ours(ins)

    around = path_cost(function, first, last, record_loop, counted, multiplies)
    return None if around is None else around + 1


def demangle(names: Sequence[str] | str):
    single = isinstance(names, str)
    batch = [names] if single else list(names)
    try:
        out = subprocess.run(["c++filt"], input="\n".join(batch), capture_output=True,
                             text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        out = batch
    return out[0] if single else out


def kernel_name(mangled: str) -> str:
    """A kernel's own name, from its Itanium-mangled one: the last component
    of its (nested) name, before any template arguments. Read without
    c++filt, so that the naming check cannot pass for want of a tool."""
    pos = 3 if mangled.startswith("_ZN") else 2 if mangled.startswith("_Z") else None
    if pos is None:
        return mangled
    name = mangled
    while (m := re.compile(r"\d+").match(mangled, pos)):
        length = int(m.group())
        name = mangled[m.end():m.end() + length]
        pos = m.end() + length
    return name


# Namespaces a short label leaves out.
_NAMESPACES = re.compile(r"at::native::grid_sampler_deterministic::|"
                         r"at::native::\(anonymous namespace\)::|detgrid::exact::|c10::")


def short_label(demangled: str) -> str:
    """A demangled kernel name without its namespaces, return type and
    parameter list: `sum_runs_kernel<ReduceSparse<float, int>, int, int>`."""
    label = _NAMESPACES.sub("", demangled)
    label = label[len("void "):] if label.startswith("void ") else label
    return label.split("(", 1)[0]


@dataclasses.dataclass
class ReduceCost:
    kernel: str  # short label
    per_record: LoopCost
    setup: Optional[int]
    registers: Optional[int] = None
    # A reduce that folds a group of channels at once: its group loop's
    # setup, and per record for some channel counts ({channels: cost}).
    group_setup: Optional[int] = None
    group_per_record: Optional[Dict[int, Optional[int]]] = None


# Channel counts whose per-record cost the audit prints for a group loop.
GROUP_CHANNELS = (3, 8, 16)


def group_loop(function: Function, multiply: str) -> Optional[Tuple[int, int]]:
    """The record loop of a reduce that folds several channels at once: of
    the innermost loops holding more than one of our multiplies (the
    compiler may peel a record out of it into the loop around), the one
    with the most."""
    def multiplies(loop):
        return sum(1 for ins in function.instructions[loop[0]:loop[1] + 1]
                   if ins.opcode.split(".")[0] == multiply and is_ours(ins))

    several = [loop for loop in set(loops(function)) if multiplies(loop) > 1]
    innermost = [loop for loop in several
                 if not any(other != loop and loop[0] <= other[0] and other[1] <= loop[1]
                            for other in several)]
    return max(innermost, key=lambda loop: (multiplies(loop), -loop[0]), default=None)


def reduce_loop_table(functions: Dict[str, Function],
                      resources: Optional[Dict[str, Resources]] = None) -> List[ReduceCost]:
    """Inner-loop and setup cost, and registers, of every reduce kernel of ours."""
    resources = resources or {}
    rows = []
    names = [n for n in functions if OUR_KERNEL.search(n) and kernel_name(n) in REDUCE_KERNELS]
    for name, readable in zip(names, demangle(names)):
        # fp64 kernels fold with DMUL/DADD, the others with FMUL/FADD.
        cost = (inner_loop_cost(functions[name], "FMUL", "FADD")
                or inner_loop_cost(functions[name], "DMUL", "DADD"))
        if cost is not None:
            r = resources.get(name)
            row = ReduceCost(short_label(readable), cost,
                             setup_cost(functions[name], cost.loop),
                             r.registers if r else None)
            multiply = "FMUL" if inner_loop_cost(functions[name], "FMUL", "FADD") else "DMUL"
            loop = group_loop(functions[name], multiply)
            if loop is not None:
                row.group_setup = setup_cost(functions[name], loop)
                row.group_per_record = {c: record_cost(functions[name], loop, c, multiply)
                                        for c in GROUP_CHANNELS}
            rows.append(row)
    return sorted(rows, key=lambda row: row.kernel)


def setup_violations(rows: Iterable[ReduceCost], limit: int = SETUP_LIMIT) -> List[str]:
    """2-D fp32 dense reduces whose setup exceeds `limit` (or is not found)."""
    return [f"setup={row.setup} > {limit}: {row.kernel}" for row in rows
            if DENSE_2D_FP32.search(row.kernel) and (row.setup is None or row.setup > limit)]


@dataclasses.dataclass
class ExactLoopCost:
    kernel: str  # short label
    stage: str  # one of EXACT_LOOP_STAGES
    registers: Optional[int]
    loop: Optional[LoopCost]  # per term (ScatterTerms) or per record; None: not found
    atomics: Optional[int]  # global integer atomic instructions in the loop


def exact_loop_cost(function: Function) -> Optional[Tuple[LoopCost, int]]:
    """The smallest loop holding a term's multiply (record_term's mul_rn,
    FMUL or DMUL): in a reduce the loop over one element's records, in
    ScatterTerms the grid-stride loop that calls the stage once per term.
    With the number of global atomics in it (static: the words a term may
    add, and the flag)."""
    for multiply in ("FMUL", "DMUL"):
        cost = smallest_loop_cost(
            function, lambda body: multiply in _our_opcodes(body, EXACT.sources))
        if cost is not None:
            first, last = cost.loop
            body = function.instructions[first:last + 1]
            return cost, sum(1 for ins in body if GLOBAL_ATOMIC.match(ins.opcode))
    return None


def exact_loop_table(functions: Dict[str, Function],
                     resources: Dict[str, Resources]) -> List[ExactLoopCost]:
    """Per-record cost of every exact reduce, per-term cost and atomics of
    every ScatterTerms."""
    stages = {name: m.group(1) for name in functions if (m := EXACT.kernel.search(name))}
    names = [name for name, stage in stages.items() if stage in EXACT_LOOP_STAGES]
    rows = []
    for name, readable in zip(names, demangle(names)):
        loop, atomics = exact_loop_cost(functions[name]) or (None, None)
        r = resources.get(name)
        rows.append(ExactLoopCost(short_label(readable), stages[name],
                                  r.registers if r else None, loop, atomics))
    return sorted(rows, key=lambda row: row.kernel)


@dataclasses.dataclass(frozen=True)
class MachineCode:
    """What a unit's cubin holds: benchmarks/machine_code.json's top-level keys (the core's)."""
    arch: str  # e.g. sm_90
    kernels: int  # `.text.<kernel>` sections, CUB's included
    text_bytes: int  # their sizes summed


def elf_text_sections(cubin: bytes) -> Dict[str, int]:
    """Bytes of each `.text.<mangled kernel>` section of a 64-bit
    little-endian ELF (a cubin), by kernel."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF file")
    (table,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i):  # (name offset, file offset, size)
        fields = struct.unpack_from("<IIQQQQ", cubin, table + i * entry_size)
        return fields[0], fields[4], fields[5]

    names_at = header(names_index)[1]
    sections = {}
    for i in range(count):
        name_offset, _, size = header(i)
        start = names_at + name_offset
        name = cubin[start:cubin.index(b"\0", start)].decode("ascii", "replace")
        if name.startswith(".text."):
            sections[name[len(".text."):]] = size
    return sections


def target_arch(sass: str) -> Optional[str]:
    """The `.target` of nvdisasm's output (sm_90)."""
    m = re.search(r"^\s*\.target\s+(sm_\w+)", sass, re.MULTILINE)
    return m.group(1) if m else None


def generic_kernels(sections: Iterable[str], unit: re.Pattern = OUR_KERNEL) -> List[str]:
    """The unit's kernels that are not one of its named stage kernels: a
    generic stage runner, or any other name that does not say its stage."""
    found = []
    for mangled in sorted(sections):
        if not unit.search(mangled) or CUB_KERNEL.search(mangled):
            continue  # CUB's
        name = kernel_name(mangled)
        if name in GENERIC_RUNNERS:
            found.append(f"{name} is a generic stage runner: {short_label(demangle(mangled))}")
        elif name not in STAGE_KERNELS:
            found.append(f"{name} is not one of the unit's named stage kernels "
                         f"(sass_audit.STAGE_KERNELS)")
    return found


def budget_violations(code: MachineCode, kernels: int = KERNEL_BUDGET,
                      text_bytes: int = TEXT_BUDGET) -> List[str]:
    found = []
    if code.kernels > kernels:
        found.append(f"{code.kernels} kernels > {kernels}")
    if code.text_bytes > text_bytes:
        found.append(f"{code.text_bytes / 2**20:.2f} MiB of .text > {text_bytes / 2**20:.2f} MiB")
    return found


def kernel_families(sections: Dict[str, int]) -> List[Tuple[str, int, int]]:
    """(kernel name, kernels, bytes) per name, largest first."""
    families: Dict[str, List[int]] = defaultdict(lambda: [0, 0])
    for mangled, size in sections.items():
        family = families[kernel_name(mangled)]
        family[0] += 1
        family[1] += size
    return sorted(((name, n, size) for name, (n, size) in families.items()),
                  key=lambda row: (-row[2], row[0]))


def print_machine_code(code: MachineCode, sections: Dict[str, int],
                       level: Optional[str] = None) -> None:
    print(f"machine code{f' ({level})' if level else ''}: {code.kernels} kernels, "
          f"{code.text_bytes / 2**20:.2f} MiB of "
          f"{code.arch} .text ({code.text_bytes} bytes; budget {KERNEL_BUDGET} kernels, "
          f"{TEXT_BUDGET / 2**20:.2f} MiB)")
    for name, count, size in kernel_families(sections):
        print(f"family {name}: {count} kernels, {size / 1024:.1f} KiB")


# ------------------------------------------------------------ the pipeline's levels (issue 41)


@dataclasses.dataclass
class LevelCode:
    """One prefix of the pipeline: the lines of its ATen files as cut and, when it was built,
    its unit's machine code."""
    level: str
    lines: int
    code: Optional[MachineCode] = None
    spills: Optional[int] = None  # kernels of ours with a stack frame or spills, if built
    reduces: Optional[List[dict]] = None  # its fp32 reduces' loop costs (fp32_reduce_record)


def fp32_reduce_record(rows: Iterable[ReduceCost]) -> List[dict]:
    """The fp32 reduce kernels' instructions per record (with a group loop, per record
    for a group of C channels), setup and registers: what a level's speed step
    changes in its inner loops, for NOTES' table per level."""
    return [{"kernel": row.kernel, "per_record": row.per_record.total, "setup": row.setup,
             "group_per_record": ({str(c): n for c, n in row.group_per_record.items()}
                                  if row.group_per_record is not None else None),
             "registers": row.registers}
            for row in rows if FP32_REDUCE.search(row.kernel)]


def _stack():
    from detgrid.kit import stack  # only here: the audit itself reads no kit sources

    return stack


def write_level_sources(kit_root, level: str, into) -> Tuple[Path, int]:
    """The pipeline's ATen files of the prefix ending at ``level``, as the stack cuts them
    (detgrid.kit.stack.kernel_sources), under ``into/LEVEL/``: (the include root to put
    before any other, ``into/LEVEL/aten/src``, and their lines)."""
    root = Path(into) / level
    lines = 0
    for rel, text in _stack().kernel_sources(kit_root, level).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        lines += len(text.splitlines())
    return root / "aten" / "src", lines


def level_lines(kit_root) -> Dict[str, int]:
    """Lines of each level's ATen files as cut, by level, in stack order."""
    stack = _stack()
    return {level: sum(len(text.splitlines())
                       for text in stack.kernel_sources(kit_root, level).values())
            for level in stack.LEVEL_NAMES}


def write_level_json(code: MachineCode, level: str, path: str, spills: int = 0,
                     reduces: Optional[List[dict]] = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"level": level, **dataclasses.asdict(code), "spills": spills,
                   "reduces": reduces or []}, f, indent=2)
        f.write("\n")


def read_level_jsons(folder) -> Dict[str, Tuple[MachineCode, int, List[dict]]]:
    """The measurements `--level-json` wrote into ``folder``, by level: (machine code, kernels
    of ours with a stack frame or spills, its fp32 reduces' loop costs)."""
    found = {}
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        found[str(data["level"])] = (MachineCode(str(data["arch"]), int(data["kernels"]),
                                                 int(data["text_bytes"])),
                                     int(data.get("spills", 0)),
                                     list(data.get("reduces", [])))
    return found


def level_budgets(top: str) -> Dict[str, LevelBudget]:
    """The pipeline's budgets by its levels' names: the whole pipeline's under ``top``."""
    return {top if key == TOP_LEVEL else key: budget for key, budget in LEVEL_BUDGETS.items()
            if key != CORE_LEVEL}


def _level_label(level: str, top: str) -> str:
    return f"whole pipeline ({level})" if level == top else level


def level_budget_findings(levels: Dict[str, LevelCode], top: str) -> List[str]:
    """Where the whole pipeline exceeds its budget (PIPELINE_BUDGET), or was not measured."""
    found = []
    for level, budget in level_budgets(top).items():
        label = _level_label(level, top)
        lv = levels.get(level)
        if lv is None:
            found.append(f"{label}: not measured")
            continue
        if budget.lines is not None and lv.lines > budget.lines:
            found.append(f"{label}: {lv.lines} lines > {budget.lines}")
        if lv.code is None:
            found.append(f"{label}: not built")
        else:
            found += [f"{label}: {problem}"
                      for problem in budget_violations(lv.code, budget.kernels, budget.text_bytes)]
    return found


def _budget_text(budget: LevelBudget) -> str:
    lines = f"{budget.lines} lines, " if budget.lines is not None else ""
    return f"{lines}{budget.kernels} kernels, {budget.text_bytes / 2**20:.2f} MiB"


def _code_text(code: MachineCode) -> str:
    return (f"{code.kernels} kernels, {code.text_bytes / 2**20:.2f} MiB of {code.arch} .text "
            f"({code.text_bytes} bytes)")


def print_levels(levels: Dict[str, LevelCode], top: str, findings: List[str], strict: bool,
                 core: Optional["CoreCode"] = None,
                 core_findings: Sequence[str] = (),
                 builds: Optional[Dict[str, "CoreCode"]] = None, top_build: Optional[str] = None,
                 stack_findings: Sequence[str] = ()) -> None:
    if core is not None:
        print(f"core (the upstream change): {core.lines} lines, {_code_text(core.code)}; "
              f"budget {_budget_text(CORE_BUDGET)}; {core.spilling_kernels} kernel(s) of its own "
              f"with a stack frame or spills, {len(core.cub_frames)} of CUB's with a stack frame")
        for finding in core_findings:
            print(f"OVER BUDGET (core, failed): {finding}")
        print("core budget: met" if not core_findings else
              f"core budget: OVER BUDGET, {len(core_findings)} finding(s); failed")
        if builds is not None and top_build is not None:
            print_core_builds(core, builds, top_build, stack_findings)
    print("pipeline levels: lines of each level's ATen files as the stack cuts them; kernels "
          "and sm_90 .text of its GridSamplerDeterministic.cu, CUB's included")
    budgets = level_budgets(top)
    for level, lv in levels.items():
        label = _level_label(level, top)
        if lv.code is None:
            built = "not built (.ci/sass_audit.sh --all-levels builds every level)"
        else:
            built = _code_text(lv.code)
        budget = f"; budget {_budget_text(budgets[level])}" if level in budgets else ""
        spills = (f"; {lv.spills} kernel(s) with a stack frame or spills" if lv.spills else "")
        print(f"level {label}: {lv.lines} lines, {built}{budget}{spills}")
    for finding in findings:
        print(f"over budget (pipeline): {finding}")
    if not findings:
        print("pipeline budget: met")
    else:
        consequence = "failed (--strict)" if strict else "reported, not failed (--strict fails on it)"
        print(f"pipeline budget: OVER BUDGET, {len(findings)} finding(s); {consequence}")


def levels_record(levels: Dict[str, LevelCode], top: str, findings: List[str],
                  core: "CoreCode", core_findings: Sequence[str] = (),
                  builds: Optional[Dict[str, "CoreCode"]] = None, top_build: Optional[str] = None,
                  stack_findings: Sequence[str] = ()) -> dict:
    """benchmarks/machine_code.json: the upstream change's (the core's) arch, kernels and
    text_bytes; under ``levels``, the core's record first (``core``: lines, arch, kernels,
    text_bytes, registers per kernel, kernels of its own with a stack frame or spills, CUB's
    frames, fused instructions per kernel family; what `detgrid report` cites), then each speed
    level's core build (``builds``, CoreCode.build_record: its lines, arch, kernels, text_bytes,
    run sums' registers, spilling kernels, CUB's frames), then every pipeline level's lines,
    kernels and text_bytes (null: not built); the budgets (``core``, ``whole_stack`` on
    ``top_build`` when builds are given, and ``whole_pipeline``) and whether they are met."""
    builds = builds or {}
    return {
        **dataclasses.asdict(core.code),
        "levels": {CORE_LEVEL: core.record(),
                   **{level: build.build_record() for level, build in builds.items()},
                   **{level: {"lines": lv.lines,
                              "kernels": lv.code.kernels if lv.code else None,
                              "text_bytes": lv.code.text_bytes if lv.code else None,
                              "spilling_kernels": lv.spills,
                              "fp32_reduces": lv.reduces}
                      for level, lv in levels.items()}},
        "budgets": {CORE_LEVEL: dataclasses.asdict(CORE_BUDGET),
                    **({"whole_stack": {"level": top_build, **dataclasses.asdict(STACK_BUDGET)}}
                       if top_build is not None else {}),
                    "whole_pipeline": {"level": top, **dataclasses.asdict(PIPELINE_BUDGET)}},
        "budget_met": not findings and not core_findings and not stack_findings,
        "over_budget": ([f"core: {finding}" for finding in core_findings] + list(stack_findings)
                        + list(findings)),
    }


def cut_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit cut",
        description="write the pipeline's levels' ATen files (as the stack cuts them) under "
        "INTO/LEVEL/, and print one line per level: LEVEL INCLUDE_ROOT LINES")
    parser.add_argument("--kit", help="the kit's root (holds aten_kernels/pipeline/)")
    parser.add_argument("--into", help="folder to write them under")
    parser.add_argument("--level", action="append", default=[],
                        help="a level (repeatable); default every level below the whole "
                        "pipeline")
    parser.add_argument("--top", action="store_true",
                        help="only print the whole pipeline's level name (the last level)")
    args = parser.parse_args(argv)
    stack = _stack()
    if args.top:
        print(stack.TOP)
        return 0
    if not (args.kit and args.into):
        parser.error("--kit and --into are required (or --top)")
    levels = args.level or list(stack.LEVEL_NAMES[:-1])
    try:
        for level in levels:
            stack.level_index(level)
        rows = [(level, *write_level_sources(args.kit, level, args.into)) for level in levels]
    except (stack.StackError, OSError, UnicodeDecodeError) as e:
        return _usage_error(f"cut: {e}")
    for level, include, lines in rows:
        print(f"{level} {include} {lines}")
    return 0


def cut_core_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit cut-core",
        description="write the core's file as each speed level's prefix of the upstream stack "
        "has it (detgrid.kit.stack.core_sources: the core with the levels' diffs applied) under "
        "INTO/LEVEL/, and print one line per level: LEVEL PATH_OF_ITS_.cu LINES")
    parser.add_argument("--kit", required=True, help="the kit's root (holds aten_kernels/)")
    parser.add_argument("--into", required=True, help="folder to write them under")
    parser.add_argument("--level", action="append", default=[],
                        help="a speed level (repeatable); default every speed level of "
                        "detgrid.levels.CORE_BUILDS")
    args = parser.parse_args(argv)
    speed_levels = _core_builds()[1:]
    levels = args.level or list(speed_levels)
    unknown = [level for level in levels if level not in speed_levels]
    if unknown:
        return _usage_error(f"cut-core: {', '.join(map(repr, unknown))} is not a speed level "
                            f"of the upstream stack ({', '.join(speed_levels) or 'none'})")
    rows = []
    try:
        for level in levels:
            unit = None
            for rel, text in _stack().core_sources(args.kit, level).items():
                path = Path(args.into) / level / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                if rel.endswith("/GridSamplerDeterministic.cu"):
                    unit = (path, len(text.splitlines()))
            if unit is None:
                return _usage_error(f"cut-core: {level}: no GridSamplerDeterministic.cu")
            rows.append((level, *unit))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return _usage_error(f"cut-core: {e}")
    for level, path, lines in rows:
        print(f"{level} {path} {lines}")
    return 0


def levels_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit levels",
        description="the core's machine code against its budget and the top core build's "
        "against the whole stack's (failed past them), the core builds side by side (lines, "
        "kernels, .text, the run sums' registers), and every pipeline level's lines and the "
        "built levels' machine code against the whole pipeline's budget (reported, not "
        "failed, without --strict)")
    parser.add_argument("--kit", required=True, help="the kit's root (holds aten_kernels/)")
    parser.add_argument("--core", required=True, metavar="PATH",
                        help="the core's measurement (`core --json`)")
    parser.add_argument("--core-build", action="append", default=[], metavar="PATH",
                        help="a speed level's core build's measurement (`core --level LEVEL "
                        "--json`; repeatable): every speed level of detgrid.levels.CORE_BUILDS "
                        "once, the top one against the whole stack's budget (failed past it)")
    parser.add_argument("--measured", required=True, metavar="DIR",
                        help="the --level-json files of the pipeline's levels built (the whole "
                        "pipeline at least)")
    parser.add_argument("--machine-code-json", metavar="PATH",
                        help="write the core's count and every level's there "
                        "(benchmarks/machine_code.json)")
    parser.add_argument("--strict", action="store_true",
                        help="fail when the whole pipeline is over its budget")
    args = parser.parse_args(argv)
    stack = _stack()
    try:
        lines = level_lines(args.kit)
        measured = read_level_jsons(args.measured)
    except (stack.StackError, OSError, UnicodeDecodeError) as e:
        return _usage_error(f"levels: {e}")
    except (ValueError, KeyError, TypeError) as e:
        return _usage_error(f"levels: not a --level-json file in {args.measured} "
                            f"({type(e).__name__}: {e})")
    try:
        core = read_core_json(args.core)
    except (OSError, UnicodeDecodeError) as e:
        return _usage_error(f"levels: cannot read {args.core}: {e.strerror or e}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return _usage_error(f"levels: {args.core}: not a `core --json` file "
                            f"({type(e).__name__}: {e})")
    if core.level != CORE_LEVEL:
        return _usage_error(f"levels: {args.core}: the core build of {core.level}, not the "
                            "core's (give it as --core-build)")
    core_builds = _core_builds()
    measured_builds: Dict[str, CoreCode] = {}
    for path in args.core_build:
        try:
            build = read_core_json(path)
        except (OSError, UnicodeDecodeError) as e:
            return _usage_error(f"levels: cannot read {path}: {e.strerror or e}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return _usage_error(f"levels: {path}: not a `core --level --json` file "
                                f"({type(e).__name__}: {e})")
        if build.level not in core_builds[1:] or build.level in measured_builds:
            return _usage_error(f"levels: {path}: core build {build.level!r} is "
                                + ("measured twice" if build.level in measured_builds else
                                   f"not a speed level's (those are "
                                   f"{', '.join(core_builds[1:]) or 'none'})"))
        measured_builds[build.level] = build
    unknown = sorted(set(measured) - set(lines))
    missing = [level for level in (stack.TOP,) if level not in measured]
    missing_builds = [level for level in core_builds[1:] if level not in measured_builds]
    if unknown or missing or missing_builds:
        pipeline = "; ".join(([f"no level {', '.join(unknown)}"] if unknown else [])
                             + ([f"no measurement of {', '.join(missing)}"] if missing else []))
        return _usage_error("levels: " + "; ".join(
            ([f"{args.measured}: {pipeline}"] if pipeline else [])
            + ([f"no --core-build of {', '.join(missing_builds)}"] if missing_builds else [])))
    levels = {level: LevelCode(level, n, *measured.get(level, (None, None, None)))
              for level, n in lines.items()}
    findings = level_budget_findings(levels, stack.TOP)
    core_findings = core_budget_violations(core)
    builds = {level: measured_builds[level] for level in core_builds[1:]}
    top_build = core_builds[-1]
    stack_findings = stack_budget_findings({CORE_LEVEL: core, **builds}, top_build)
    print_levels(levels, stack.TOP, findings, args.strict, core, core_findings, builds,
                 top_build, stack_findings)
    if args.machine_code_json:
        with open(args.machine_code_json, "w", encoding="utf-8") as f:
            json.dump(levels_record(levels, stack.TOP, findings, core, core_findings, builds,
                                    top_build, stack_findings), f, indent=2)
            f.write("\n")
    return 1 if core_findings or stack_findings or (findings and args.strict) else 0


# ------------------------------------------------------------------- the upstream core


@dataclasses.dataclass
class CoreCode:
    """The upstream core's unit: its lines of new ATen code, its machine code, its own
    kernels' registers (by short label) and how many of them have a stack frame or spills,
    CUB's kernels with a stack frame, and its fused instructions per kernel family."""
    lines: int
    code: MachineCode
    registers: Dict[str, int]
    spilling_kernels: int
    cub_frames: List[dict]
    fused: Dict[str, dict]
    # Which core build (detgrid.levels.CORE_BUILDS) this is: the core, or the prefix of the
    # upstream stack ending at a speed level, whose lines are those of the core's file as that
    # prefix has it.
    level: str = CORE_LEVEL

    def record(self) -> dict:
        """The core's entry of benchmarks/machine_code.json (and what `core --json` writes); a
        speed level's build's names its level first."""
        return {**({"level": self.level} if self.level != CORE_LEVEL else {}),
                "lines": self.lines, **dataclasses.asdict(self.code),
                "registers": self.registers, "spilling_kernels": self.spilling_kernels,
                "cub_frames": self.cub_frames, "fused": self.fused}

    def run_sum_registers(self) -> Dict[str, int]:
        """Registers of its run sums (RUN_SUM_KERNELS), by short label."""
        return {label: n for label, n in self.registers.items()
                if label.split("<", 1)[0] in RUN_SUM_KERNELS}

    def build_record(self) -> dict:
        """A speed level's core build's entry of benchmarks/machine_code.json: the lines of the
        core's file as its prefix of the stack has it, its machine code, its run sums'
        registers, its own kernels with a stack frame or spills and CUB's frames."""
        return {"lines": self.lines, **dataclasses.asdict(self.code),
                "run_sum_registers": self.run_sum_registers(),
                "spilling_kernels": self.spilling_kernels, "cub_frames": self.cub_frames}


def read_core_json(path) -> CoreCode:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return CoreCode(int(data["lines"]),
                    MachineCode(str(data["arch"]), int(data["kernels"]), int(data["text_bytes"])),
                    {str(k): int(v) for k, v in data["registers"].items()},
                    int(data["spilling_kernels"]), list(data["cub_frames"]),
                    dict(data["fused"]), str(data.get("level", CORE_LEVEL)))


def core_budget_violations(core: CoreCode, budget: LevelBudget = CORE_BUDGET) -> List[str]:
    """Where the core exceeds its budget: lines of new ATen code, kernels, `.text`."""
    found = []
    if budget.lines is not None and core.lines > budget.lines:
        found.append(f"{core.lines} lines > {budget.lines}")
    return found + budget_violations(core.code, budget.kernels, budget.text_bytes)


def core_lines(kit_root, upto: str = CORE_LEVEL) -> int:
    """Lines of the files the upstream core adds (detgrid.kit.stack.core_sources), as the prefix
    of the stack ending at ``upto`` has them."""
    return sum(len(text.splitlines())
               for text in _stack().core_sources(kit_root, upto).values())


def _core_builds() -> Tuple[str, ...]:
    """detgrid.levels.CORE_BUILDS: the core, then each prefix of the upstream stack that ends
    at a speed level, named by that level."""
    from detgrid import levels  # only here, as _stack

    return tuple(levels.CORE_BUILDS)


# What a core build's failures past a budget print under.
CORE_BUDGET_KIND = "the core's budget"
STACK_BUDGET_KIND = "the whole stack's budget"


def core_build_budgets(level: str, builds: Sequence[str]) -> List[Tuple[str, LevelBudget]]:
    """The budgets the core build ``level`` answers to, by the kind its failures print under:
    the core's (CORE_BUDGET) on the core (``builds[0]``), the whole stack's (STACK_BUDGET) on
    the top core build (``builds[-1]``); a build between them answers to none."""
    found = []
    if level == builds[0]:
        found.append((CORE_BUDGET_KIND, CORE_BUDGET))
    if level == builds[-1]:
        found.append((STACK_BUDGET_KIND, STACK_BUDGET))
    return found


def stack_budget_findings(builds: Dict[str, CoreCode], top: str) -> List[str]:
    """Where the top core build ``top`` (the whole upstream stack) exceeds STACK_BUDGET, or
    was not measured."""
    label = f"whole stack ({top})"
    if top not in builds:
        return [f"{label}: not measured"]
    return [f"{label}: {problem}" for problem in core_budget_violations(builds[top], STACK_BUDGET)]


def run_sum_register_rows(builds: Dict[str, CoreCode]) -> List[Tuple[str, List[Optional[int]]]]:
    """Per run-sum kernel (label), its registers in each build, in ``builds``' order (None:
    not in that build)."""
    labels = sorted({label for build in builds.values() for label in build.run_sum_registers()})
    return [(label, [build.run_sum_registers().get(label) for build in builds.values()])
            for label in labels]


def print_core_builds(core: CoreCode, builds: Dict[str, CoreCode], top: str,
                      stack_findings: Sequence[str]) -> None:
    """Each speed level's core build against the whole stack's budget, then the core and the
    builds side by side: kernels, .text and the run sums' registers."""
    for level, build in builds.items():
        budget = (f"; the whole stack's budget {_budget_text(STACK_BUDGET)}" if level == top
                  else "")
        print(f"core build {level} (the core's file as the stack up to {level} has it): "
              f"{build.lines} lines, {_code_text(build.code)}{budget}; "
              f"{build.spilling_kernels} kernel(s) of its own with a stack frame or spills, "
              f"{len(build.cub_frames)} of CUB's with a stack frame")
    for finding in stack_findings:
        print(f"OVER BUDGET (whole stack, failed): {finding}")
    print(f"whole stack budget ({top}): met" if not stack_findings else
          f"whole stack budget ({top}): OVER BUDGET, {len(stack_findings)} finding(s); failed")
    every = {CORE_LEVEL: core, **builds}
    print(f"core builds side by side: {' | '.join(every)}")
    print(f"  lines: {' | '.join(str(b.lines) for b in every.values())}")
    print(f"  kernels: {' | '.join(str(b.code.kernels) for b in every.values())}")
    print(f"  .text bytes: {' | '.join(str(b.code.text_bytes) for b in every.values())}")
    print("  run sums' registers (ptxas -v):")
    for label, registers in run_sum_register_rows(every):
        print(f"  {label}: " + " | ".join("-" if n is None else str(n) for n in registers))


def _is_core_kernel(name: str) -> bool:
    return bool(CORE_SCOPE.kernel.search(name)) and not CUB_KERNEL.search(name)


def cub_label(mangled: str, readable: str) -> str:
    """A CUB kernel's name with its policy's key and value types when it has them:
    ``DeviceUniqueByKeySweepKernel<long, int>``."""
    m = re.search(r"policy_hub<([^<>]*)>", readable)
    return f"{kernel_name(mangled)}<{m.group(1)}>" if m else kernel_name(mangled)


def unit_cub_frames(resources: Dict[str, Resources]) -> List[dict]:
    """Every CUB kernel of the unit with a stack frame or spills: its label and sizes."""
    names = [name for name, r in sorted(resources.items()) if CUB_KERNEL.search(name) and r.spills]
    return [{"kernel": cub_label(name, readable), "stack_frame": resources[name].stack_frame,
             "spill_stores": resources[name].spill_stores,
             "spill_loads": resources[name].spill_loads}
            for name, readable in zip(names, demangle(names))]


def fused_by_family(functions: Dict[str, Function]) -> Dict[str, dict]:
    """Per kernel family of the core's own kernels (kernel_name): its kernels, its fused
    instructions by opcode (FFMA, DFMA, HFMA2; the -RZ, RZ constant idiom left out) and by
    where each comes from: the base name of its innermost source file, "subroutines" for a
    compiler-emitted subroutine (a division's or fmod's slow path), "unknown" without line
    info. Counted, not failed: the core contracts by design."""
    families: Dict[str, dict] = {}
    for name, function in sorted(functions.items()):
        if not _is_core_kernel(name):
            continue
        family = families.setdefault(kernel_name(name), {"kernels": 0, "FFMA": 0, "DFMA": 0,
                                                         "HFMA2": 0, "by_source": {}})
        family["kernels"] += 1
        for ins in function.instructions:
            m = FUSED.match(ins.opcode)
            if not m or CONSTANT_IDIOM.search(ins.operands):
                continue
            family[m.group(1)] += 1
            where = ("subroutines" if ins.in_subroutine else "unknown" if ins.source is None
                     else ins.source[0].rsplit("/", 1)[-1])
            family["by_source"][where] = family["by_source"].get(where, 0) + 1
    for family in families.values():
        family["by_source"] = dict(sorted(family["by_source"].items(),
                                          key=lambda item: (-item[1], item[0])))
    return dict(sorted(families.items()))


def core_kernel_rows(resources: Dict[str, Resources], sections: Dict[str, int]
                     ) -> List[Tuple[bool, str, Resources, Optional[int]]]:
    """(the core's own?, label, resources, bytes of .text) of every kernel of the unit, the
    core's own first (by label), then CUB's."""
    names = sorted(set(resources) | set(sections))
    rows = []
    for name, readable in zip(names, demangle(names)):
        label = (short_label(readable) if _is_core_kernel(name)
                 else cub_label(name, readable) if CUB_KERNEL.search(name) else kernel_name(name))
        rows.append((_is_core_kernel(name), label, resources.get(name, Resources()),
                     sections.get(name)))
    return sorted(rows, key=lambda row: (not row[0], row[1]))


def print_core(core: CoreCode, sections: Dict[str, int],
               rows: List[Tuple[bool, str, Resources, Optional[int]]],
               budgets: Sequence[Tuple[str, LevelBudget]] = ((CORE_BUDGET_KIND, CORE_BUDGET),)
               ) -> None:
    what = ("lines of new ATen code" if core.level == CORE_LEVEL
            else f"lines of the core's file as the stack up to {core.level} has it")
    budget = "; ".join(("budget " if kind == CORE_BUDGET_KIND else "the whole stack's budget ")
                       + _budget_text(b) for kind, b in budgets) or "no budget of its own"
    print(f"machine code ({core.level}): {core.lines} {what}, {_code_text(core.code)}; {budget}")
    for name, count, size in kernel_families(sections):
        print(f"family {name}: {count} kernels, {size / 1024:.1f} KiB")
    for _, label, r, size in rows:
        text = "?" if size is None else size
        print(f"kernel {label}: regs={r.registers} frame={r.stack_frame} B "
              f"spills={r.spill_stores}/{r.spill_loads} B text={text} B")
    for name, family in core.fused.items():
        sources = ", ".join(f"{where} {n}" for where, n in family["by_source"].items()) or "none"
        print(f"fused family {name} ({family['kernels']} kernels): FFMA={family['FFMA']} "
              f"DFMA={family['DFMA']} HFMA2={family['HFMA2']} (by design, not failed; by "
              f"source: {sources})")


def core_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit core",
        description="audit a build of the upstream core's GridSamplerDeterministic.cu (with "
        "--level, a speed level's core build): no stack frame or spill in its kernels, no "
        "flush to zero, its budget (the top core build's: the whole stack's); print its "
        "kernels' registers and its fused instructions per kernel family (reported, not "
        "failed)")
    parser.add_argument("--ptxas-log", required=True, help="output of nvcc -Xptxas -v")
    parser.add_argument("--sass", required=True, help="output of nvdisasm -c -g -gi")
    parser.add_argument("--cubin", required=True, metavar="PATH", help="the unit's cubin")
    parser.add_argument("--kit", required=True,
                        help="the kit's root, whose core's lines are counted")
    parser.add_argument("--json", metavar="PATH", help="write the core's record there, for "
                        "`levels --core` (with --level, for `levels --core-build`)")
    parser.add_argument("--level", default=CORE_LEVEL, metavar="NAME",
                        help="the core build this is (detgrid.levels.CORE_BUILDS): the core "
                        "(default), or a speed level: the core's file as the prefix of the "
                        "upstream stack ending at it has it (`cut-core` writes it), audited by "
                        "the same rules; the top one against the whole stack's budget")
    args = parser.parse_args(argv)
    builds = _core_builds()
    if args.level not in builds:
        return _usage_error(f"unknown core build {args.level!r}; the core builds are "
                            f"{', '.join(builds)}")
    try:
        with open(args.ptxas_log, encoding="utf-8") as f:
            resources = parse_ptxas(f.read())
        with open(args.sass, encoding="utf-8") as f:
            sass = f.read()
        with open(args.cubin, "rb") as f:
            sections = elf_text_sections(f.read())
    except (OSError, UnicodeDecodeError) as e:
        return _usage_error(f"cannot read {e.filename or 'an input'}: {e.strerror or e}")
    except (ValueError, struct.error) as e:
        return _usage_error(f"{args.cubin}: not a cubin ({e})")
    try:
        lines = core_lines(args.kit, args.level)
    except (OSError, UnicodeDecodeError) as e:
        return _usage_error(f"cannot read {e.filename or 'an input'}: {e.strerror or e}")
    except ValueError as e:  # a level's diff that does not apply to the core's file
        return _usage_error(f"{args.level}: {e}")
    functions = parse_sass(sass)
    ours = [n for n in functions if _is_core_kernel(n)]
    if not ours:
        return _usage_error("no kernel of the core in the SASS (was it built with -lineinfo?)")
    spills = resource_violations(resources, (), CORE_SCOPE)
    core = CoreCode(lines, MachineCode(target_arch(sass) or "unknown", len(sections),
                                       sum(sections.values())),
                    {}, len(spills), unit_cub_frames(resources), fused_by_family(functions),
                    args.level)
    rows = core_kernel_rows(resources, sections)
    core.registers = {label: r.registers for own, label, r, _ in rows if own}
    budgets = core_build_budgets(args.level, builds)
    problems = {
        "stack frames or spills": spills,
        "flush-to-zero arithmetic": ftz_violations(functions, CORE_SCOPE),
        **{kind: core_budget_violations(core, budget) for kind, budget in budgets},
    }
    reported = [f"{frame['kernel']}: {frame['stack_frame']} B stack frame, "
                f"{frame['spill_stores']} B spill stores, {frame['spill_loads']} B spill loads"
                for frame in core.cub_frames]
    for kind, found in problems.items():
        for problem in found:
            print(f"FAIL ({kind}, {args.level}): {problem}")
    for problem in reported:
        print(f"REPORTED, not failed (CUB's stack frames, {args.level}): {problem}")
    print_core(core, sections, rows, budgets)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(core.record(), f, indent=2)
            f.write("\n")
    failed = sum(map(len, problems.values()))
    fused = {op: sum(family[op] for family in core.fused.values())
             for op in ("FFMA", "DFMA", "HFMA2")}
    print(f"sass audit ({args.level}): {len(ours)} kernels of its own, "
          f"{sum(len(functions[n].instructions) for n in ours)} instructions, "
          f"{' '.join(f'{op}={n}' for op, n in fused.items())} (reported); {failed} problem(s)"
          + (f", {len(reported)} reported, not failed" if reported else ""))
    return 1 if failed else 0


def print_reduce_loops(reduces: Iterable[ReduceCost]) -> None:
    print("reduce kernels: setup=instructions per element (run) before its fold, "
          "per-record=inner loop body + callees (calls), group-setup and "
          "group-per-record=C:N (a group of C channels) of a reduce that folds "
          "channels in groups, regs=registers")
    for row in reduces:
        setup = "?" if row.setup is None else row.setup
        cost = row.per_record
        group = ""
        if row.group_per_record is not None:
            per_channels = ",".join(f"{c}:{'?' if n is None else n}"
                                    for c, n in row.group_per_record.items())
            group = f" group-setup={row.group_setup} group-per-record={per_channels}"
        print(f"setup={setup} per-record={cost.total} ({cost.calls} calls){group} "
              f"regs={row.registers}  {row.kernel}")


def print_exact_loops(rows: Iterable[ExactLoopCost]) -> None:
    print("exact kernels: per-record=the reduce's loop over an element's records, "
          "per-term=ScatterTerms' loop over terms (body + callees, calls), "
          "atomics=global integer atomics in it, regs=registers")
    for row in rows:
        unit = "per-term" if row.stage == "ScatterTerms" else "per-record"
        cost = "? (no loop found)" if row.loop is None else (
            f"{row.loop.total} ({row.loop.calls} calls)")
        atomics = f" atomics={row.atomics}" if row.stage == "ScatterTerms" else ""
        print(f"{unit}={cost}{atomics} regs={row.registers}  {row.kernel}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["cut"]:
        return cut_main(argv[1:])
    if argv[:1] == ["cut-core"]:
        return cut_core_main(argv[1:])
    if argv[:1] == ["levels"]:
        return levels_main(argv[1:])
    if argv[:1] == ["core"]:
        return core_main(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="subcommands: `core` (a core build: the upstream core's, or with --level a speed "
        "level's), `cut-core` (a speed level's core file), `cut` (a pipeline level's ATen "
        "files), `levels` (the budgets, benchmarks/machine_code.json); "
        "each takes --help")
    parser.add_argument("--ptxas-log", required=True, help="output of nvcc -Xptxas -v")
    parser.add_argument("--sass", required=True, help="output of nvdisasm -c -g -gi")
    parser.add_argument("--allow-spills", action="append", default=[], metavar="REGEX",
                        help="demangled kernel names allowed a stack frame or spills")
    parser.add_argument("--loops", action="store_true",
                        help="print the reduce kernels' inner-loop instruction counts "
                        "(with --exact: the exact reduces' per record, ScatterTerms' per term)")
    parser.add_argument("--exact", action="store_true",
                        help="audit the exact accumulation's kernels (an ExactCuda.cu build)")
    parser.add_argument("--grid-gradient", action="store_true",
                        help="audit the grad_grid kernels (a GridGradient.cu build)")
    parser.add_argument("--cubin", metavar="PATH",
                        help="the cubin of GridSamplerDeterministic.cu alone: check its kernel "
                        "names and its budget, print its kernels and .text by kernel name")
    parser.add_argument("--level", metavar="NAME",
                        help="with --cubin: the pipeline's level this build is (printed)")
    parser.add_argument("--report-spills", action="store_true",
                        help="print stack frames and spills as findings reported, not failed "
                        "(a level below the whole pipeline, until its spills are fixed)")
    parser.add_argument("--level-json", metavar="PATH",
                        help="with --cubin and --level: write its arch, kernels and text_bytes "
                        "there, for `levels`")
    args = parser.parse_args(argv)
    if args.cubin and (args.exact or args.grid_gradient):
        return _usage_error("--cubin is the upstream unit's budget, not the extension's "
                            "(drop --exact or --grid-gradient)")
    if args.grid_gradient and (args.exact or args.loops):
        return _usage_error("--grid-gradient audits its build alone, with no loop table "
                            "(drop --exact and --loops)")
    if (args.level or args.level_json) and not args.cubin:
        return _usage_error("--level and --level-json need --cubin")
    if args.level_json and not args.level:
        return _usage_error("--level-json needs --level")
    try:
        with open(args.ptxas_log, encoding="utf-8") as f:
            resources = parse_ptxas(f.read())
        with open(args.sass, encoding="utf-8") as f:
            sass = f.read()
        functions = parse_sass(sass)
        if args.cubin:
            with open(args.cubin, "rb") as f:
                sections = elf_text_sections(f.read())
    except (OSError, UnicodeDecodeError) as e:
        return _usage_error(f"cannot read {e.filename or 'an input'}: {e.strerror or e}")
    except (ValueError, struct.error) as e:
        return _usage_error(f"{args.cubin}: not a cubin ({e})")
    scope = EXACT if args.exact else GRID_GRADIENT if args.grid_gradient else PIPELINE
    kind = "exact " if args.exact else "grad_grid " if args.grid_gradient else ""
    ours = [n for n in functions if scope.kernel.search(n)]
    if not ours:
        return _usage_error(f"no detgrid {kind}kernel in the SASS "
                            "(was it built with -lineinfo?)")
    problems = {
        "stack frames or spills": resource_violations(resources, args.allow_spills, scope),
        "fused multiply-add in detgrid's arithmetic": fused_violations(
            functions, SourceLines(), scope),
        "flush-to-zero arithmetic": ftz_violations(functions, scope),
    }
    if scope is PIPELINE:
        reduces = reduce_loop_table(functions, resources)
        problems["2-D fp32 dense reduce setup"] = setup_violations(reduces)
    if args.cubin:
        code = MachineCode(target_arch(sass) or "unknown", len(sections), sum(sections.values()))
        problems["kernel not named after its stage"] = generic_kernels(sections)
        problems["machine-code budget"] = budget_violations(code)
    reported = {"CUB's scan of a term of ours": cub_frames(resources, scope)}
    if args.report_spills:
        reported["stack frames or spills"] = problems.pop("stack frames or spills")
    for kind, found in problems.items():
        for problem in found:
            print(f"FAIL ({kind}): {problem}")
    for kind, found in reported.items():
        for problem in found:
            print(f"REPORTED, not failed ({kind}{f', {args.level}' if args.level else ''}): "
                  f"{problem}")
    if args.cubin:
        print_machine_code(code, sections, args.level)
        if args.level_json:
            spills = resource_violations(resources, args.allow_spills, scope)
            write_level_json(code, args.level, args.level_json, len(spills),
                             fp32_reduce_record(reduces))
    if args.loops:
        if args.exact:
            print_exact_loops(exact_loop_table(functions, resources))
        else:
            print_reduce_loops(reduces)
    failed = sum(map(len, problems.values()))
    noted = sum(map(len, reported.values()))
    print(f"sass audit: {len(ours)} detgrid {'extension ' if scope is not PIPELINE else ''}kernels, "
          f"{sum(len(functions[n].instructions) for n in ours)} instructions; "
          f"{failed} problem(s)" + (f", {noted} reported, not failed" if noted else ""))
    return 1 if failed else 0


def _usage_error(message: str) -> int:
    print(f"sass audit: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
