# Owner(s): ["module: nn"]
"""The machine-code audit (tools/detgrid/kit/sass_audit.py) on small, hand-written
excerpts of ptxas -v and nvdisasm -g -gi output. CI runs it on the real sm_90
builds (.ci/sass_audit.sh); these tests pin what it accepts and refuses."""

import contextlib
import io
import json
import struct
import tempfile
import textwrap
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import report, sass_audit
from detgrid.levels import CORE_BUILDS

# A kernel of a GridGradient.cu build (the extension's grad_grid).
GRID_GRADIENT = (
    "_ZN2at6native48_GLOBAL__N__fc89ace5_15_GridGradient_cu_faa09a9936grid_sampler_2d_grid_"
    "gradient_kernelIN3c104HalfEiEEvT0_NS_4cuda6detail10TensorInfoIKT_S5_EESB_SB_PS9_NS0_6detail"
    "24GridSamplerInterpolationENSD_18GridSamplerPaddingEb")
GRID_GRADIENT_SOURCE = "/src/extension/GridGradient.cu"
CUB_KERNEL = ("_ZN14at_cuda_detail3cub6detail4scan20DeviceScanInitKernel"
              "INS0_13ScanTileStateIiLb1EEEEEvT_i")


def _sass(body, name=GRID_GRADIENT):
    return f".text.{name}:\n" + textwrap.dedent(body)


def _loc(path, line, inlined_at=None):
    text = f'\t//## File "{path}", line {line}'
    if inlined_at:
        text += f' inlined at "{inlined_at[0]}", line {inlined_at[1]}'
    return text + "\n"


def _listing(instructions, locations=None):
    """SASS of one function body: instructions[k] at offset 0x10 * (k + 1), each at
    locations.get(k, (GRID_GRADIENT_SOURCE, 880))."""
    locations = locations or {}
    body = ""
    for k, text in enumerate(instructions):
        body += _loc(*locations.get(k, (GRID_GRADIENT_SOURCE, 880)))
        body += f"        /*{0x10 * (k + 1):04x}*/                   {text} ;\n"
    return body


