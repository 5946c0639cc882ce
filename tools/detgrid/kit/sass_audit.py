"""Audits of detgrid's compiled CUDA kernels, read from the machine code.

Each unit is audited from an sm_90 build's compiler output alone (`ptxas -v`,
`nvdisasm -c -g -gi`, the cubin), so that CI runs it without a GPU.

`core`: a build of the upstream core's file
(aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu), or with
--level a speed level's build of it (detgrid.levels.CORE_BUILDS: the core's
file as the prefix of the upstream stack ending at that level has it, which
`cut-core` writes); what is its own is CORE_SCOPE. The core computes the
existing kernel's terms with nvcc's contraction of ``a*b+c``, by design, so
its fused multiply-adds are counted and reported per kernel family, not
failed, but for its run sums (RUN_SUM_KERNELS), which add each term with its
product rounded, as the existing kernel's atomicAdd does. A build fails on: a
stack frame or spill in a kernel of its own (CUB's kernels' frames are
reported, not failed), a fused multiply-add in its run sums, a `.FTZ` form of
FADD, FMUL, FFMA or FMNMX in its arithmetic or the ATen helpers it inlines,
and its budget: the
core's (CORE_BUDGET: kernels, CUB's included, bytes of sm_90 `.text`, and
lines of new ATen code) on the core, the whole upstream stack's (STACK_BUDGET:
kernels and `.text`; the lines are the core's alone) on the top build, the
last speed level's. It prints every kernel's registers and writes the build's
record.

`builds`: the core builds side by side (lines, kernels, `.text`, and the
registers of each run-sum kernel, RUN_SUM_KERNELS: what a speed level costs),
the two budgets again, and benchmarks/machine_code.json (its one writer): the
core's arch, kernels and text_bytes at the top (what `detgrid report` cites),
each build's record under ``levels``, the budgets and whether they are met.

`grid-gradient`: a build of the extension's grad_grid
(aten_kernels/extension/GridGradient.cu), built as setup.py builds it
(-fmad=false), so that every operation is rounded on its own, as in its host
build (GRID_GRADIENT). It fails on a stack frame or spill, on flush to zero,
and on a fused multiply-add (FFMA, DFMA, HFMA2) in its arithmetic. The only
fused operations allowed are those the compiler expands a correctly rounded
division into (a source line calling __fdiv_rn / __ddiv_rn), an explicit
fused multiply-add (__fma_rn: one rounding, as the host's std::fma) and those
inside CUDA's own math headers (fmod), also where the compiler gives fmod's
expansion the preceding line of ours: a fused instruction counts as ours only
on a line with a multiplication. HFMA2 with a -RZ, RZ operand pair only
materialises a constant and is not arithmetic.
"""

import argparse
import dataclasses
import json
import re
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class Scope:
    """The kernels an audit calls ours (a regex on mangled names) and the
    source files whose instructions it calls ours."""
    kernel: re.Pattern
    sources: Tuple[str, ...]


# CUB's kernels, named by CUB (at_cuda_detail is the namespace torch wraps CUB in).
CUB_KERNEL = re.compile(r"^_ZN\d+at_cuda_detail3cub")
# The upstream core: its kernels are those of its file's anonymous namespace (and
# CUB's kernels that take a type of it, told apart by CUB_KERNEL); its arithmetic
# is its own file's and that of the existing kernel's helpers it inlines (ATen's
# GridSampler.cuh, UpSample.cuh), where the audit looks for flush-to-zero forms.
CORE_SOURCES = ("GridSamplerDeterministic.cu", "GridSampler.cuh", "UpSample.cuh")
CORE_SCOPE = Scope(re.compile(r"GridSamplerDeterministic_cu"), CORE_SOURCES)
# The extension's grad_grid: the kernels of GridGradient.cu; its arithmetic is
# its own file's and that of the existing helpers it inlines.
GRID_GRADIENT = Scope(re.compile(r"grid_sampler_[23]d_grid_gradient_kernel"),
                      ("GridGradient.cu", "GridSampler.cuh", "UpSample.cuh"))


