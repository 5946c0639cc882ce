# Owner(s): ["module: nn"]
"""The machine-code audit (tools/detgrid/kit/sass_audit.py) on small, hand-written
excerpts of ptxas -v and nvdisasm -g -gi output. CI runs it on the real sm_90
build (.ci/sass_audit.sh); these tests pin what it accepts and refuses."""

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

UNIT_NAMESPACE = "_ZN2at6native60_GLOBAL__N__ffb48525_27_GridSamplerDeterministic_cu_7dd603db"
OURS = UNIT_NAMESPACE + "15sum_runs_kernelINS0_26grid_sampler_deterministic12ReduceSparseIfiEEiiEEvT_T0_T1_"
# What every stage ran through before issue 32.
GENERIC = (UNIT_NAMESPACE + "15for_each_kernelINS0_26grid_sampler_deterministic23MarkDestinationSegmentsEiEEvT_T0_")
CUB_KERNEL = "_ZN14at_cuda_detail3cub6detail4scan20DeviceScanInitKernelINS0_13ScanTileStateIiLb1EEEEEvT_i"
# CUB's scan of the hot fold's term (HotKeys<CellSegments<int, 2>>).
SCAN_OF_OUR_TERM = (
    "_ZN14at_cuda_detail3cub6detail4scan16DeviceScanKernelINS2_10policy_hubIiiijN4cud"
    "a3std3__44plusIvEEE10Policy1000EN2at6native60_GLOBAL__N__7d8f809e_27_GridSampler"
    "Deterministic_cu_9c525fa912TermIteratorINSD_26grid_sampler_deterministic7HotKeys"
    "INSG_12CellSegmentsIiLi2EEEEEEEPiNS0_13ScanTileStateIiLb1EEES9_NS0_8NullTypeEjiLb0ESP_EEvT0_T1_T2_iT3_T4_T5_")
CUH = "/src/ATen/native/cuda/GridSamplerDeterministic.cuh"
# Kernels of an ExactCuda.cu build: two exact stages, and one of the
# pipeline's that the unit's inclusion of GridSamplerDeterministic.cu brings.
EXACT_NAMESPACE = "_ZN2at6native45_GLOBAL__N__014824c8_12_ExactCuda_cu_7dd603db"
SCATTER = (EXACT_NAMESPACE
           + "26scatter_exact_terms_kernelIN7detgrid5exact12ScatterTermsILi4ELi2EfiiEEiiEEvT_T0_T1_")
SPARSE = (EXACT_NAMESPACE
          + "21sum_runs_exact_kernelIN7detgrid5exact17ReduceExactSparseILi4ELi2EfiiEEiiEEvT_T0_T1_")
# A kernel of a GridGradient.cu build (the extension's grad_grid).
GRID_GRADIENT = (
    "_ZN2at6native48_GLOBAL__N__fc89ace5_15_GridGradient_cu_faa09a9936grid_sampler_2d_grid_"
    "gradient_kernelIN3c104HalfEiEEvT0_NS_4cuda6detail10TensorInfoIKT_S5_EESB_SB_PS9_NS0_6detail"
    "24GridSamplerInterpolationENSD_18GridSamplerPaddingEb")
POINT_PASS_IN_EXACT_UNIT = (
    EXACT_NAMESPACE + "33grid_sampler_point_records_kernelINS0_26grid_sampler_deterministic9PointPass"
    "ILi2ENS3_12BackwardArgsIN3c108BFloat16ElLi3EEEEElEEvT_T0_")
EXACT_SUM = "/src/extension/exact/ExactSum.cuh"
GRID_GRADIENT_SOURCE = "/src/extension/GridGradient.cu"
ATOMICS_HEADER = "/usr/local/cuda/include/device_atomic_functions.hpp"


def _sass(body, name=OURS):
    return f".text.{name}:\n" + textwrap.dedent(body)


def _loc(path, line, inlined_at=None):
    text = f'\t//## File "{path}", line {line}'
    if inlined_at:
        text += f' inlined at "{inlined_at[0]}", line {inlined_at[1]}'
    return text + "\n"


def _listing(instructions, labels, locations=None):
    """SASS of one function body: instructions[k] at offset 0x10 * (k + 1),
    labels by offset, each instruction at locations.get(k, (CUH, 880))."""
    locations = locations or {}
    body = ""
    for k, text in enumerate(instructions):
        offset = 0x10 * (k + 1)
        if offset in labels:
            body += labels[offset] + ":\n"
        body += _loc(*locations.get(k, (CUH, 880)))
        body += f"        /*{offset:04x}*/                   {text} ;\n"
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