def _cubin(sections):
    """A 64-bit little-endian ELF holding section headers alone, one per
    (name, size) of `sections`, and its section-name table."""
    names = b"\0"
    offsets = []
    for name, _ in sections + [(".shstrtab", 0)]:
        offsets.append(len(names))
        names += name.encode() + b"\0"
    table = 64 + len(names)
    header = "<IIQQQQIIQQ"  # name, type, flags, addr, offset, size, link, info, align, entsize
    headers = [struct.pack(header, *[0] * 10)]
    headers += [struct.pack(header, offset, 1, 6, 0, 0, size, 0, 0, 128, 0)
                for (_, size), offset in zip(sections, offsets)]
    headers.append(struct.pack(header, offsets[-1], 3, 0, 0, 64, len(names), 0, 0, 1, 0))
    elf = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack(
        "<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, table, 0, 64, 0, 0, 64, len(headers), len(headers) - 1)
    return elf + names + b"".join(headers)


def _run_audit(files, *flags):
    """sass_audit.main on `files` (file name -> content) in a scratch folder,
    `flags` naming them {name} and the folder {work}: (exit status, stdout,
    stderr, the folder's files after)."""
    with tempfile.TemporaryDirectory() as work:
        paths = {}
        for name, content in files.items():
            paths[name] = f"{work}/{name}"
            Path(paths[name]).write_bytes(content if isinstance(content, bytes)
                                          else content.encode())
        argv = [arg.format(work=work, **paths) for arg in flags]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(argv)
        after = {p.name: p.read_bytes() for p in Path(work).iterdir()}
    return rc, stdout.getvalue(), stderr.getvalue(), after


class _Lines(sass_audit.SourceLines):
    """Source lines by (file, line), without reading files."""

    def __init__(self, lines):
        super().__init__()
        self._lines = lines

    def line(self, source):
        return self._lines.get(source, "")


SCOPE = sass_audit.GRID_GRADIENT


class TestChecks(TestCase):
    """The checks on the SASS and ptxas' report, and what a cubin holds."""

    def test_fused_multiply_add_in_its_arithmetic_is_refused(self):
        sass = _sass(_loc(GRID_GRADIENT_SOURCE, 60, ("/x.cu", 99)) + _loc("/x.cu", 99)
                     + "        /*0010*/                   FFMA R1, R2, R3, R4 ;\n")
        lines = _Lines({(GRID_GRADIENT_SOURCE, 60): "  gix -= val * weight * gOut;"})
        found = sass_audit.fused_violations(sass_audit.parse_sass(sass), lines, SCOPE)
        self.assertEqual(len(found), 1)
        self.assertIn("GridGradient.cu:60", found[0])

    def test_fused_instruction_on_a_line_without_multiplication_is_library_code(self):
        # fmodf's expansion, emitted without line info of its own, inherits
        # the line before it (here a comparison): no contraction of ours.
        sass = _sass(_loc(GRID_GRADIENT_SOURCE, 280)
                     + "        /*0010*/                   FFMA R1, -R2, R3, R4 ;\n")
        lines = _Lines({(GRID_GRADIENT_SOURCE, 280): "  if (distance < static_cast<T>(0)) {"})
        self.assertEqual(sass_audit.fused_violations(sass_audit.parse_sass(sass), lines, SCOPE),
                         [])

    def test_innermost_frame_of_an_inlined_location_decides(self):
        # fmod from CUDA's headers inlined into our line: library code.
        sass = _sass(_loc("/usr/include/c++/12/cmath", 280, (GRID_GRADIENT_SOURCE, 163))
                     + _loc(GRID_GRADIENT_SOURCE, 163)
                     + "        /*0010*/                   FFMA R1, -|R2|, R3, R4 ;\n")
        self.assertEqual(
            sass_audit.fused_violations(sass_audit.parse_sass(sass), _Lines({}), SCOPE), [])

    def test_a_correctly_rounded_division_or_an_explicit_fma_is_allowed(self):
        for line in ("  return __fdiv_rn(a, b);", "  return __fma_rn(a, b, c);"):
            sass = _sass(_loc(GRID_GRADIENT_SOURCE, 64)
                         + "        /*0010*/                   FFMA R1, -R2, R3, 1 ;\n")
            lines = _Lines({(GRID_GRADIENT_SOURCE, 64): line})
            self.assertEqual(
                sass_audit.fused_violations(sass_audit.parse_sass(sass), lines, SCOPE), [])

    def test_compiler_subroutines_and_constant_idioms_are_not_ours(self):
        sass = _sass(_loc(GRID_GRADIENT_SOURCE, 70)
                     + "        /*0010*/                   HFMA2.MMA R5, -RZ, RZ, 1.875, 0 ;\n"
                     + "        /*0020*/                   EXIT ;\n"
                     + "$__internal_1_$__cuda_sm3x_div_rn_noftz_f32_slowpath:\n"
                     + "        /*0030*/                   FFMA R1, R2, R3, R4 ;\n"
                     + "        /*0040*/                   FADD.FTZ R1, R2, R3 ;\n"
                     + "        /*0050*/                   RET.REL.NODEC R6 `(.L_x_1) ;\n")
        functions = sass_audit.parse_sass(sass)
        lines = _Lines({(GRID_GRADIENT_SOURCE, 70): "  x = a * b + c;"})
        self.assertEqual(sass_audit.fused_violations(functions, lines, SCOPE), [])
        self.assertEqual(sass_audit.ftz_violations(functions, SCOPE), [])

    def test_flush_to_zero_arithmetic_is_refused(self):
        sass = _sass(_loc(GRID_GRADIENT_SOURCE, 60)
                     + "        /*0010*/                   FMUL.FTZ R1, R2, R3 ;\n"
                     + "        /*0020*/              @P0 F2I.FTZ.U32.TRUNC.NTZ R4, R2 ;\n")
        found = sass_audit.ftz_violations(sass_audit.parse_sass(sass), SCOPE)
        self.assertEqual(len(found), 1)
        self.assertIn("FMUL.FTZ", found[0])

    def test_kernels_not_ours_are_ignored(self):
        sass = _sass(_loc(GRID_GRADIENT_SOURCE, 60)
                     + "        /*0010*/                   FFMA.FTZ R1, R2, R3, R4 ;\n",
                     name=CUB_KERNEL)
        functions = sass_audit.parse_sass(sass)
        lines = _Lines({(GRID_GRADIENT_SOURCE, 60): "  x = a * b + c;"})
        self.assertEqual(sass_audit.fused_violations(functions, lines, SCOPE), [])
        self.assertEqual(sass_audit.ftz_violations(functions, SCOPE), [])

    def test_each_scope_holds_its_own_kernels(self):
        self.assertRegex(GRID_GRADIENT, sass_audit.GRID_GRADIENT.kernel)
        self.assertNotRegex(GRID_GRADIENT, sass_audit.CORE_SCOPE.kernel)
        for name in (CORE_SUMS, CORE_RECORDS):
            self.assertRegex(name, sass_audit.CORE_SCOPE.kernel)
            self.assertNotRegex(name, sass_audit.GRID_GRADIENT.kernel)

    def test_ptxas_resources_and_spills_of_its_own_kernels(self):
        log = (_ptxas_entry(GRID_GRADIENT, 80, frame=16, spills=24)
               + _ptxas_entry(CUB_SWEEP, 64, frame=24, spills=20))
        resources = sass_audit.parse_ptxas(log)
        self.assertEqual(resources[GRID_GRADIENT], sass_audit.Resources(80, 16, 24, 24))
        found = sass_audit.resource_violations(resources, SCOPE)
        self.assertEqual(len(found), 1)
        self.assertIn("grid_sampler_2d_grid_gradient_kernel", found[0])
        self.assertIn("16 B stack frame, 24 B spill stores, 24 B spill loads", found[0])
        # CUB's kernels are never a scope's own
        self.assertEqual(sass_audit.resource_violations(resources, sass_audit.CORE_SCOPE), [])

    def test_kernel_name_is_read_from_the_mangled_name(self):
        self.assertEqual(sass_audit.kernel_name(CORE_SUMS), "sum_runs_kernel")
        self.assertEqual(sass_audit.kernel_name(GRID_GRADIENT),
                         "grid_sampler_2d_grid_gradient_kernel")
        self.assertEqual(sass_audit.kernel_name(CUB_KERNEL), "DeviceScanInitKernel")
        self.assertEqual(sass_audit.kernel_name("_Z6simplev"), "simple")
        self.assertEqual(sass_audit.kernel_name("not_mangled"), "not_mangled")

    def test_text_sections_of_a_cubin_are_its_kernels(self):
        cubin = _cubin([(".nv.info." + CORE_SUMS, 100), (".text." + CORE_SUMS, 4096),
                        (".rela.text." + CORE_SUMS, 24), (".text." + CUB_KERNEL, 512)])
        self.assertEqual(sass_audit.elf_text_sections(cubin), {CORE_SUMS: 4096, CUB_KERNEL: 512})
        with self.assertRaisesRegex(ValueError, "not a 64-bit ELF"):
            sass_audit.elf_text_sections(b"// SASS, not a cubin")

    def test_kernel_families_sum_each_kernel_name(self):
        sections = {CORE_SUMS: 100, CORE_SUMS + "x": 50, CORE_RECORDS: 1000, CUB_KERNEL: 10}
        self.assertEqual(sass_audit.kernel_families(sections),
                         [("grid_sampler_2d_records_kernel", 1, 1000),
                          ("sum_runs_kernel", 2, 150), ("DeviceScanInitKernel", 1, 10)])


class TestGridGradient(TestCase):
    """`grid-gradient`: a GridGradient.cu build fails on a frame or spill, a fused multiply-add
    on a line of its own with a multiplication, and flush to zero."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-sass-grid-gradient-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)
        # the source the SASS's line info names, which the fused check reads
        self.source = self.tmp / "GridGradient.cu"
        self.source.write_text("int x;\n" * 29 + "  gix -= val * weight * gOut;\n")

    def _audit(self, instructions, log=""):
        sass = _sass(_listing(instructions, {k: (str(self.source), 30)
                                             for k in range(len(instructions))}))
        return _run_audit({"ptxas": log, "sass": sass}, "grid-gradient",
                          "--ptxas-log", "{ptxas}", "--sass", "{sass}")

    def test_a_clean_build_passes(self):
        rc, out, err, _ = self._audit(["FMUL R1, R2, R3", "FADD R1, R1, R4", "EXIT"],
                                      _ptxas_entry(GRID_GRADIENT, 40))
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, "sass audit (grad_grid): 1 kernels, 3 instructions; 0 problem(s)\n")

    def test_a_frame_a_fused_multiply_add_or_flush_to_zero_fails(self):
        rc, out, _, _ = self._audit(["FFMA R1, R2, R3, R4", "FADD.FTZ R1, R1, R4", "EXIT"],
                                    _ptxas_entry(GRID_GRADIENT, 40, frame=8))
        self.assertEqual(rc, 1, out)
        lines = out.splitlines()
        self.assertEqual([line.split(":", 1)[0] for line in lines[:3]],
                         ["FAIL (stack frames or spills)",
                          "FAIL (fused multiply-add in its arithmetic)",
                          "FAIL (flush-to-zero arithmetic)"])
        self.assertIn(f"FFMA R1, R2, R3, R4 at {self.source}:30", lines[1])
        self.assertEqual(lines[-1], "sass audit (grad_grid): 1 kernels, 3 instructions; "
                                    "3 problem(s)")

    def test_bad_input_is_a_one_line_error(self):
        rc, out, err, _ = _run_audit({"ptxas": "", "sass": _sass(_listing(["EXIT"]),
                                                                 name=CUB_KERNEL)},
                                     "grid-gradient", "--ptxas-log", "{ptxas}", "--sass", "{sass}")
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err, "sass audit: no grad_grid kernel in the SASS (was it built with "
                              "-lineinfo?)\n")
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(["grid-gradient", "--ptxas-log", "/nonexistent/ptxas.txt",
                                  "--sass", "/dev/null"])
        self.assertEqual(rc, 2)
        self.assertEqual(stderr.getvalue().count("\n"), 1)
        self.assertIn("cannot read /nonexistent/ptxas.txt", stderr.getvalue())

    def test_the_audit_is_a_subcommand(self):
        for argv in ([], ["--ptxas-log", "x"], ["levels"]):
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                self.assertEqual(sass_audit.main(argv), 2)
            self.assertEqual(stderr.getvalue().count("\n"), 1)
            self.assertIn("{core,cut-core,builds,grid-gradient}", stderr.getvalue())


def _fake_kit(kit, core_lines=600, level_lines=64):
    """A kit whose upstream core's one file has ``core_lines`` lines; each speed level of the
    stack's diff adds ``level_lines`` to it."""
    from detgrid.kit import stack, textdiff

    core = Path(kit) / stack.UPSTREAM_ROOT / stack.KERNEL_DIR
    core.mkdir(parents=True)
    for name in stack.CORE_FILES:
        (core / name).write_text("int core;\n" * core_lines)
    text = "int core;\n" * core_lines
    for level in CORE_BUILDS[1:]:
        folder = Path(kit) / stack.LEVELS_ROOT / level
        folder.mkdir(parents=True)
        longer = text + f"int {level.replace('-', '_')};\n" * level_lines
        for name in stack.CORE_FILES:
            (folder / f"{name}.diff").write_text(textdiff.make(text, longer, name))
        text = longer


# Kernels of a build of the upstream core (aten_kernels/aten/.../GridSamplerDeterministic.cu):
# two of its own, in its anonymous namespace, and CUB's 32-bit unique_by_key sweep.
CORE_NAMESPACE = "_ZN2at6native60_GLOBAL__N__65461c2a_27_GridSamplerDeterministic_cu_c43c93ae"
CORE_SUMS = (CORE_NAMESPACE + "15sum_runs_kernelIfiEEvlNS1_11SortedChunkIT_T0_EEPNS_10OpMathTypeIS4_"
             "E4typeEPS4_")
CORE_RECORDS = (CORE_NAMESPACE + "30grid_sampler_2d_records_kernelIfiEEvT0_S3_NS_4cuda6detail10Tenso"
                "rInfoIKT_S3_EES9_S9_NS0_6detail24GridSamplerInterpolationENSA_18GridSamplerPadding"
                "EbNS1_12ChunkRecordsIS7_S3_EE")
CUB_SWEEP = ("_ZN14at_cuda_detail3cub6detail13unique_by_key28DeviceUniqueByKeySweepKernelINS2_10policy_"
             "hubIiiE10Policy1000EPKiPiS9_S9_S9_NS0_13ScanTileStateIyLb1EEEN4cuda3std3__48equal_toIvE"
             "EyNS2_11VSMemHelperEEEvT0_T1_T2_T3_T4_T5_T6_T7_iNS1_7vsmem_tE")
CORE_CU = "/kit/aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu"
ATEN_GRID_SAMPLER = "/torch/include/ATen/native/cuda/GridSampler.cuh"


def _ptxas_entry(name, registers, frame=0, spills=0):
    return (f"ptxas info    : Compiling entry function '{name}' for 'sm_90'\n"
            f"ptxas info    : Function properties for {name}\n"
            f"    {frame} bytes stack frame, {spills} bytes spill stores, {spills} bytes spill loads\n"
            f"ptxas info    : Used {registers} registers, used 0 barriers\n")


def _core_unit(sums=(), records=(), sums_registers=32, sums_frame=0):
    """(ptxas log, SASS, cubin) of a core build: sum_runs_kernel<float, int> with the
    instructions `sums` (each (text, (file, line)) or (text, (file, line), True) in a
    subroutine), grid_sampler_2d_records_kernel<float, int> with `records`, and CUB's sweep
    with its 24-byte frame."""
    def body(instructions):
        text = ""
        for k, (ins, source, *sub) in enumerate(instructions):
            if sub and sub[0] and (k == 0 or not instructions[k - 1][2:]):
                text += "$__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath:\n"
            text += _loc(*source) + f"        /*{0x10 * (k + 1):04x}*/                   {ins} ;\n"
        return text + f"        /*{0x10 * (len(instructions) + 1):04x}*/                   EXIT ;\n"

    log = (_ptxas_entry(CORE_SUMS, sums_registers, sums_frame, sums_frame)
           + _ptxas_entry(CORE_RECORDS, 40) + _ptxas_entry(CUB_SWEEP, 64, 24, 20))
    sass = ("\t.target\tsm_90\n" + _sass(body(list(sums)), name=CORE_SUMS)
            + _sass(body(list(records)), name=CORE_RECORDS)
            + _sass(body([("IADD3 R1, R1, 1, RZ", (CORE_CU, 1))]), name=CUB_SWEEP))
    cubin = _cubin([(".text." + CORE_SUMS, 15616), (".text." + CORE_RECORDS, 31744),
                    (".text." + CUB_SWEEP, 44672)])
    return log, sass, cubin


class TestCore(TestCase):
    """The upstream core's audit (`core`): its budget, its resources and flush to zero fail;
    its fused multiply-adds (by design) and CUB's frames are reported; what it records."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-sass-core-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)
        _fake_kit(self.tmp / "kit")

    def _audit(self, unit, *flags, kit=None):
        log, sass, cubin = unit
        return _run_audit({"ptxas": log, "sass": sass, "cubin": cubin}, "core",
                          "--ptxas-log", "{ptxas}", "--sass", "{sass}", "--cubin", "{cubin}",
                          "--kit", str(kit or self.tmp / "kit"), *flags)

    def test_the_cores_budget_is_700_lines_40_kernels_and_1_mib(self):
        # 700 lines: issue 41's 600 predate tricubic (5-D bicubic), which the core now serves
        def core(lines, kernels, text_bytes):
            return sass_audit.CoreCode(lines, sass_audit.MachineCode("sm_90", kernels, text_bytes),
                                       {}, 0, [], {})

        budget = sass_audit.CORE_BUDGET
        self.assertEqual(sass_audit.budget_violations(core(700, 40, 2**20), budget), [])
        self.assertEqual(sass_audit.budget_violations(core(701, 41, 2**20 + 1), budget),
                         ["701 lines > 700", "41 kernels > 40", "1.00 MiB of .text > 1.00 MiB"])

    def test_fused_multiply_adds_are_counted_per_family_and_reported_not_failed(self):
        sums = [("FADD R1, R2, R1", (CORE_CU, 328)), ("DADD R2, R4, R2", (CORE_CU, 328)),
                ("HFMA2.MMA R5, -RZ, RZ, 1.875, 0", (CORE_CU, 330)),  # a constant, not arithmetic
                ("FFMA R1, -R2, R3, 1", (CORE_CU, 261), True)]  # a division's slow path
        records = [("FFMA R1, R2, R3, R4", (ATEN_GRID_SAMPLER, 44)),
                   ("FFMA R1, R2, R3, R4", (ATEN_GRID_SAMPLER, 44)),
                   ("DFMA R2, R4, R6, R8", (CORE_CU, 176))]
        rc, out, err, after = self._audit(_core_unit(sums, records), "--json", "{work}/core.json")
        self.assertEqual(rc, 0, out + err)
        self.assertNotIn("FAIL", out)
        self.assertIn("fused family sum_runs_kernel (1 kernels): FFMA=1 DFMA=0 HFMA2=0 (by design, "
                      "not failed; by source: subroutines 1)\n", out)
        self.assertIn("fused family grid_sampler_2d_records_kernel (1 kernels): FFMA=2 DFMA=1 "
                      "HFMA2=0 (by design, not failed; by source: GridSampler.cuh 2, "
                      "GridSamplerDeterministic.cu 1)\n", out)
        self.assertTrue(out.endswith("sass audit (core): 2 kernels of its own, 9 instructions, "
                                     "FFMA=3 DFMA=1 HFMA2=0 (reported); 0 problem(s), "
                                     "1 reported, not failed\n"), out)
        record = json.loads(after["core.json"])
        self.assertEqual(record["fused"]["grid_sampler_2d_records_kernel"],
                         {"kernels": 1, "FFMA": 2, "DFMA": 1, "HFMA2": 0,
                          "by_source": {"GridSamplerDeterministic.cu": 1, "GridSampler.cuh": 2}})
        # The grad_grid's rule would refuse the contraction on a line of the core's own.
        functions = sass_audit.parse_sass(_core_unit(sums, records)[1])
        self.assertEqual(len(sass_audit.fused_violations(
            functions, _Lines({(CORE_CU, 176): "w = a * b + c;"}), sass_audit.CORE_SCOPE)), 1)

    def test_a_fused_multiply_add_in_the_run_sums_fails(self):
        # The run sums add each term with its product rounded, as the existing kernel's
        # atomicAdd receives it: a product fused into the sum is refused, in float or double.
        for fused in ("FFMA R1, R2, R3, R1", "DFMA R2, R4, R6, R2"):
            with self.subTest(fused=fused):
                sums = [("FADD R1, R2, R1", (CORE_CU, 328)), (fused, (CORE_CU, 430))]
                rc, out, _, _ = self._audit(_core_unit(sums), "--json", "{work}/core.json")
                self.assertEqual(rc, 1, out)
                self.assertIn("FAIL (fused multiply-adds in the sums, core): sum_runs_kernel<float, "
                              f"int>: {fused} (GridSamplerDeterministic.cu:430)\n", out)

    def test_registers_of_every_kernel_are_printed_and_recorded(self):
        rc, out, _, after = self._audit(_core_unit(sums_registers=36), "--json", "{work}/core.json")
        self.assertEqual(rc, 0, out)
        self.assertIn("machine code (core): 600 lines of new ATen code, 3 kernels, 0.09 MiB of "
                      "sm_90 .text (92032 bytes); budget 700 lines, 40 kernels, 1.00 MiB\n", out)
        self.assertIn("kernel grid_sampler_2d_records_kernel<float, int>: regs=40 frame=0 B "
                      "spills=0/0 B text=31744 B\n"
                      "kernel sum_runs_kernel<float, int>: regs=36 frame=0 B spills=0/0 B "
                      "text=15616 B\n"
                      "kernel DeviceUniqueByKeySweepKernel<int, int>: regs=64 frame=24 B "
                      "spills=20/20 B text=44672 B\n", out)
        self.assertEqual(json.loads(after["core.json"]), {
            "lines": 600, "arch": "sm_90", "kernels": 3, "text_bytes": 92032,
            "registers": {"grid_sampler_2d_records_kernel<float, int>": 40,
                          "sum_runs_kernel<float, int>": 36},
            "spilling_kernels": 0,
            "cub_frames": [{"kernel": "DeviceUniqueByKeySweepKernel<int, int>", "stack_frame": 24,
                            "spill_stores": 20, "spill_loads": 20}],
            "fused": {"grid_sampler_2d_records_kernel": {"kernels": 1, "FFMA": 0, "DFMA": 0,
                                                         "HFMA2": 0, "by_source": {}},
                      "sum_runs_kernel": {"kernels": 1, "FFMA": 0, "DFMA": 0, "HFMA2": 0,
                                          "by_source": {}}}})

    def test_cubs_frames_are_reported_a_frame_of_its_own_fails(self):
        rc, out, _, after = self._audit(_core_unit(), "--json", "{work}/core.json")
        self.assertEqual(rc, 0, out)
        self.assertTrue(out.startswith(
            "REPORTED, not failed (CUB's stack frames, core): DeviceUniqueByKeySweepKernel<int, "
            "int>: 24 B stack frame, 20 B spill stores, 20 B spill loads\n"), out)
        rc, out, _, after = self._audit(_core_unit(sums_frame=8), "--json", "{work}/core.json")
        self.assertEqual(rc, 1)
        self.assertTrue(out.startswith(
            "FAIL (stack frames or spills, core): void at::native::(anonymous namespace)::"
            "sum_runs_kernel<float, int>("), out)
        self.assertIn("8 B stack frame, 8 B spill stores, 8 B spill loads\n", out)
        self.assertEqual(json.loads(after["core.json"])["spilling_kernels"], 1)

    def test_flush_to_zero_in_its_arithmetic_or_atens_helpers_fails(self):
        for source in ((CORE_CU, 328), (ATEN_GRID_SAMPLER, 92)):
            rc, out, _, _ = self._audit(_core_unit([("FADD.FTZ R6, R6, R9", source)]))
            self.assertEqual(rc, 1, out)
            self.assertTrue(out.startswith("FAIL (flush-to-zero arithmetic, core): FADD.FTZ R6, "
                                           f"R6, R9 at {source[0]}:{source[1]} in {CORE_SUMS}"),
                            out)
        # fmod's slow path (a compiler subroutine) and CUDA's math headers are not its own
        rc, out, _, _ = self._audit(_core_unit([
            ("FADD.FTZ R0, R0, R7", (CORE_CU, 261), True)]))
        self.assertEqual(rc, 0, out)
        rc, out, _, _ = self._audit(_core_unit([
            ("FADD.FTZ R0, R0, R7", ("/usr/include/c++/12/cmath", 280))]))
        self.assertEqual(rc, 0, out)

    def test_past_its_budget_the_core_fails(self):
        _fake_kit(self.tmp / "long", core_lines=700)
        rc, out, _, _ = self._audit(_core_unit(), kit=self.tmp / "long")
        self.assertEqual(rc, 0, out)
        self.assertNotIn("FAIL", out)
        _fake_kit(self.tmp / "longer", core_lines=701)
        rc, out, _, _ = self._audit(_core_unit(), kit=self.tmp / "longer")
        self.assertEqual(rc, 1)
        self.assertIn("FAIL (the core's budget, core): 701 lines > 700\n", out)
        log, sass, _ = _core_unit()
        many = _cubin([(".text." + CORE_SUMS + str(k), 2**15 + 1) for k in range(41)])
        rc, out, _, _ = self._audit((log, sass, many))
        self.assertEqual(rc, 1)
        self.assertIn("FAIL (the core's budget, core): 41 kernels > 40\n"
                      "FAIL (the core's budget, core): 1.28 MiB of .text > 1.00 MiB\n", out)

    def test_cub_kernels_are_labelled_with_their_policys_types(self):
        self.assertEqual(sass_audit.cub_label(CUB_SWEEP, sass_audit.demangle(CUB_SWEEP)),
                         "DeviceUniqueByKeySweepKernel<int, int>")
        self.assertEqual(sass_audit.cub_label(CUB_KERNEL, sass_audit.demangle(CUB_KERNEL)),
                         "DeviceScanInitKernel")

    def test_bad_input_is_a_one_line_error(self):
        log, sass, cubin = _core_unit()
        for unit, message in (((log, _sass(_listing(["EXIT"]), name=CUB_SWEEP), cubin),
                               "no kernel of the core in the SASS"),
                              ((log, sass, "SASS"), "cubin: not a cubin")):
            rc, out, err, after = self._audit(unit, "--json", "{work}/core.json")
            self.assertEqual((rc, out), (2, ""))
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn(message, err)
            self.assertNotIn("core.json", after)
        rc, _, err, _ = self._audit(_core_unit(), kit=self.tmp / "nonesuch")
        self.assertEqual(rc, 2)
        self.assertIn("cannot read", err)


class TestCoreBuilds(TestCase):
    """Each speed level's core build (`core --level LEVEL`, the core's file as the stack's prefix
    up to that level has it): the core's rules (a frame or spill of its own and flush to zero
    fail), the whole stack's budget on the top build (100 kernels, 1.6 MiB; failed past it) and
    not the core's; what it records."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-sass-core-builds-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)
        _fake_kit(self.tmp / "kit")
        self.top = CORE_BUILDS[-1]

    def _audit(self, unit, *flags, level=None, kit=None):
        log, sass, cubin = unit
        return _run_audit({"ptxas": log, "sass": sass, "cubin": cubin}, "core",
                          "--ptxas-log", "{ptxas}", "--sass", "{sass}", "--cubin", "{cubin}",
                          "--kit", str(kit or self.tmp / "kit"), "--level", level or self.top,
                          *flags)

    def test_the_stack_has_a_speed_level_and_the_top_build_is_the_last(self):
        from detgrid import levels

        self.assertEqual(CORE_BUILDS[0], levels.CORE)
        self.assertIn("grouped-channels", CORE_BUILDS[1:])
        self.assertEqual(sass_audit.STACK_BUDGET, sass_audit.Budget(100, int(1.6 * 2**20)))
        self.assertEqual(sass_audit.core_build_budgets("core", ("core", "a", "b")),
                         [("the core's budget", sass_audit.CORE_BUDGET)])
        self.assertEqual(sass_audit.core_build_budgets("a", ("core", "a", "b")), [])
        self.assertEqual(sass_audit.core_build_budgets("b", ("core", "a", "b")),
                         [("the whole stack's budget", sass_audit.STACK_BUDGET)])
        # a stack of the core alone: the core answers to both
        self.assertEqual(len(sass_audit.core_build_budgets("core", ("core",))), 2)

    def test_a_speed_levels_build_is_audited_and_recorded_as_its_level(self):
        rc, out, err, after = self._audit(_core_unit(sums_registers=40), "--json",
                                          "{work}/build.json")
        self.assertEqual(rc, 0, out + err)
        self.assertIn(f"machine code ({self.top}): 664 lines of the core's file as the stack up "
                      f"to {self.top} has it, 3 kernels, 0.09 MiB of sm_90 .text (92032 bytes); "
                      "the whole stack's budget 100 kernels, 1.60 MiB\n", out)
        self.assertIn("kernel sum_runs_kernel<float, int>: regs=40 frame=0 B spills=0/0 B "
                      "text=15616 B\n", out)
        self.assertTrue(out.startswith(f"REPORTED, not failed (CUB's stack frames, {self.top}): "
                                       "DeviceUniqueByKeySweepKernel<int, int>"), out)
        self.assertTrue(out.endswith("0 problem(s), 1 reported, not failed\n"), out)
        self.assertIn(f"sass audit ({self.top}): 2 kernels of its own", out)
        record = json.loads(after["build.json"])
        self.assertEqual((record["level"], record["lines"], record["kernels"],
                          record["text_bytes"]), (self.top, 664, 3, 92032))
        (self.tmp / "build.json").write_bytes(after["build.json"])
        build = sass_audit.read_core_json(self.tmp / "build.json")
        self.assertEqual(build.level, self.top)
        self.assertEqual(build.build_record(), {
            "lines": 664, "arch": "sm_90", "kernels": 3, "text_bytes": 92032,
            "run_sum_registers": {"sum_runs_kernel<float, int>": 40},  # the run sums' alone
            "spilling_kernels": 0,
            "cub_frames": [{"kernel": "DeviceUniqueByKeySweepKernel<int, int>", "stack_frame": 24,
                            "spill_stores": 20, "spill_loads": 20}]})

    def test_a_frame_or_flush_to_zero_in_a_levels_build_fails(self):
        rc, out, _, after = self._audit(_core_unit(sums_frame=8), "--json", "{work}/build.json")
        self.assertEqual(rc, 1, out)
        self.assertTrue(out.startswith(
            f"FAIL (stack frames or spills, {self.top}): void at::native::(anonymous namespace)::"
            "sum_runs_kernel<float, int>("), out)
        self.assertEqual(json.loads(after["build.json"])["spilling_kernels"], 1)
        rc, out, _, _ = self._audit(_core_unit([("FMUL.FTZ R6, R6, R9", (CORE_CU, 328))]))
        self.assertEqual(rc, 1, out)
        self.assertTrue(out.startswith(f"FAIL (flush-to-zero arithmetic, {self.top}): FMUL.FTZ "
                                       f"R6, R6, R9 at {CORE_CU}:328 in {CORE_SUMS}"), out)

    def test_the_top_build_fails_past_the_whole_stacks_budget_not_the_cores(self):
        log, sass, _ = _core_unit()
        # 100 kernels and 1.6 MiB: within the whole stack's budget, past the core's 40 and
        # 1 MiB and 700 lines, which are the core's alone
        size = int(1.6 * 2**20) // 100
        at = _cubin([(".text." + CORE_SUMS + str(k), size) for k in range(99)]
                    + [(".text." + CORE_SUMS + "x", int(1.6 * 2**20) - 99 * size)])
        _fake_kit(self.tmp / "long", core_lines=701)
        rc, out, _, _ = self._audit((log, sass, at), kit=self.tmp / "long")
        self.assertEqual(rc, 0, out)
        self.assertNotIn("FAIL", out)
        past = _cubin([(".text." + CORE_SUMS + str(k), size + 1) for k in range(101)])
        rc, out, _, _ = self._audit((log, sass, past))
        self.assertEqual(rc, 1, out)
        self.assertIn(f"FAIL (the whole stack's budget, {self.top}): 101 kernels > 100\n"
                      f"FAIL (the whole stack's budget, {self.top}): 1.62 MiB of .text > "
                      "1.60 MiB\n", out)
        # the core itself still answers to its own budget
        rc, out, _, _ = self._audit((log, sass, at), level=CORE_BUILDS[0])
        self.assertEqual(rc, 1, out)
        self.assertIn("FAIL (the core's budget, core): 100 kernels > 40\n", out)

    def test_an_unknown_core_build_or_a_diff_that_does_not_apply_is_a_one_line_error(self):
        rc, out, err, _ = self._audit(_core_unit(), level="nonesuch")
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("unknown core build 'nonesuch'; the core builds are core, ", err)
        from detgrid.kit import stack

        core = self.tmp / "kit" / stack.UPSTREAM_ROOT / stack.KERNEL_DIR / stack.CORE_FILES[0]
        core.write_text("int changed;\n" * 600)
        rc, out, err, _ = self._audit(_core_unit())
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertTrue(err.startswith(f"sass audit: {self.top}: "), err)

    def test_cut_core_writes_each_speed_levels_file(self):
        from detgrid.kit import stack

        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(["cut-core", "--kit", str(self.tmp / "kit"),
                                  "--into", str(self.tmp / "src")])
        self.assertEqual(rc, 0, stderr.getvalue())
        rows = [line.split() for line in stdout.getvalue().splitlines()]
        self.assertEqual([row[0] for row in rows], list(CORE_BUILDS[1:]))
        for k, (level, path, lines) in enumerate(rows):
            self.assertEqual(Path(path), self.tmp / "src" / level / stack.KERNEL_DIR
                             / "GridSamplerDeterministic.cu")
            self.assertEqual(int(lines), 600 + 64 * (k + 1))
            self.assertEqual(Path(path).read_text(),
                             stack.core_sources(self.tmp / "kit", level)[
                                 f"{stack.KERNEL_DIR}/GridSamplerDeterministic.cu"])
        for level in (CORE_BUILDS[0], "nonesuch"):  # the core is built from its own file
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                rc = sass_audit.main(["cut-core", "--kit", str(self.tmp / "kit"),
                                      "--into", str(self.tmp / "src"), "--level", level])
            self.assertEqual((rc, stdout.getvalue()), (2, ""))
            self.assertIn(f"'{level}' is not a speed level of the upstream stack",
                          stderr.getvalue())