@dataclasses.dataclass(frozen=True)
class Budget:
    """A unit's budget: kernels (CUB's included) and bytes of sm_90 `.text` of its
    GridSamplerDeterministic.cu, and lines of it (None: no line budget)."""
    kernels: int
    text_bytes: int
    lines: Optional[int] = None


# The upstream core's budget (issue 41, with the core rebuilt as one file). The 700 lines:
# issue 41's 600 predate tricubic (5-D bicubic, the mode torch 2.15 added), which the core
# now serves in 99 lines of its own; the kernels and `.text` are issue 41's, unchanged.
CORE_LEVEL = "core"  # detgrid.levels.CORE, the first core build
CORE_BUDGET = Budget(40, 1 * 2**20, 700)
# The whole upstream stack's budget (issue 60: "<= 100 kernels and 1.6 MiB"), on the top
# core build (detgrid.levels.CORE_BUILDS[-1]: the core's file with every speed level's diff).
STACK_BUDGET = Budget(100, int(1.6 * 2**20))
# The core's run sums (its reduce kernels), whose registers `builds` sets side by side: what a
# speed level of the stack costs in registers (issue 60, item 6).
RUN_SUM_KERNELS = ("sum_runs_kernel", "sum_run_partials_kernel")

# Source lines whose fused instructions are one correctly rounded operation
# each: a division's expansion, or an explicit fused multiply-add.
ROUNDED_INTRINSICS = ("__fdiv_rn", "__ddiv_rn", "__fma_rn")
FUSED = re.compile(r"^(FFMA|DFMA|HFMA2)(\.|$)")
FTZ_ARITHMETIC = re.compile(r"^(FADD|FMUL|FFMA|FMNMX|FADD32I|FMUL32I|FFMA32I)\b.*\.FTZ")
CONSTANT_IDIOM = re.compile(r"-RZ,\s*RZ")


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
    opcode: str
    operands: str
    source: Optional[Tuple[str, int]]  # innermost (file, line), if known
    # In a subroutine the compiler emitted (the `$__internal_...` slow paths
    # of division and fmod, reached by CALL): library code, not ours.
    in_subroutine: bool = False


@dataclasses.dataclass
class Function:
    name: str
    instructions: List[Instruction]


def parse_ptxas(text: str) -> Dict[str, Resources]:
    """Per mangled kernel name, the resources `ptxas -v` reports."""
    resources: Dict[str, Resources] = {}
    current: Optional[Resources] = None
    for line in text.splitlines():
        m = (re.search(r"Function properties for (\S+)", line)
             or re.search(r"Compiling entry function '([^']+)'", line))
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
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+|\$[\w$.]+):")


def parse_sass(text: str) -> Dict[str, Function]:
    """Functions of `nvdisasm -c -g -gi` output, with each instruction's
    innermost source location."""
    functions: Dict[str, Function] = {}
    current: Optional[Function] = None
    source: Optional[Tuple[str, int]] = None
    # A location is a block of //## lines, innermost frame first, each
    # further line the call site it was inlined at.
    in_location_block = False
    in_subroutine = False
    for line in text.splitlines():
        m = _FUNCTION.match(line.strip())
        if m:
            current = functions.setdefault(m.group(1), Function(m.group(1), []))
            source, in_location_block, in_subroutine = None, False, False
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
            in_subroutine = in_subroutine or m.group(1).startswith("$")
            continue
        m = _INSTRUCTION.search(line)
        if m:
            current.instructions.append(Instruction(m.group(1), m.group(2).strip(), source,
                                                    in_subroutine))
            if m.group(1).startswith("RET"):
                in_subroutine = False
    return functions


def is_ours(ins: Instruction, scope: Scope) -> bool:
    """Whether the instruction is the scope's own code: innermost source line
    in its files, outside compiler-emitted subroutines."""
    return (not ins.in_subroutine and ins.source is not None
            and ins.source[0].endswith(scope.sources))


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
                     scope: Scope) -> List[str]:
    found = []
    for function in functions.values():
        if not scope.kernel.search(function.name):
            continue
        for ins in function.instructions:
            if not FUSED.match(ins.opcode) or CONSTANT_IDIOM.search(ins.operands):
                continue
            if not is_ours(ins, scope):
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


