# Owner(s): ["module: nn"]
"""The machine-code audit (tools/detgrid/kit/sass_audit.py) on small, hand-written
excerpts of ptxas -v and nvdisasm -g -gi output. CI runs it on the real sm_90
build (.ci/sass_audit.sh); these tests pin what it accepts and refuses."""

import textwrap

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import sass_audit

OURS = "_ZN2at6native60_GLOBAL__N__GridSamplerDeterministic_cu_1215for_each_kernelIiNS_4StageEEEvT0_T_"
CUH = "/src/ATen/native/cuda/GridSamplerDeterministic.cuh"
# Kernels of an ExactCuda.cu build: two exact stages, and one of the
# pipeline's that the unit's inclusion of GridSamplerDeterministic.cu brings.
EXACT_NAMESPACE = "_ZN2at6native45_GLOBAL__N__0aa0d8f9_12_ExactCuda_cu_7dd603db"
SCATTER = (EXACT_NAMESPACE
           + "19for_each_row_kernelIN7detgrid5exact12ScatterTermsILi4ELi2EfiiEEiiEEvT_T0_T1_")
SPARSE = (EXACT_NAMESPACE
          + "19for_each_row_kernelIN7detgrid5exact17ReduceExactSparseILi4ELi2EfiiEEiiEEvT_T0_T1_")
POINT_PASS_IN_EXACT_UNIT = (
    EXACT_NAMESPACE + "15for_each_kernelINS0_26grid_sampler_deterministic9PointPassILi2ELb1E"
    "LNS3_6KeyingE0ENS3_12BackwardArgsIN3c108BFloat16ElLi3EEElEElEEvT_T0_")
EXACT_SUM = "/src/extension/exact/ExactSum.cuh"
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
        found = sass_audit.fused_violations(sass_audit.parse_sass(sass), _Lines({}))
        self.assertEqual(len(found), 1)
        self.assertIn("GridSamplerDeterministic.cuh:60", found[0])

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
        self.assertEqual(sass_audit.resource_violations(resources, ["Stage"]), [])

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
        body = ""
        for k, text in enumerate(ins):
            offset = 0x10 * (k + 1)
            if offset in labels:
                body += labels[offset] + ":\n"
            body += f"        /*{offset:04x}*/                   {text} ;\n"
        function = next(iter(sass_audit.parse_sass(_sass(_loc(CUH, 880) + body)).values()))
        cost = sass_audit.inner_loop_cost(function)
        self.assertEqual(cost.body, 4)
        self.assertEqual(sass_audit.setup_cost(function, cost.loop), 3)

    def test_setup_limit_applies_to_2d_fp32_dense_reduces(self):
        dense = ("for_each_kernel<ReduceDenseChannelsFastest<DenseFold<4, "
                 "CellSegments<int, 2>, float, int, float> >, int>")
        sparse = "for_each_row_kernel<ReduceSparse<4, float, int, int, float>, int, int>"
        loop = sass_audit.LoopCost(46, 0, 0)
        rows = [sass_audit.ReduceCost(dense, loop, 81), sass_audit.ReduceCost(sparse, loop, 200)]
        self.assertEqual(len(sass_audit.setup_violations(rows)), 1)
        rows[0].setup = 80
        self.assertEqual(sass_audit.setup_violations(rows), [])

    def test_exact_scope_holds_the_exact_stages_alone(self):
        for name in (SCATTER, SPARSE):
            self.assertRegex(name, sass_audit.EXACT.kernel)
            self.assertNotRegex(name, sass_audit.PIPELINE.kernel)
        # Audited in the release build, not again in the exact one.
        self.assertNotRegex(POINT_PASS_IN_EXACT_UNIT, sass_audit.EXACT.kernel)
        self.assertNotRegex(POINT_PASS_IN_EXACT_UNIT, sass_audit.PIPELINE.kernel)
        self.assertNotRegex(OURS, sass_audit.EXACT.kernel)

    def test_fused_multiply_add_in_exact_arithmetic_is_refused_in_exact_scope(self):
        sass = _sass(_listing(["FFMA R1, R2, R3, R4", "FMUL.FTZ R1, R2, R3"], {},
                              {0: (EXACT_SUM, 240), 1: (EXACT_SUM, 240)}), name=SCATTER)
        functions = sass_audit.parse_sass(sass)
        found = sass_audit.fused_violations(functions, _Lines({}), sass_audit.EXACT)
        self.assertEqual(len(found), 1)
        self.assertIn("ExactSum.cuh:240", found[0])
        self.assertEqual(len(sass_audit.ftz_violations(functions, sass_audit.EXACT)), 1)
        # The pipeline's scope knows neither the kernel nor the file.
        self.assertEqual(sass_audit.fused_violations(functions, _Lines({})), [])

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
        import contextlib
        import io
        import tempfile

        ins = ["LDG.E R1, desc[UR4][R2.64]", "FMUL R3, R1, R4",
               "REDG.E.ADD.64.STRONG.GPU desc[UR8][R8.64], R10", "@P0 BRA `(.L_x_1)", "EXIT"]
        log = textwrap.dedent(f"""\
            ptxas info    : Function properties for {SCATTER}
                8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
            ptxas info    : Used 30 registers, used 0 barriers, 8 bytes cumulative stack size
            """)
        with tempfile.TemporaryDirectory() as work:
            paths = {"ptxas": f"{work}/ptxas.txt", "sass": f"{work}/sass.txt"}
            with open(paths["ptxas"], "w") as f:
                f.write(log)
            with open(paths["sass"], "w") as f:
                f.write(_sass(_listing(ins, {0x10: ".L_x_1"}), name=SCATTER))
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                rc = sass_audit.main(["--ptxas-log", paths["ptxas"], "--sass", paths["sass"],
                                      "--exact", "--loops"])
        lines = stdout.getvalue().splitlines()
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("FAIL (stack frames or spills): "), lines)
        self.assertIn("per-term=4 (0 calls) atomics=1 regs=30", stdout.getvalue())
        self.assertEqual(lines[-1], "sass audit: 1 detgrid exact kernels, 5 instructions; "
                                    "1 problem(s)")

    def test_an_exact_loop_not_found_is_printed_not_dropped(self):
        import contextlib
        import io

        sass = _sass(_listing(["IADD3 R1, R1, 1, RZ", "@P0 BRA `(.L_x_1)", "EXIT"],
                              {0x10: ".L_x_1"}), name=SPARSE)
        rows = sass_audit.exact_loop_table(sass_audit.parse_sass(sass), {})
        self.assertEqual([(row.stage, row.loop, row.atomics) for row in rows],
                         [("ReduceExactSparse", None, None)])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            sass_audit.print_exact_loops(rows)
        self.assertIn("per-record=? (no loop found) regs=None", stdout.getvalue())

    def test_unreadable_input_is_a_one_line_error(self):
        import contextlib
        import io

        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            rc = sass_audit.main(["--ptxas-log", "/nonexistent/ptxas.txt", "--sass", "/dev/null"])
        self.assertEqual(rc, 2)
        self.assertEqual(stderr.getvalue().count("\n"), 1)
        self.assertIn("cannot read /nonexistent/ptxas.txt", stderr.getvalue())


if __name__ == "__main__":
    run_tests()