class TestBuilds(TestCase):
    """`builds`: the core against its budget and the top build against the whole stack's (failed
    past them), the builds side by side, and benchmarks/machine_code.json."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-sass-builds-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)
        self.top = CORE_BUILDS[-1]

    def _core(self, lines=600, kernels=38, text_bytes=966784):
        """A `core --json` file."""
        core = sass_audit.CoreCode(
            lines, sass_audit.MachineCode("sm_90", kernels, text_bytes),
            {"sum_runs_kernel<float, int>": 32}, 0,
            [{"kernel": "DeviceUniqueByKeySweepKernel<int, int>", "stack_frame": 24,
              "spill_stores": 20, "spill_loads": 20}],
            {"sum_runs_kernel": {"kernels": 8, "FFMA": 14, "DFMA": 14, "HFMA2": 0,
                                 "by_source": {"GridSamplerDeterministic.cu": 28}}})
        path = self.tmp / "core.json"
        path.write_text(json.dumps(core.record()))
        return str(path)

    def _core_build(self, level, kernels=38, text_bytes=990464, sums_registers=40, spills=0):
        """A `core --level LEVEL --json` file."""
        build = sass_audit.CoreCode(
            664, sass_audit.MachineCode("sm_90", kernels, text_bytes),
            {"grid_sampler_2d_records_kernel<float, int>": 32,
             "sum_run_partials_kernel<float, long>": 40,
             "sum_runs_kernel<float, int>": sums_registers}, spills, [], {}, level)
        path = self.tmp / f"build-{level}.json"
        path.write_text(json.dumps(build.record()))
        return str(path)

    def _builds(self, *flags, core=None, builds=None):
        """`builds` with the core's measurement and each speed level's build's (``builds``: their
        files; default each as _core_build makes it): (exit status, stdout, stderr)."""
        if builds is None:
            builds = [self._core_build(level) for level in CORE_BUILDS[1:]]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(["builds", "--core", core or self._core(),
                                  *[arg for path in builds for arg in ("--core-build", path)],
                                  *flags])
        return rc, stdout.getvalue(), stderr.getvalue()

    def _assert_refused(self, message, core=None, builds=None):
        """`builds` with these inputs fails in one line naming ``message`` and writes no
        machine_code.json."""
        rc, out, err = self._builds("--machine-code-json", str(self.tmp / "m.json"),
                                    core=core, builds=builds)
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(message, err)
        self.assertFalse((self.tmp / "m.json").exists())

    def test_the_record_is_the_cores_then_each_builds(self):
        record = self.tmp / "machine_code.json"
        rc, out, err = self._builds("--machine-code-json", str(record))
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith(
            "core: 600 lines, 38 kernels, 0.92 MiB of sm_90 .text (966784 bytes); budget 700 "
            "lines, 40 kernels, 1.00 MiB\ncore budget: met\n"), out)
        written = json.loads(record.read_text())
        # the upstream change's count, which `detgrid report` cites, is the core's
        self.assertEqual((written["arch"], written["kernels"], written["text_bytes"]),
                         ("sm_90", 38, 966784))
        (self.tmp / "benchmarks").mkdir()
        (self.tmp / "benchmarks" / "machine_code.json").write_text(record.read_text())
        code = report.read_machine_code(self.tmp)
        self.assertEqual((code.arch, code.kernels, code.text_bytes), ("sm_90", 38, 966784))
        # the core's record first, then each speed level's build
        self.assertEqual(list(written["levels"]), list(CORE_BUILDS))
        self.assertEqual(written["levels"]["core"], json.loads(Path(self._core()).read_text()))
        for level in CORE_BUILDS[1:]:
            self.assertEqual(written["levels"][level],
                             {"lines": 664, "arch": "sm_90", "kernels": 38, "text_bytes": 990464,
                              "run_sum_registers": {"sum_run_partials_kernel<float, long>": 40,
                                                    "sum_runs_kernel<float, int>": 40},
                              "spilling_kernels": 0, "cub_frames": []})
        self.assertEqual(written["budgets"],
                         {"core": {"kernels": 40, "text_bytes": 2**20, "lines": 700},
                          "whole_stack": {"level": self.top, "kernels": 100,
                                          "text_bytes": int(1.6 * 2**20), "lines": None}})
        self.assertEqual((written["budget_met"], written["over_budget"]), (True, []))

    def test_the_builds_are_printed_side_by_side(self):
        rc, out, err = self._builds()
        self.assertEqual(rc, 0, err)
        self.assertIn(f"whole stack ({self.top}): 664 lines, 38 kernels, 0.94 MiB of sm_90 .text "
                      "(990464 bytes); budget 100 kernels, 1.60 MiB\n"
                      f"whole stack budget ({self.top}): met\n", out)
        names = " | ".join(CORE_BUILDS)
        more = len(CORE_BUILDS) - 1
        self.assertTrue(out.endswith(
            f"core builds side by side: {names}\n"
            f"  lines: 600{' | 664' * more}\n"
            f"  kernels: 38{' | 38' * more}\n"
            f"  .text bytes: 966784{' | 990464' * more}\n"
            f"  own kernels with a stack frame or spills: 0{' | 0' * more}\n"
            f"  CUB's kernels with a stack frame: 1{' | 0' * more}\n"
            "  run sums' registers (ptxas -v):\n"
            f"  sum_run_partials_kernel<float, long>: -{' | 40' * more}\n"
            f"  sum_runs_kernel<float, int>: 32{' | 40' * more}\n"), out)
        self.assertNotIn("grid_sampler_2d_records_kernel", out)  # the run sums alone

    def test_the_core_over_its_budget_fails_and_is_recorded(self):
        record = self.tmp / "machine_code.json"
        rc, out, _ = self._builds("--machine-code-json", str(record),
                                  core=self._core(lines=701, kernels=41))
        self.assertEqual(rc, 1)
        self.assertIn("OVER BUDGET (core, failed): 701 lines > 700\n"
                      "OVER BUDGET (core, failed): 41 kernels > 40\n"
                      "core budget: OVER BUDGET, 2 finding(s); failed\n", out)
        written = json.loads(record.read_text())
        self.assertIs(written["budget_met"], False)
        self.assertEqual(written["over_budget"], ["core: 701 lines > 700", "core: 41 kernels > 40"])

    def test_the_whole_stack_over_budget_fails_and_is_recorded(self):
        record = self.tmp / "machine_code.json"
        builds = [self._core_build(level) for level in CORE_BUILDS[1:-1]]
        builds.append(self._core_build(self.top, kernels=101, text_bytes=int(1.6 * 2**20) + 1))
        rc, out, _ = self._builds("--machine-code-json", str(record), builds=builds)
        self.assertEqual(rc, 1, out)
        self.assertIn("core budget: met\n", out)
        self.assertIn(f"OVER BUDGET (whole stack, failed): whole stack ({self.top}): 101 kernels "
                      "> 100\n"
                      f"OVER BUDGET (whole stack, failed): whole stack ({self.top}): 1.60 MiB of "
                      ".text > 1.60 MiB\n"
                      f"whole stack budget ({self.top}): OVER BUDGET, 2 finding(s); failed\n", out)
        written = json.loads(record.read_text())
        self.assertIs(written["budget_met"], False)
        self.assertEqual(written["over_budget"],
                         [f"whole stack ({self.top}): 101 kernels > 100",
                          f"whole stack ({self.top}): 1.60 MiB of .text > 1.60 MiB"])
        # the top-level count stays the core's
        self.assertEqual((written["kernels"], written["text_bytes"]), (38, 966784))
        # at the budget: met
        builds[-1] = self._core_build(self.top, kernels=100, text_bytes=int(1.6 * 2**20))
        rc, out, _ = self._builds(builds=builds)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"whole stack budget ({self.top}): met\n", out)

    def test_builds_needs_the_core_and_every_speed_levels_build_once(self):
        (self.tmp / "bad.json").write_text('{"lines": 600}')
        for core, message in ((str(self.tmp / "none.json"), "cannot read"),
                              (str(self.tmp / "bad.json"), "not a `core --json` file"),
                              (self._core_build(self.top), "not the core's (give it as "
                                                           "--core-build)")):
            self._assert_refused(message, core=core)
        for builds, message in (
                ([], f"no --core-build of {', '.join(CORE_BUILDS[1:])}"),
                ([self._core_build("nonesuch")], "core build 'nonesuch' is not a speed level's"),
                ([self._core()], "core build 'core' is not a speed level's"),
                ([self._core_build(self.top)] * 2, "is measured twice"),
                ([str(self.tmp / "bad.json")], "not a `core --json` file"),
                ([str(self.tmp / "none.json")], "cannot read")):
            self._assert_refused(message, builds=builds)


if __name__ == "__main__":
    run_tests()