def ftz_violations(functions: Dict[str, Function], scope: Scope) -> List[str]:
    return [f"{ins.opcode} {ins.operands} at {ins.source[0]}:{ins.source[1]} in {function.name}"
            for function in functions.values() if scope.kernel.search(function.name)
            for ins in function.instructions
            if FTZ_ARITHMETIC.match(ins.opcode) and is_ours(ins, scope)]


def resource_violations(resources: Dict[str, Resources], scope: Scope) -> List[str]:
    """The scope's own kernels (not CUB's) with a stack frame or spills."""
    return [f"{demangle(name)}: {r.stack_frame} B stack frame, {r.spill_stores} B spill "
            f"stores, {r.spill_loads} B spill loads"
            for name, r in sorted(resources.items())
            if scope.kernel.search(name) and r.spills and not CUB_KERNEL.search(name)]


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
    c++filt, so that the families cannot merge for want of a tool."""
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
_NAMESPACES = re.compile(r"at::native::\(anonymous namespace\)::|c10::")


def short_label(demangled: str) -> str:
    """A demangled kernel name without its namespaces, return type and
    parameter list: `sum_runs_kernel<float, int>`."""
    label = _NAMESPACES.sub("", demangled)
    label = label[len("void "):] if label.startswith("void ") else label
    return label.split("(", 1)[0]


def cub_label(mangled: str, readable: str) -> str:
    """A CUB kernel's name with its policy's key and value types when it has them:
    ``DeviceUniqueByKeySweepKernel<long, int>``."""
    m = re.search(r"policy_hub<([^<>]*)>", readable)
    return f"{kernel_name(mangled)}<{m.group(1)}>" if m else kernel_name(mangled)


@dataclasses.dataclass(frozen=True)
class MachineCode:
    """What a unit's cubin holds."""
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


def kernel_families(sections: Dict[str, int]) -> List[Tuple[str, int, int]]:
    """(kernel name, kernels, bytes) per name, largest first."""
    families: Dict[str, List[int]] = defaultdict(lambda: [0, 0])
    for mangled, size in sections.items():
        family = families[kernel_name(mangled)]
        family[0] += 1
        family[1] += size
    return sorted(((name, n, size) for name, (n, size) in families.items()),
                  key=lambda row: (-row[2], row[0]))


def _budget_text(budget: Budget) -> str:
    lines = f"{budget.lines} lines, " if budget.lines is not None else ""
    return f"{lines}{budget.kernels} kernels, {budget.text_bytes / 2**20:.2f} MiB"


def _code_text(code: MachineCode) -> str:
    return (f"{code.kernels} kernels, {code.text_bytes / 2**20:.2f} MiB of {code.arch} .text "
            f"({code.text_bytes} bytes)")


# ------------------------------------------------------------------ the core's builds