class TestSassAudit(TestCase):

    def test_fused_multiply_add_in_our_arithmetic_is_refused(self):
        sass = _sass(_loc(CUH, 60, ("/x.cu", 99)) + _loc("/x.cu", 99)
                     + "        /*0010*/                   FFMA R1, R2, R3, R4 ;\n")
        lines = _Lines({(CUH, 60): "  return a * b + c;"})
        found = sass_audit.fused_violations(sass_audit.parse_sass(sass), lines)
        self.assertEqual(len(found), 1)
        self.assertIn("GridSamplerDeterministic.cuh:60", found[0])

    def test_fused_instruction_on_a_line_without_multiplication_is_library_code(self):
        # fmodf's expansion, emitted without line info of its own, inherits
        # the line before it (here a comparison): no contraction of ours.
        sass = _sass(_loc(CUH, 280) + "        /*0010*/                   FFMA R1, -R2, R3, R4 ;\n")
        lines = _Lines({(CUH, 280): "  if (distance < static_cast<T>(0)) {"})
        self.assertEqual(sass_audit.fused_violations(sass_audit.parse_sass(sass), lines), [])

    def test_innermost_frame_of_an_inlined_location_decides(self):
        # fmod from CUDA's headers inlined into our line: library code.
        sass = _sass(_loc("/usr/include/c++/12/cmath", 280, (CUH, 163)) + _loc(CUH, 163)
                     + "        /*0010*/                   FFMA R1, -|R2|, R3, R4 ;\n")
        self.assertEqual(sass_audit.fused_violations(sass_audit.parse_sass(sass), _Lines({})), [])

    def test_expansion_of_a_correctly_rounded_division_is_allowed(self):
        sass = _sass(_loc(CUH, 64) + "        /*0010*/                   FFMA R1, -R2, R3, 1 ;\n")
        lines = _Lines({(CUH, 64): "  return __fdiv_rn(a, b);"})
        self.assertEqual(sass_audit.fused_violations(sass_audit.parse_sass(sass), lines), [])

    def test_compiler_subroutines_and_constant_idioms_are_not_ours(self):
        sass = _sass(_loc(CUH, 70)
                     + "        /*0010*/                   HFMA2.MMA R5, -RZ, RZ, 1.875, 0 ;\n"
                     + "        /*0020*/                   EXIT ;\n"
                     + "$__internal_1_$__cuda_sm3x_div_rn_noftz_f32_slowpath:\n"
                     + "        /*0030*/                   FFMA R1, R2, R3, R4 ;\n"
                     + "        /*0040*/                   FADD.FTZ R1, R2, R3 ;\n"
                     + "        /*0050*/                   RET.REL.NODEC R6 `(.L_x_1) ;\n")
        functions = sass_audit.parse_sass(sass)
        self.assertEqual(sass_audit.fused_violations(functions, _Lines({})), [])
        self.assertEqual(sass_audit.ftz_violations(functions), [])

    def test_flush_to_zero_arithmetic_is_refused(self):
        sass = _sass(_loc(CUH, 60) + "        /*0010*/                   FMUL.FTZ R1, R2, R3 ;\n"
                     + "        /*0020*/                   F2I.FTZ.U32.TRUNC.NTZ R4, R2 ;\n")
        found = sass_audit.ftz_violations(sass_audit.parse_sass(sass))
        self.assertEqual(len(found), 1)
        self.assertIn("FMUL.FTZ", found[0])

    def test_kernels_not_ours_are_ignored(self):
        sass = _sass(_loc(CUH, 60) + "        /*0010*/                   FFMA R1, R2, R3, R4 ;\n",
                     name="_ZN13at_cuda_detail3cub11DeviceRadixSortKernel")
        self.assertEqual(sass_audit.fused_violations(sass_audit.parse_sass(sass), _Lines({})), [])

    def test_ptxas_resources_and_spill_allowances(self):
        log = textwrap.dedent(f"""\
            ptxas info    : Compiling entry function '{OURS}' for 'sm_90'
            ptxas info    : Function properties for {OURS}
                16 bytes stack frame, 24 bytes spill stores, 12 bytes spill loads
            ptxas info    : Used 80 registers, used 0 barriers, 16 bytes cumulative stack size
            """)
        resources = sass_audit.parse_ptxas(log)
        self.assertEqual(resources[OURS], sass_audit.Resources(80, 16, 24, 12))
        self.assertEqual(len(sass_audit.resource_violations(resources, [])), 1)
        self.assertEqual(sass_audit.resource_violations(resources, ["ReduceSparse<float"]), [])

    def test_cubs_scan_of_a_term_of_ours_is_reported_not_failed(self):
        # The hot fold's sum over its slots: CUB's kernel, named by CUB, whose
        # template arguments carry our term's type.
        scan = SCAN_OF_OUR_TERM
        log = textwrap.dedent(f"""\
            ptxas info    : Function properties for {scan}
                272 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
            ptxas info    : Used 64 registers, used 1 barriers, 272 bytes cumulative stack size
            """)
        resources = sass_audit.parse_ptxas(log)
        self.assertEqual(sass_audit.resource_violations(resources, []), [])
        self.assertEqual(sass_audit.cub_frames(resources),
                         ["DeviceScanKernel of HotKeys<CellSegments<int, 2> >: 272 B stack frame, "
                          "0 B spill stores, 0 B spill loads"])
        self.assertEqual(sass_audit.generic_kernels([scan]), [])

    def test_inner_loop_cost_counts_body_and_called_subroutines(self):
        sass = _sass(_loc(CUH, 880)
                     + ".L_x_1:\n"
                     + "        /*0010*/                   LDG.E R1, desc[UR4][R2.64] ;\n"
                     + "        /*0020*/                   CALL.REL.NOINC `($__internal_2_$__cuda_sm20_div_s64) ;\n"
                     + "        /*0030*/                   FMUL R3, R1, R4 ;\n"
                     + "        /*0040*/                   FADD R5, R5, R3 ;\n"
                     + "        /*0050*/              @P0 BRA `(.L_x_1) ;\n"
                     + "        /*0060*/                   EXIT ;\n"
                     + "$__internal_2_$__cuda_sm20_div_s64:\n"
                     + "        /*0070*/                   IADD3 R1, R1, 1, RZ ;\n"
                     + "        /*0080*/                   RET.REL.NODEC R6 `(.L_x_2) ;\n")
        function = next(iter(sass_audit.parse_sass(sass).values()))
        cost = sass_audit.inner_loop_cost(function)
        self.assertEqual((cost.body, cost.calls, cost.callee), (5, 1, 2))
        self.assertEqual(cost.total, 7)

    def test_setup_counts_from_the_element_loop_head_to_the_fold(self):
        # Element loop .L_x_1 (0x10-0x90) holds the loop over partials
        # .L_x_2 (0x40-0x80), which holds the record loop .L_x_3 (0x50-0x70):
        # three instructions per element come before the fold.
        ins = ["IMAD R1, R2, R3, RZ", "LDG.E.64 R4, desc[UR4][R6.64]", "ISETP.GE.AND P0, PT, R4, R5, PT",
               "MOV R7, RZ", "LDG.E R8, desc[UR4][R6.64]", "FMUL R9, R8, R10", "FADD R7, R7, R9",
               "@P1 BRA `(.L_x_3)", "@P2 BRA `(.L_x_2)", "@P3 BRA `(.L_x_1)", "EXIT"]
        labels = {0x10: ".L_x_1", 0x40: ".L_x_2", 0x50: ".L_x_3"}
        function = self._function(ins, labels)
        cost = sass_audit.inner_loop_cost(function)
        self.assertEqual(cost.body, 4)
        self.assertEqual(sass_audit.setup_cost(function, cost.loop), 3)

    @staticmethod
    def _function(ins, labels):
        body = ""
        for k, text in enumerate(ins):
            offset = 0x10 * (k + 1)
            if offset in labels:
                body += labels[offset] + ":\n"
            body += f"        /*{offset:04x}*/                   {text} ;\n"
        return next(iter(sass_audit.parse_sass(_sass(_loc(CUH, 880) + body)).values()))

    def test_setup_is_the_shortest_path_to_the_fold(self):
        # A block the element can branch around (0x40-0x60, say a group's
        # set-up laid out before a single channel's fold) does not count:
        # 0x10, 0x20, then 0x30's branch to the partials loop at 0x70.
        ins = ["IMAD R1, R2, R3, RZ", "ISETP.GE.AND P0, PT, R4, R5, PT", "@P0 BRA `(.L_x_2)",
               "MOV R7, RZ", "MOV R8, RZ", "BRA `(.L_x_4)",
               "LDG.E R8, desc[UR4][R6.64]", "FMUL R9, R8, R10", "FADD R7, R7, R9",
               "@P1 BRA `(.L_x_3)", "@P2 BRA `(.L_x_2)", "@P3 BRA `(.L_x_1)", "EXIT",
               "@P3 BRA `(.L_x_1)"]
        labels = {0x10: ".L_x_1", 0x70: ".L_x_2", 0x80: ".L_x_3", 0xe0: ".L_x_4"}
        function = self._function(ins, labels)
        cost = sass_audit.inner_loop_cost(function)
        self.assertEqual(cost.body, 3)
        self.assertEqual(sass_audit.setup_cost(function, cost.loop), 3)

    def test_a_group_loop_costs_per_record_what_its_channels_execute(self):
        # Record loop 0x10-0xa0: a shared load, then per channel a multiply
        # and an add, each channel behind a test that leaves the chain.
        ins = ["LDG.E R1, desc[UR4][R2.64]",
               "FMUL R3, R1, R4", "FADD R5, R5, R3", "@P0 BRA `(.L_x_2)",
               "FMUL R6, R1, R7", "FADD R8, R8, R6", "@P1 BRA `(.L_x_2)",
               "FMUL R9, R1, R10", "FADD R11, R11, R9",
               "@P2 BRA `(.L_x_1)", "EXIT"]
        labels = {0x10: ".L_x_1", 0xa0: ".L_x_2"}
        function = self._function(ins, labels)
        loop = sass_audit.group_loop(function, "FMUL")
        self.assertEqual(loop, (0, 9))
        self.assertEqual([sass_audit.record_cost(function, loop, c) for c in (1, 2, 3)],
                         [1 + 3 + 1, 1 + 6 + 1, 1 + 8 + 1])
        self.assertIsNone(sass_audit.record_cost(function, loop, 4))

    def test_setup_limit_applies_to_2d_fp32_dense_reduces(self):
        dense = ("sum_segments_channels_fastest_kernel<ReduceDenseChannelsFastest<DenseFold<"
                 "CellSegments<int, 2>, float, int> >, int>")
        per_tap = ("sum_segments_per_destination_kernel<ReduceDense<DenseFold<"
                   "DestinationSegments<int>, float, int> >, int, int>")
        dense_3d = ("sum_segments_per_destination_kernel<ReduceDense<DenseFold<"
                    "CellSegments<int, 3>, float, int> >, int, int>")
        sparse = "sum_runs_kernel<ReduceSparse<float, int>, int, int>"
        loop = sass_audit.LoopCost(46, 0, 0)
        rows = [sass_audit.ReduceCost(dense, loop, 81), sass_audit.ReduceCost(per_tap, loop, 81),
                sass_audit.ReduceCost(dense_3d, loop, 200), sass_audit.ReduceCost(sparse, loop, 200)]
        self.assertEqual(len(sass_audit.setup_violations(rows)), 2)
        rows[0].setup = rows[1].setup = 80
        self.assertEqual(sass_audit.setup_violations(rows), [])

    def test_exact_scope_holds_the_extensions_own_stages_alone(self):
        for name in (SCATTER, SPARSE):
            self.assertRegex(name, sass_audit.EXACT.kernel)
            self.assertNotRegex(name, sass_audit.PIPELINE.kernel)
        self.assertNotRegex(GRID_GRADIENT, sass_audit.EXACT.kernel)
        # Audited in the release build, not again in the exact one.
        self.assertNotRegex(POINT_PASS_IN_EXACT_UNIT, sass_audit.EXACT.kernel)
        self.assertNotRegex(POINT_PASS_IN_EXACT_UNIT, sass_audit.PIPELINE.kernel)
        self.assertNotRegex(OURS, sass_audit.EXACT.kernel)

    def test_fused_multiply_add_in_exact_arithmetic_is_refused_in_exact_scope(self):
        sass = _sass(_listing(["FFMA R1, R2, R3, R4", "FMUL.FTZ R1, R2, R3"], {},
                              {0: (EXACT_SUM, 240), 1: (EXACT_SUM, 240)}), name=SCATTER)
        functions = sass_audit.parse_sass(sass)
        lines = _Lines({(EXACT_SUM, 240): "  const T t = w * g + s;"})
        found = sass_audit.fused_violations(functions, lines, sass_audit.EXACT)
        self.assertEqual(len(found), 1)
        self.assertIn("ExactSum.cuh:240", found[0])
        self.assertEqual(len(sass_audit.ftz_violations(functions, sass_audit.EXACT)), 1)
        # The pipeline's scope knows neither the kernel nor the file.
        self.assertEqual(sass_audit.fused_violations(functions, lines), [])

    def test_grid_gradient_scope_holds_its_kernels_alone(self):
        self.assertRegex(GRID_GRADIENT, sass_audit.GRID_GRADIENT.kernel)
        self.assertNotRegex(GRID_GRADIENT, sass_audit.PIPELINE.kernel)
        for name in (SCATTER, SPARSE, OURS):
            self.assertNotRegex(name, sass_audit.GRID_GRADIENT.kernel)

    def test_fused_multiply_add_in_the_grid_gradient_is_refused(self):
        sass = _sass(_listing(["FFMA R1, R2, R3, R4"], {}, {0: (GRID_GRADIENT_SOURCE, 30)}),
                     name=GRID_GRADIENT)
        lines = _Lines({(GRID_GRADIENT_SOURCE, 30): "  gix -= val * weight * gOut;"})
        functions = sass_audit.parse_sass(sass)
        found = sass_audit.fused_violations(functions, lines, sass_audit.GRID_GRADIENT)
        self.assertEqual(len(found), 1)
        self.assertIn("GridGradient.cu:30", found[0])
        # The exact scope no longer knows the kernel.
        self.assertEqual(sass_audit.fused_violations(functions, lines, sass_audit.EXACT), [])

    def test_exact_kernels_may_not_spill(self):
        log = textwrap.dedent(f"""\
            ptxas info    : Function properties for {SPARSE}
                16 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads
            ptxas info    : Used 32 registers, used 0 barriers, 16 bytes cumulative stack size
            ptxas info    : Function properties for {POINT_PASS_IN_EXACT_UNIT}
                8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
            """)
        found = sass_audit.resource_violations(sass_audit.parse_ptxas(log), [], sass_audit.EXACT)
        self.assertEqual(len(found), 1)
        self.assertIn("16 B stack frame", found[0])

    def test_exact_reduce_costs_its_record_loop(self):
        # Column loop .L_x_1 (0x10-0x70) around the record loop .L_x_2
        # (0x20-0x50): the term's FMUL, its words' 64-bit adds.
        ins = ["LDG.E R1, desc[UR4][R2.64]", "LDG.E R5, desc[UR4][R6.64]", "FMUL R7, R5, R8",
               "IADD3 R10, P0, R10, R7, RZ", "@P1 BRA `(.L_x_2)", "STG.E.64 desc[UR4][R2.64], R10",
               "@P2 BRA `(.L_x_1)", "EXIT"]
        sass = _sass(_listing(ins, {0x10: ".L_x_1", 0x20: ".L_x_2"}), name=SPARSE)
        cost, atomics = sass_audit.exact_loop_cost(sass_audit.parse_sass(sass)[SPARSE])
        self.assertEqual((cost.body, cost.calls, atomics), (4, 0, 0))

    def test_scatter_counts_global_atomics_per_term(self):
        # The loop over terms .L_x_1: three word adds and the flag's OR, the
        # atomics attributed to CUDA's header; a warp reduction and a
        # shared-memory atomic are not global atomics.
        ins = ["LDG.E R1, desc[UR4][R2.64]", "FMUL R3, R1, R4",
               "REDG.E.ADD.64.STRONG.GPU desc[UR8][R8.64], R10",
               "REDG.E.ADD.64.STRONG.GPU desc[UR8][R8.64], R12",
               "REDG.E.ADD.64.STRONG.GPU desc[UR8][R8.64], R14",
               "REDG.E.OR.STRONG.GPU desc[UR8][R8.64], R22", "REDUX.MAX.S32 UR5, R3",
               "ATOMS.ADD RZ, [R5], R6", "@P0 BRA `(.L_x_1)", "EXIT"]
        at_header = {k: (ATOMICS_HEADER, 226) for k in (2, 3, 4, 5)}
        sass = _sass(_listing(ins, {0x10: ".L_x_1"}, at_header), name=SCATTER)
        cost, atomics = sass_audit.exact_loop_cost(sass_audit.parse_sass(sass)[SCATTER])
        self.assertEqual((cost.body, atomics), (9, 4))

    def test_exact_audit_prints_each_loop_and_fails_on_a_spill(self):
        ins = ["LDG.E R1, desc[UR4][R2.64]", "FMUL R3, R1, R4",
               "REDG.E.ADD.64.STRONG.GPU desc[UR8][R8.64], R10", "@P0 BRA `(.L_x_1)", "EXIT"]
        log = textwrap.dedent(f"""\
            ptxas info    : Function properties for {SCATTER}
                8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
            ptxas info    : Used 30 registers, used 0 barriers, 8 bytes cumulative stack size
            """)
        files = {"ptxas": log, "sass": _sass(_listing(ins, {0x10: ".L_x_1"}), name=SCATTER)}
        rc, out, _, _ = _run_audit(files, "--ptxas-log", "{ptxas}", "--sass", "{sass}",
                                   "--exact", "--loops")
        lines = out.splitlines()
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("FAIL (stack frames or spills): "), lines)
        self.assertIn("per-term=4 (0 calls) atomics=1 regs=30  scatter_exact_terms_kernel<"
                      "ScatterTerms<4, 2, float, int, int>, int, int>", out)
        self.assertEqual(lines[-1], "sass audit: 1 detgrid extension kernels, 5 instructions; "
                                    "1 problem(s)")

    def test_an_exact_loop_not_found_is_printed_not_dropped(self):
        sass = _sass(_listing(["IADD3 R1, R1, 1, RZ", "@P0 BRA `(.L_x_1)", "EXIT"],
                              {0x10: ".L_x_1"}), name=SPARSE)
        rows = sass_audit.exact_loop_table(sass_audit.parse_sass(sass), {})
        self.assertEqual([(row.stage, row.loop, row.atomics) for row in rows],
                         [("ReduceExactSparse", None, None)])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            sass_audit.print_exact_loops(rows)
        self.assertIn("per-record=? (no loop found) regs=None", stdout.getvalue())

    def test_kernel_name_is_read_from_the_mangled_name(self):
        self.assertEqual(sass_audit.kernel_name(OURS), "sum_runs_kernel")
        self.assertEqual(sass_audit.kernel_name(GENERIC), "for_each_kernel")
        self.assertEqual(sass_audit.kernel_name(CUB_KERNEL), "DeviceScanInitKernel")
        self.assertEqual(sass_audit.kernel_name(POINT_PASS_IN_EXACT_UNIT),
                         "grid_sampler_point_records_kernel")
        self.assertEqual(sass_audit.kernel_name("_Z6simplev"), "simple")
        self.assertEqual(sass_audit.kernel_name("not_mangled"), "not_mangled")

    def test_generic_stage_runners_and_unnamed_kernels_are_refused(self):
        unnamed = UNIT_NAMESPACE + "11some_kernelEv"
        found = sass_audit.generic_kernels([OURS, GENERIC, unnamed, CUB_KERNEL])
        self.assertEqual(len(found), 2)
        self.assertIn("for_each_kernel is a generic stage runner: for_each_kernel<MarkDestinationSegments, "
                      "int>", found)
        self.assertIn("some_kernel is not one of the unit's named stage kernels "
                      "(sass_audit.STAGE_KERNELS)", found)
        self.assertEqual(sass_audit.generic_kernels([OURS, CUB_KERNEL]), [])

    def test_budget_allows_128_kernels_and_3_mib_and_no_more(self):
        within = sass_audit.MachineCode("sm_90", 128, 3 * 2**20)
        self.assertEqual(sass_audit.budget_violations(within), [])
        over = sass_audit.MachineCode("sm_90", 129, 3 * 2**20 + 1)
        self.assertEqual(sass_audit.budget_violations(over),
                         ["129 kernels > 128", "3.00 MiB of .text > 3.00 MiB"])

    def test_text_sections_of_a_cubin_are_its_kernels(self):
        cubin = _cubin([(".nv.info." + OURS, 100), (".text." + OURS, 4096),
                        (".rela.text." + OURS, 24), (".text." + CUB_KERNEL, 512)])
        self.assertEqual(sass_audit.elf_text_sections(cubin), {OURS: 4096, CUB_KERNEL: 512})
        with self.assertRaisesRegex(ValueError, "not a 64-bit ELF"):
            sass_audit.elf_text_sections(b"// SASS, not a cubin")

    def test_kernel_families_sum_each_kernel_name(self):
        point_pass = OURS.replace("15sum_runs_kernel", "33grid_sampler_point_records_kernel")
        sections = {OURS: 100, OURS + "x": 50, point_pass: 1000, CUB_KERNEL: 10}
        self.assertEqual(sass_audit.kernel_families(sections),
                         [("grid_sampler_point_records_kernel", 1, 1000),
                          ("sum_runs_kernel", 2, 150), ("DeviceScanInitKernel", 1, 10)])

    def test_reduce_table_takes_the_named_reduces_with_their_registers(self):
        loop = _listing(["LDG.E R1, desc[UR4][R2.64]", "FMUL R3, R1, R4", "FADD R5, R5, R3",
                         "@P0 BRA `(.L_x_1)", "EXIT"], {0x10: ".L_x_1"})
        point_pass = OURS.replace("15sum_runs_kernel", "33grid_sampler_point_records_kernel")
        functions = sass_audit.parse_sass(_sass(loop) + _sass(loop, name=point_pass))
        rows = sass_audit.reduce_loop_table(functions, {OURS: sass_audit.Resources(registers=30)})
        self.assertEqual([(row.kernel, row.per_record.total, row.registers) for row in rows],
                         [("sum_runs_kernel<ReduceSparse<float, int>, int, int>", 4, 30)])

    def test_budget_audit_prints_the_unit(self):
        sass = "\t.target\tsm_90\n" + _sass(_listing(["IADD3 R1, R1, 1, RZ", "EXIT"], {}))
        files = {"ptxas": "", "sass": sass,
                 "cubin": _cubin([(".text." + OURS, 4096), (".text." + CUB_KERNEL, 512)])}
        rc, out, _, after = _run_audit(files, "--ptxas-log", "{ptxas}", "--sass", "{sass}",
                                       "--cubin", "{cubin}")
        self.assertEqual(rc, 0, out)
        self.assertIn("machine code: 2 kernels, 0.00 MiB of sm_90 .text (4608 bytes; "
                      "budget 128 kernels, 3.00 MiB)", out)
        self.assertIn("family sum_runs_kernel: 1 kernels, 4.0 KiB", out)
        # benchmarks/machine_code.json is `levels`' to write (the core's count, what
        # `detgrid report` cites: TestLevels), not a pipeline build's
        self.assertEqual(sorted(after), ["cubin", "ptxas", "sass"])

    def test_budget_audit_fails_on_a_generic_stage_runner(self):
        sass = _sass(_listing(["IADD3 R1, R1, 1, RZ", "EXIT"], {}), name=GENERIC)
        files = {"ptxas": "", "sass": sass,
                 "cubin": _cubin([(".text." + GENERIC, 256)])}
        rc, out, _, _ = _run_audit(files, "--ptxas-log", "{ptxas}", "--sass", "{sass}",
                                   "--cubin", "{cubin}")
        self.assertEqual(rc, 1)
        self.assertTrue(out.startswith("FAIL (kernel not named after its stage): for_each_kernel"),
                        out)

    def test_bad_budget_arguments_are_one_line_errors(self):
        files = {"ptxas": "", "sass": _sass("", name=SCATTER), "cubin": "SASS"}
        for flags, message in (
                (["--cubin", "{cubin}", "--exact"], "--cubin is the upstream unit's"),
                (["--cubin", "{cubin}"], "cubin: not a cubin")):
            rc, _, err, _ = _run_audit(files, "--ptxas-log", "{ptxas}", "--sass", "{sass}",
                                       *flags)
            self.assertEqual(rc, 2)
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn(message, err)

    def test_level_and_level_json_need_cubin_and_each_other(self):
        files = {"ptxas": "", "sass": _sass(""), "cubin": _cubin([(".text." + OURS, 256)])}
        for flags, message in (
                (["--level", "pipeline"], "--level and --level-json need --cubin"),
                (["--level-json", "{work}/level.json"], "--level and --level-json need --cubin"),
                (["--cubin", "{cubin}", "--level-json", "{work}/level.json"],
                 "--level-json needs --level")):
            rc, _, err, after = _run_audit(files, "--ptxas-log", "{ptxas}", "--sass", "{sass}",
                                           *flags)
            self.assertEqual(rc, 2)
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn(message, err)
            self.assertNotIn("level.json", after)

    def test_unreadable_input_is_a_one_line_error(self):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(["--ptxas-log", "/nonexistent/ptxas.txt", "--sass", "/dev/null"])
        self.assertEqual(rc, 2)
        self.assertEqual(stderr.getvalue().count("\n"), 1)
        self.assertIn("cannot read /nonexistent/ptxas.txt", stderr.getvalue())