@dataclasses.dataclass
class CoreCode:
    """One core build: the lines of the core's file as its prefix of the upstream stack has
    them, its machine code, its own kernels' registers (by short label) and how many of them
    have a stack frame or spills, CUB's kernels with a stack frame, and its fused instructions
    per kernel family."""
    lines: int
    code: MachineCode
    registers: Dict[str, int]
    spilling_kernels: int
    cub_frames: List[dict]
    fused: Dict[str, dict]
    level: str = CORE_LEVEL  # which build (detgrid.levels.CORE_BUILDS)

    def record(self) -> dict:
        """What `core --json` writes, and the core's entry of benchmarks/machine_code.json; a
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
        """A speed level's build's entry of benchmarks/machine_code.json: its lines, machine
        code, run sums' registers, own kernels with a stack frame or spills and CUB's frames."""
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


def budget_violations(core: CoreCode, budget: Budget) -> List[str]:
    """Where a core build exceeds ``budget``: lines, kernels, `.text`."""
    found = []
    if budget.lines is not None and core.lines > budget.lines:
        found.append(f"{core.lines} lines > {budget.lines}")
    if core.code.kernels > budget.kernels:
        found.append(f"{core.code.kernels} kernels > {budget.kernels}")
    if core.code.text_bytes > budget.text_bytes:
        found.append(f"{core.code.text_bytes / 2**20:.2f} MiB of .text > "
                     f"{budget.text_bytes / 2**20:.2f} MiB")
    return found


def _stack():
    from detgrid.kit import stack  # only here: the audit itself reads no kit sources

    return stack


def core_lines(kit_root, upto: str = CORE_LEVEL) -> int:
    """Lines of the core's file (detgrid.kit.stack.core_sources) as the prefix of the stack
    ending at ``upto`` has it."""
    return sum(len(text.splitlines())
               for text in _stack().core_sources(kit_root, upto).values())


def _core_builds() -> Tuple[str, ...]:
    """detgrid.levels.CORE_BUILDS: the core, then each prefix of the upstream stack that ends
    at a speed level, named by that level."""
    return tuple(_stack().CORE_BUILDS)


# What a core build's failures past a budget print under.
CORE_BUDGET_KIND = "the core's budget"
STACK_BUDGET_KIND = "the whole stack's budget"


def core_build_budgets(level: str, builds: Sequence[str]) -> List[Tuple[str, Budget]]:
    """The budgets the core build ``level`` answers to, by the kind its failures print under:
    the core's (CORE_BUDGET) on the core (``builds[0]``), the whole stack's (STACK_BUDGET) on
    the top build (``builds[-1]``); a build between them answers to none."""
    found = []
    if level == builds[0]:
        found.append((CORE_BUDGET_KIND, CORE_BUDGET))
    if level == builds[-1]:
        found.append((STACK_BUDGET_KIND, STACK_BUDGET))
    return found


def _is_core_kernel(name: str) -> bool:
    return bool(CORE_SCOPE.kernel.search(name)) and not CUB_KERNEL.search(name)


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
               budgets: Sequence[Tuple[str, Budget]]) -> None:
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


def _read_unit(ptxas_log: str, sass: str, cubin: Optional[str] = None):
    """(resources, SASS text, .text sections or None); OSError, UnicodeDecodeError, ValueError
    or struct.error when an input is unreadable or not what it should be."""
    with open(ptxas_log, encoding="utf-8") as f:
        resources = parse_ptxas(f.read())
    with open(sass, encoding="utf-8") as f:
        text = f.read()
    sections = None
    if cubin is not None:
        with open(cubin, "rb") as f:
            sections = elf_text_sections(f.read())
    return resources, text, sections


def sum_fused_violations(functions: Dict[str, Function]) -> List[str]:
    """The fused multiply-adds of the core's run sums (RUN_SUM_KERNELS): their own, not a
    compiler subroutine's or the -RZ, RZ constant idiom. The existing kernel rounds each term's
    product before its atomicAdd, and the core adds terms with __fadd_rn / __dadd_rn, which nvcc
    never fuses with that product: a fused multiply-add there would round a term one way in one
    build and another way in the next, and on the GPU unlike the host."""
    found = []
    for name, function in sorted(functions.items()):
        if not _is_core_kernel(name) or kernel_name(name) not in RUN_SUM_KERNELS:
            continue
        for ins in function.instructions:
            if (FUSED.match(ins.opcode) and not CONSTANT_IDIOM.search(ins.operands)
                    and not ins.in_subroutine):
                where = f"{ins.source[0].rsplit('/', 1)[-1]}:{ins.source[1]}" if ins.source else "?"
                found.append(f"{short_label(demangle(name))}: {ins.opcode} {ins.operands} ({where})")
    return found


def core_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit core",
        description="audit a build of the upstream core's GridSamplerDeterministic.cu (with "
        "--level, a speed level's build of it): no stack frame or spill in its kernels, no "
        "flush to zero, no fused multiply-add in its sums, its budget (the top build's: the whole stack's); print its kernels' "
        "registers and its fused instructions per kernel family (reported, not failed)")
    parser.add_argument("--ptxas-log", required=True, help="output of nvcc -Xptxas -v")
    parser.add_argument("--sass", required=True, help="output of nvdisasm -c -g -gi")
    parser.add_argument("--cubin", required=True, metavar="PATH", help="the unit's cubin")
    parser.add_argument("--kit", required=True,
                        help="the kit's root, whose core's lines are counted")
    parser.add_argument("--json", metavar="PATH", help="write the build's record there, for "
                        "`builds`")
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
        resources, sass, sections = _read_unit(args.ptxas_log, args.sass, args.cubin)
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
    spills = resource_violations(resources, CORE_SCOPE)
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
        "fused multiply-adds in the sums": sum_fused_violations(functions),
        **{kind: budget_violations(core, budget) for kind, budget in budgets},
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


def run_sum_register_rows(builds: Dict[str, CoreCode]) -> List[Tuple[str, List[Optional[int]]]]:
    """Per run-sum kernel (label), its registers in each build, in ``builds``' order (None:
    not in that build)."""
    labels = sorted({label for build in builds.values() for label in build.run_sum_registers()})
    return [(label, [build.run_sum_registers().get(label) for build in builds.values()])
            for label in labels]


def print_builds(builds: Dict[str, CoreCode], core_findings: Sequence[str],
                 stack_findings: Sequence[str]) -> None:
    """The core against its budget, the top build against the whole stack's, then every build
    side by side: lines, kernels, .text and the run sums' registers."""
    core, top = builds[CORE_LEVEL], list(builds)[-1]
    print(f"core: {core.lines} lines, {_code_text(core.code)}; budget "
          f"{_budget_text(CORE_BUDGET)}")
    for finding in core_findings:
        print(f"OVER BUDGET (core, failed): {finding}")
    print("core budget: met" if not core_findings else
          f"core budget: OVER BUDGET, {len(core_findings)} finding(s); failed")
    print(f"whole stack ({top}): {builds[top].lines} lines, {_code_text(builds[top].code)}; "
          f"budget {_budget_text(STACK_BUDGET)}")
    for finding in stack_findings:
        print(f"OVER BUDGET (whole stack, failed): {finding}")
    print(f"whole stack budget ({top}): met" if not stack_findings else
          f"whole stack budget ({top}): OVER BUDGET, {len(stack_findings)} finding(s); failed")
    print(f"core builds side by side: {' | '.join(builds)}")
    print(f"  lines: {' | '.join(str(b.lines) for b in builds.values())}")
    print(f"  kernels: {' | '.join(str(b.code.kernels) for b in builds.values())}")
    print(f"  .text bytes: {' | '.join(str(b.code.text_bytes) for b in builds.values())}")
    print("  own kernels with a stack frame or spills: "
          + " | ".join(str(b.spilling_kernels) for b in builds.values()))
    print("  CUB's kernels with a stack frame: "
          + " | ".join(str(len(b.cub_frames)) for b in builds.values()))
    print("  run sums' registers (ptxas -v):")
    for label, registers in run_sum_register_rows(builds):
        print(f"  {label}: " + " | ".join("-" if n is None else str(n) for n in registers))


def machine_code_record(builds: Dict[str, CoreCode], core_findings: Sequence[str],
                        stack_findings: Sequence[str]) -> dict:
    """benchmarks/machine_code.json: the core's arch, kernels and text_bytes; under ``levels``
    the core's record (``core``: what `detgrid report` cites), then each speed level's build's
    (CoreCode.build_record); the budgets and whether they are met."""
    core, top = builds[CORE_LEVEL], list(builds)[-1]
    return {
        **dataclasses.asdict(core.code),
        "levels": {level: build.record() if level == CORE_LEVEL else build.build_record()
                   for level, build in builds.items()},
        "budgets": {CORE_LEVEL: dataclasses.asdict(CORE_BUDGET),
                    "whole_stack": {"level": top, **dataclasses.asdict(STACK_BUDGET)}},
        "budget_met": not core_findings and not stack_findings,
        "over_budget": [f"core: {finding}" for finding in core_findings] + list(stack_findings),
    }


def builds_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit builds",
        description="the core against its budget and the top core build against the whole "
        "stack's (failed past them), and the core builds side by side (lines, kernels, .text, "
        "the run sums' registers); with --machine-code-json, their record")
    parser.add_argument("--core", required=True, metavar="PATH",
                        help="the core's measurement (`core --json`)")
    parser.add_argument("--core-build", action="append", default=[], metavar="PATH",
                        help="a speed level's build's measurement (`core --level LEVEL --json`; "
                        "repeatable): every speed level of detgrid.levels.CORE_BUILDS once")
    parser.add_argument("--machine-code-json", metavar="PATH",
                        help="write the record there (benchmarks/machine_code.json)")
    args = parser.parse_args(argv)
    core_builds = _core_builds()
    builds: Dict[str, CoreCode] = {}
    for k, path in enumerate([args.core, *args.core_build]):
        try:
            build = read_core_json(path)
        except (OSError, UnicodeDecodeError) as e:
            return _usage_error(f"builds: cannot read {path}: {e.strerror or e}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return _usage_error(f"builds: {path}: not a `core --json` file "
                                f"({type(e).__name__}: {e})")
        if k == 0 and build.level != CORE_LEVEL:
            return _usage_error(f"builds: {path}: the build of {build.level}, not the core's "
                                "(give it as --core-build)")
        if k > 0 and (build.level not in core_builds[1:] or build.level in builds):
            return _usage_error(f"builds: {path}: core build {build.level!r} is "
                                + (f"not a speed level's (those are "
                                   f"{', '.join(core_builds[1:]) or 'none'})"
                                   if build.level not in core_builds[1:] else "measured twice"))
        builds[build.level] = build
    missing = [level for level in core_builds[1:] if level not in builds]
    if missing:
        return _usage_error(f"builds: no --core-build of {', '.join(missing)}")
    builds = {level: builds[level] for level in core_builds}
    core_findings = budget_violations(builds[CORE_LEVEL], CORE_BUDGET)
    top = core_builds[-1]
    stack_findings = [f"whole stack ({top}): {problem}"
                      for problem in budget_violations(builds[top], STACK_BUDGET)]
    print_builds(builds, core_findings, stack_findings)
    if args.machine_code_json:
        with open(args.machine_code_json, "w", encoding="utf-8") as f:
            json.dump(machine_code_record(builds, core_findings, stack_findings), f, indent=2)
            f.write("\n")
    return 1 if core_findings or stack_findings else 0