def _fake_kit(kit, pipeline_lines=10, core_lines=600, level_lines=64):
    """A kit whose pipeline's ATen files hold every level's files: the pipeline header includes
    the dense level's header in a marked line and has a block of the hot-fold level; the
    first level's .cuh has ``pipeline_lines`` lines. The upstream core's one file has
    ``core_lines`` lines; each speed level of the stack's diff adds ``level_lines`` to it."""
    from detgrid.kit import stack, textdiff

    folder = Path(kit) / stack.PIPELINE_ROOT / stack.KERNEL_DIR
    folder.mkdir(parents=True)
    for name in stack.kernel_files(stack.TOP):
        (folder / name).write_text(f"// {name}\n")
    (folder / "GridSamplerDeterministic.cuh").write_text("int first;\n" * pipeline_lines)
    (folder / "GridSamplerDeterministicPipeline.cuh").write_text(
        "#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh> // [stack: dense]\n"
        "int pipeline;\n"
        "// [stack: hot-fold]\n"
        "int hot;\n"
        "// [end stack: hot-fold]\n")
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

        self.assertEqual(sass_audit.core_budget_violations(core(700, 40, 2**20)), [])
        self.assertEqual(sass_audit.core_budget_violations(core(701, 41, 2**20 + 1)),
                         ["701 lines > 700", "41 kernels > 40", "1.00 MiB of .text > 1.00 MiB"])

    def test_fused_multiply_adds_are_counted_per_family_and_reported_not_failed(self):
        sums = [("FFMA R1, R2, R3, R1", (CORE_CU, 328)), ("DFMA R2, R4, R6, R2", (CORE_CU, 328)),
                ("HFMA2.MMA R5, -RZ, RZ, 1.875, 0", (CORE_CU, 330)),  # a constant, not arithmetic
                ("FFMA R1, -R2, R3, 1", (CORE_CU, 261), True)]  # a division's slow path
        records = [("FFMA R1, R2, R3, R4", (ATEN_GRID_SAMPLER, 44)),
                   ("FFMA R1, R2, R3, R4", (ATEN_GRID_SAMPLER, 44)),
                   ("FFMA R1, R2, R3, R4", (CORE_CU, 176))]
        rc, out, err, after = self._audit(_core_unit(sums, records), "--json", "{work}/core.json")
        self.assertEqual(rc, 0, out + err)
        self.assertNotIn("FAIL", out)
        self.assertIn("fused family sum_runs_kernel (1 kernels): FFMA=2 DFMA=1 HFMA2=0 (by design, "
                      "not failed; by source: GridSamplerDeterministic.cu 2, subroutines 1)\n", out)
        self.assertIn("fused family grid_sampler_2d_records_kernel (1 kernels): FFMA=3 DFMA=0 "
                      "HFMA2=0 (by design, not failed; by source: GridSampler.cuh 2, "
                      "GridSamplerDeterministic.cu 1)\n", out)
        self.assertTrue(out.endswith("sass audit (core): 2 kernels of its own, 9 instructions, "
                                     "FFMA=5 DFMA=1 HFMA2=0 (reported); 0 problem(s), "
                                     "1 reported, not failed\n"), out)
        record = json.loads(after["core.json"])
        self.assertEqual(record["fused"]["sum_runs_kernel"],
                         {"kernels": 1, "FFMA": 2, "DFMA": 1, "HFMA2": 0,
                          "by_source": {"GridSamplerDeterministic.cu": 2, "subroutines": 1}})
        # The pipeline's audit refuses the same contraction on a line of its own.
        functions = sass_audit.parse_sass(_core_unit(sums, records)[1])
        self.assertEqual(len(sass_audit.fused_violations(
            functions, _Lines({(CORE_CU, 328): "partial += w * g;"}))), 2)

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
        for unit, message in (((log, _sass(_listing(["EXIT"], {}), name=CUB_SWEEP), cubin),
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
        self.assertEqual(sass_audit.STACK_BUDGET, sass_audit.LevelBudget(100, int(1.6 * 2**20)))
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


class TestLevels(TestCase):
    """The pipeline's levels: `cut` writes a level's ATen files, `levels` sets the core's
    machine code against its budget (failed past it) and the built levels' and every level's
    lines against the whole pipeline's (reported past it), and records them."""

    def setUp(self):
        from detgrid.kit import stack

        self.top = stack.TOP
        self.levels = stack.LEVEL_NAMES
        self.first = stack.LEVEL_NAMES[0]
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-sass-levels-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)

    def _main(self, *argv):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(list(argv))
        return rc, stdout.getvalue(), stderr.getvalue()

    def _measure(self, level, kernels, text_bytes, spills=0):
        """A --level-json file, as the audit of a build of that level writes it."""
        (self.tmp / "measured").mkdir(exist_ok=True)
        sass_audit.write_level_json(sass_audit.MachineCode("sm_90", kernels, text_bytes), level,
                                    str(self.tmp / "measured" / f"{level}.json"), spills)

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

    def _levels(self, *flags, core=None, builds=None):
        """`levels` with the core's measurement and each speed level's core build's (``builds``:
        their files; default each as _core_build makes it)."""
        if builds is None:
            builds = [self._core_build(level) for level in CORE_BUILDS[1:]]
        return self._main("levels", "--kit", str(self.tmp / "kit"), "--core", core or self._core(),
                          *[arg for path in builds for arg in ("--core-build", path)],
                          "--measured", str(self.tmp / "measured"), *flags)

    def _assert_levels_refuse(self, message, core=None, builds=None):
        """`levels` with these inputs fails in one line naming ``message`` and writes no
        machine_code.json."""
        rc, out, err = self._levels("--machine-code-json", str(self.tmp / "m.json"),
                                    core=core, builds=builds)
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(message, err)
        self.assertFalse((self.tmp / "m.json").exists())

    def test_cut_writes_a_pipeline_level_as_the_stack_cuts_it(self):
        from detgrid.kit import stack

        _fake_kit(self.tmp / "kit")
        rc, out, err = self._main("cut", "--kit", str(self.tmp / "kit"),
                                  "--into", str(self.tmp / "src"), "--level", self.first)
        self.assertEqual(rc, 0, err)
        include = self.tmp / "src" / self.first / "aten" / "src"
        self.assertEqual(out, f"{self.first} {include} {10 + 1 + 1 + 1}\n")
        folder = include / "ATen" / "native" / "cuda"
        self.assertEqual(sorted(p.name for p in folder.iterdir()),
                         sorted(stack.kernel_files(self.first)))
        self.assertEqual((folder / "GridSamplerDeterministicPipeline.cuh").read_text(),
                         "int pipeline;\n")
        # the pipeline's files, not the upstream core's
        self.assertEqual((folder / "GridSamplerDeterministic.cu").read_text(),
                         "// GridSamplerDeterministic.cu\n")

    def test_cut_defaults_to_every_level_below_the_whole_pipeline(self):
        from detgrid.kit import stack

        _fake_kit(self.tmp / "kit")
        rc, out, _ = self._main("cut", "--kit", str(self.tmp / "kit"), "--into", str(self.tmp))
        self.assertEqual(rc, 0)
        self.assertEqual([line.split()[0] for line in out.splitlines()],
                         list(stack.LEVEL_NAMES[:-1]))
        self.assertEqual(self._main("cut", "--top"), (0, f"{self.top}\n", ""))
        for level in ("nonesuch", stack.CORE):  # the core is not a level of the pipeline
            rc, _, err = self._main("cut", "--kit", str(self.tmp / "kit"), "--into",
                                    str(self.tmp), "--level", level)
            self.assertEqual(rc, 2)
            self.assertIn(f"unknown level '{level}'", err)

    def test_the_whole_pipelines_budget_is_128_kernels_and_2_mib(self):
        top = sass_audit.LevelCode(self.top, 5000, sass_audit.MachineCode("sm_90", 128, 2 * 2**20))
        first = sass_audit.LevelCode(self.first, 9000,
                                     sass_audit.MachineCode("sm_90", 500, 9 * 2**20))
        self.assertEqual(sass_audit.level_budget_findings({self.first: first, self.top: top},
                                                          self.top), [])
        top = sass_audit.LevelCode(self.top, 5000,
                                   sass_audit.MachineCode("sm_90", 129, 2 * 2**20 + 1))
        self.assertEqual(
            sass_audit.level_budget_findings({self.top: top}, self.top),
            [f"whole pipeline ({self.top}): 129 kernels > 128",
             f"whole pipeline ({self.top}): 2.00 MiB of .text > 2.00 MiB"])
        self.assertEqual(sass_audit.level_budget_findings(
            {self.top: sass_audit.LevelCode(self.top, 10)}, self.top),
            [f"whole pipeline ({self.top}): not built"])
        self.assertEqual(sass_audit.level_budget_findings({}, self.top),
                         [f"whole pipeline ({self.top}): not measured"])

    def test_the_record_is_the_cores_beside_the_pipelines_levels(self):
        from detgrid.kit import stack

        _fake_kit(self.tmp / "kit", pipeline_lines=1300)
        self._measure(self.first, 37, 1237504, spills=1)
        self._measure(self.top, 126, 2042880)
        record = self.tmp / "machine_code.json"
        rc, out, err = self._levels("--machine-code-json", str(record))
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith(
            "core (the upstream change): 600 lines, 38 kernels, 0.92 MiB of sm_90 .text (966784 "
            "bytes); budget 700 lines, 40 kernels, 1.00 MiB; 0 kernel(s) of its own with a stack "
            "frame or spills, 1 of CUB's with a stack frame\ncore budget: met\n"), out)
        self.assertIn(f"level {self.first}: 1303 lines, 37 kernels, 1.18 MiB of sm_90 .text "
                      "(1237504 bytes); 1 kernel(s) with a stack frame or spills\n", out)
        self.assertIn("level dense: 1305 lines, not built", out)
        top_lines = 1309 + len(self.levels) - 1 - self.levels.index("hot-fold")
        self.assertIn(f"level whole pipeline ({self.top}): {top_lines} lines, 126 kernels, "
                      "1.95 MiB of sm_90 .text (2042880 bytes); budget 128 kernels, 2.00 MiB\n",
                      out)
        self.assertTrue(out.endswith("pipeline budget: met\n"), out)
        written = json.loads(record.read_text())
        # the upstream change's count, which `detgrid report` cites, is the core's
        self.assertEqual((written["arch"], written["kernels"], written["text_bytes"]),
                         ("sm_90", 38, 966784))
        (self.tmp / "benchmarks").mkdir()
        (self.tmp / "benchmarks" / "machine_code.json").write_text(record.read_text())
        code = report.read_machine_code(self.tmp)
        self.assertEqual((code.arch, code.kernels, code.text_bytes), ("sm_90", 38, 966784))
        # the core's record first, then each speed level's core build, then the pipeline's
        # levels
        self.assertEqual(list(written["levels"]),
                         [stack.CORE, *CORE_BUILDS[1:], *stack.LEVEL_NAMES])
        self.assertEqual(written["levels"][stack.CORE], json.loads(Path(self._core()).read_text()))
        self.assertEqual(written["levels"][stack.CORE]["registers"],
                         {"sum_runs_kernel<float, int>": 32})
        for level in CORE_BUILDS[1:]:
            self.assertEqual(written["levels"][level],
                             {"lines": 664, "arch": "sm_90", "kernels": 38, "text_bytes": 990464,
                              "run_sum_registers": {"sum_run_partials_kernel<float, long>": 40,
                                                    "sum_runs_kernel<float, int>": 40},
                              "spilling_kernels": 0, "cub_frames": []})
        self.assertEqual(written["levels"][self.first],
                         {"lines": 1303, "kernels": 37, "text_bytes": 1237504,
                          "spilling_kernels": 1, "fp32_reduces": []})
        self.assertEqual(written["levels"]["dense"],
                         {"lines": 1305, "kernels": None, "text_bytes": None,
                          "spilling_kernels": None, "fp32_reduces": None})
        self.assertEqual(written["budgets"],
                         {"core": {"kernels": 40, "text_bytes": 2**20, "lines": 700},
                          "whole_stack": {"level": CORE_BUILDS[-1], "kernels": 100,
                                          "text_bytes": int(1.6 * 2**20), "lines": None},
                          "whole_pipeline": {"level": self.top, "kernels": 128,
                                             "text_bytes": 2 * 2**20, "lines": None}})
        self.assertEqual((written["budget_met"], written["over_budget"]), (True, []))

    def test_the_whole_pipeline_over_budget_is_reported_and_recorded_not_failed(self):
        _fake_kit(self.tmp / "kit")
        self._measure(self.top, 128, 2910080)
        record = self.tmp / "machine_code.json"
        rc, out, err = self._levels("--machine-code-json", str(record))
        self.assertEqual(rc, 0, err)
        self.assertIn(f"over budget (pipeline): whole pipeline ({self.top}): 2.78 MiB of .text > "
                      "2.00 MiB\n"
                      "pipeline budget: OVER BUDGET, 1 finding(s); reported, not failed", out)
        written = json.loads(record.read_text())
        self.assertIs(written["budget_met"], False)
        self.assertEqual(written["over_budget"],
                         [f"whole pipeline ({self.top}): 2.78 MiB of .text > 2.00 MiB"])
        rc, out, _ = self._levels("--strict")
        self.assertEqual(rc, 1)
        self.assertIn("OVER BUDGET, 1 finding(s); failed (--strict)", out)

    def test_the_core_over_its_budget_fails_and_is_recorded(self):
        _fake_kit(self.tmp / "kit")
        self._measure(self.top, 100, 2**20)
        record = self.tmp / "machine_code.json"
        rc, out, _ = self._levels("--machine-code-json", str(record),
                                  core=self._core(lines=701, kernels=41))
        self.assertEqual(rc, 1)
        self.assertIn("OVER BUDGET (core, failed): 701 lines > 700\n"
                      "OVER BUDGET (core, failed): 41 kernels > 40\n"
                      "core budget: OVER BUDGET, 2 finding(s); failed\n", out)
        self.assertTrue(out.endswith("pipeline budget: met\n"), out)
        written = json.loads(record.read_text())
        self.assertIs(written["budget_met"], False)
        self.assertEqual(written["over_budget"], ["core: 701 lines > 700", "core: 41 kernels > 40"])

    def test_within_budget_is_met(self):
        _fake_kit(self.tmp / "kit")
        self._measure(self.top, 100, 2 * 2**20)
        record = self.tmp / "machine_code.json"
        rc, out, _ = self._levels("--strict", "--machine-code-json", str(record))
        self.assertEqual(rc, 0)
        self.assertIn("core budget: met\n", out)
        self.assertTrue(out.endswith("pipeline budget: met\n"), out)
        written = json.loads(record.read_text())
        self.assertEqual((written["budget_met"], written["over_budget"]), (True, []))

    def test_levels_needs_the_whole_pipeline_measured_and_the_core(self):
        _fake_kit(self.tmp / "kit")
        self._measure(self.first, 30, 2**20)
        self._measure("nonesuch", 1, 1)
        rc, out, err = self._levels("--machine-code-json", str(self.tmp / "m.json"))
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"no level nonesuch; no measurement of {self.top}", err)
        self.assertFalse((self.tmp / "m.json").exists())
        self._measure(self.top, 100, 2**20)
        (self.tmp / "measured" / "nonesuch.json").unlink()
        (self.tmp / "bad.json").write_text('{"lines": 600}')
        for core, message in ((str(self.tmp / "none.json"), "cannot read"),
                              (str(self.tmp / "bad.json"), "not a `core --json` file")):
            self._assert_levels_refuse(message, core=core)
        # every speed level's core build, once each, and the core's measurement as --core
        for builds, message in (
                ([], f"no --core-build of {', '.join(CORE_BUILDS[1:])}"),
                ([self._core_build("nonesuch")], "core build 'nonesuch' is not a speed level's"),
                ([self._core_build(CORE_BUILDS[-1])] * 2, "is measured twice"),
                ([str(self.tmp / "bad.json")], "not a `core --level --json` file"),
                ([str(self.tmp / "none.json")], "cannot read")):
            self._assert_levels_refuse(message, builds=builds)
        rc, out, err = self._levels(core=self._core_build(CORE_BUILDS[-1]))
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("not the core's (give it as --core-build)", err)

    def test_the_core_builds_are_printed_side_by_side(self):
        _fake_kit(self.tmp / "kit")
        self._measure(self.top, 100, 2**20)
        top = CORE_BUILDS[-1]
        rc, out, err = self._levels()
        self.assertEqual(rc, 0, err)
        self.assertIn(f"core build {top} (the core's file as the stack up to {top} has it): 664 "
                      "lines, 38 kernels, 0.94 MiB of sm_90 .text (990464 bytes); the whole "
                      "stack's budget 100 kernels, 1.60 MiB; 0 kernel(s) of its own with a stack "
                      "frame or spills, 0 of CUB's with a stack frame\n"
                      f"whole stack budget ({top}): met\n", out)
        names = " | ".join(CORE_BUILDS)
        more = len(CORE_BUILDS) - 1
        self.assertIn(f"core builds side by side: {names}\n"
                      f"  lines: 600{' | 664' * more}\n"
                      f"  kernels: 38{' | 38' * more}\n"
                      f"  .text bytes: 966784{' | 990464' * more}\n"
                      "  run sums' registers (ptxas -v):\n"
                      f"  sum_run_partials_kernel<float, long>: -{' | 40' * more}\n"
                      f"  sum_runs_kernel<float, int>: 32{' | 40' * more}\n"
                      "pipeline levels: ", out)
        self.assertNotIn("grid_sampler_2d_records_kernel", out)  # the run sums alone

    def test_the_whole_stack_over_budget_fails_and_is_recorded(self):
        _fake_kit(self.tmp / "kit")
        self._measure(self.top, 100, 2**20)
        top = CORE_BUILDS[-1]
        record = self.tmp / "machine_code.json"
        builds = [self._core_build(level) for level in CORE_BUILDS[1:-1]]
        builds.append(self._core_build(top, kernels=101, text_bytes=int(1.6 * 2**20) + 1))
        rc, out, _ = self._levels("--machine-code-json", str(record), builds=builds)
        self.assertEqual(rc, 1, out)
        self.assertIn("core budget: met\n", out)
        self.assertIn(f"OVER BUDGET (whole stack, failed): whole stack ({top}): 101 kernels > 100\n"
                      f"OVER BUDGET (whole stack, failed): whole stack ({top}): 1.60 MiB of .text "
                      "> 1.60 MiB\n"
                      f"whole stack budget ({top}): OVER BUDGET, 2 finding(s); failed\n", out)
        self.assertTrue(out.endswith("pipeline budget: met\n"), out)
        written = json.loads(record.read_text())
        self.assertIs(written["budget_met"], False)
        self.assertEqual(written["over_budget"],
                         [f"whole stack ({top}): 101 kernels > 100",
                          f"whole stack ({top}): 1.60 MiB of .text > 1.60 MiB"])
        # the top-level count stays the core's
        self.assertEqual((written["kernels"], written["text_bytes"]), (38, 966784))
        # at the budget: met
        builds[-1] = self._core_build(top, kernels=100, text_bytes=int(1.6 * 2**20))
        rc, out, _ = self._levels(builds=builds)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"whole stack budget ({top}): met\n", out)

    def test_the_audit_of_a_level_writes_its_measurement(self):
        files = {"ptxas": "", "sass": "\t.target\tsm_90\n" + _sass(_listing(["EXIT"], {})),
                 "cubin": _cubin([(".text." + OURS, 4096), (".text." + CUB_KERNEL, 512)])}
        rc, out, _, after = _run_audit(files, "--ptxas-log", "{ptxas}", "--sass", "{sass}",
                                       "--cubin", "{cubin}", "--level", self.first,
                                       "--level-json", "{work}/level.json")
        self.assertEqual(rc, 0, out)
        self.assertIn(f"machine code ({self.first}): 2 kernels, 0.00 MiB of sm_90 .text (4608 "
                      "bytes; budget 128 kernels, 3.00 MiB)", out)
        self.assertEqual(json.loads(after["level.json"]), {"level": self.first, "arch": "sm_90",
                                                           "kernels": 2, "text_bytes": 4608,
                                                           "spills": 0, "reduces": []})

    def test_a_levels_record_lists_its_fp32_reduces_loop_costs(self):
        def row(dtype, group=None):
            return sass_audit.ReduceCost(
                f"sum_segments_per_destination_kernel<ReduceDenseChannelGroups<DenseFold<"
                f"CellSegments<int, 2>, {dtype}, int> >, int>",
                sass_audit.LoopCost(40, 0, 7), 60, 72, 55 if group else None, group)

        record = sass_audit.fp32_reduce_record(
            [row("float", {3: 65, 8: 95, 16: None}), row("double"), row("c10::Half")])
        self.assertEqual(record, [{"kernel": row("float").kernel, "per_record": 47,
                                   "setup": 60, "group_per_record": {"3": 65, "8": 95,
                                                                     "16": None},
                                   "registers": 72}])

    def test_a_levels_spills_can_be_reported_not_failed(self):
        log = textwrap.dedent(f"""\
            ptxas info    : Compiling entry function '{OURS}' for 'sm_90'
            ptxas info    : Function properties for {OURS}
                24 bytes stack frame, 24 bytes spill stores, 24 bytes spill loads
            ptxas info    : Used 255 registers
            """)
        files = {"ptxas": log, "sass": "\t.target\tsm_90\n" + _sass(_listing(["EXIT"], {})),
                 "cubin": _cubin([(".text." + OURS, 4096)])}
        flags = ["--ptxas-log", "{ptxas}", "--sass", "{sass}", "--cubin", "{cubin}",
                 "--level", self.first, "--level-json", "{work}/level.json"]
        rc, out, _, after = _run_audit(files, *flags, "--report-spills")
        self.assertEqual(rc, 0, out)
        self.assertTrue(out.startswith(f"REPORTED, not failed (stack frames or spills, "
                                       f"{self.first}): void at::native::"), out)
        self.assertIn("24 B stack frame, 24 B spill stores, 24 B spill loads", out)
        self.assertTrue(out.endswith("0 problem(s), 1 reported, not failed\n"), out)
        self.assertEqual(json.loads(after["level.json"])["spills"], 1)
        rc, out, _, _ = _run_audit(files, *flags)  # without it, a spill fails the audit
        self.assertEqual(rc, 1)
        self.assertTrue(out.startswith("FAIL (stack frames or spills): "), out)


if __name__ == "__main__":
    run_tests()