# ------------------------------------------------------------------ the grid gradient


def grid_gradient_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m detgrid.kit.sass_audit grid-gradient",
        description="audit a build of GridGradient.cu (-fmad=false): no stack frame or spill, "
        "no fused multiply-add in its arithmetic, no flush to zero")
    parser.add_argument("--ptxas-log", required=True, help="output of nvcc -Xptxas -v")
    parser.add_argument("--sass", required=True, help="output of nvdisasm -c -g -gi")
    args = parser.parse_args(argv)
    try:
        resources, sass, _ = _read_unit(args.ptxas_log, args.sass)
    except (OSError, UnicodeDecodeError) as e:
        return _usage_error(f"cannot read {e.filename or 'an input'}: {e.strerror or e}")
    functions = parse_sass(sass)
    ours = [n for n in functions if GRID_GRADIENT.kernel.search(n)]
    if not ours:
        return _usage_error("no grad_grid kernel in the SASS (was it built with -lineinfo?)")
    problems = {
        "stack frames or spills": resource_violations(resources, GRID_GRADIENT),
        "fused multiply-add in its arithmetic": fused_violations(functions, SourceLines(),
                                                                 GRID_GRADIENT),
        "flush-to-zero arithmetic": ftz_violations(functions, GRID_GRADIENT),
    }
    for kind, found in problems.items():
        for problem in found:
            print(f"FAIL ({kind}): {problem}")
    failed = sum(map(len, problems.values()))
    print(f"sass audit (grad_grid): {len(ours)} kernels, "
          f"{sum(len(functions[n].instructions) for n in ours)} instructions; "
          f"{failed} problem(s)")
    return 1 if failed else 0


COMMANDS = {"core": core_main, "cut-core": cut_core_main, "builds": builds_main,
            "grid-gradient": grid_gradient_main}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    usage = (f"usage: python -m detgrid.kit.sass_audit {{{','.join(COMMANDS)}}} ...: "
             "`core` (a core build), `cut-core` (a speed level's core file), `builds` (the "
             "builds side by side, benchmarks/machine_code.json), `grid-gradient` (a "
             "GridGradient.cu build); each takes --help")
    if argv in (["-h"], ["--help"]):
        print(__doc__.split("\n\n")[0] + "\n\n" + usage)
        return 0
    return _usage_error(usage.removeprefix("usage: "))


def _usage_error(message: str) -> int:
    print(f"sass audit: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
