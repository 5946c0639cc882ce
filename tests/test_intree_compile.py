# Owner(s): ["module: nn"]
"""Tests of the pure-Python parts of the in-tree compile check (detgrid.kit.intree_compile): CMake
header configuration, unit classification, depfile parsing, header coverage, the record of
successful compiles that lets a rerun skip an identical compile, wheel header extraction and the
compile command lines. No network, no compiler run (the check itself runs in .ci/intree_compile.sh).

Names here avoid the word the device run selects tests by.
"""

import contextlib
import io
import json
import sys
import tempfile
import zipfile
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import intree_compile as IC
from detgrid.kit import upstream_tree

CMAKE_MACROS_IN = """\
#ifndef C10_MACROS_CMAKE_MACROS_H_
#define C10_MACROS_CMAKE_MACROS_H_
#cmakedefine C10_BUILD_SHARED_LIBS
#cmakedefine C10_USE_GLOG
  # cmakedefine C10_USE_NUMA 1
#cmakedefine01 C10_ON
#cmakedefine01 C10_OFF
#define VERSION "@VERSION@"
#define FLAGS "${FLAGS}"
#endif
"""


class TestConfigureFile(TestCase):
    values = {"C10_BUILD_SHARED_LIBS": True, "C10_USE_GLOG": "OFF", "C10_USE_NUMA": "ON",
              "C10_ON": 1, "C10_OFF": "x-NOTFOUND", "VERSION": "2.6.0", "FLAGS": "-O2"}

    def test_cmakedefine_lines(self):
        out = IC.configure_file(CMAKE_MACROS_IN, self.values)
        self.assertEqual(out, """\
#ifndef C10_MACROS_CMAKE_MACROS_H_
#define C10_MACROS_CMAKE_MACROS_H_
#define C10_BUILD_SHARED_LIBS
/* #undef C10_USE_GLOG */
  # define C10_USE_NUMA 1
#define C10_ON 1
#define C10_OFF 0
#define VERSION "2.6.0"
#define FLAGS "-O2"
#endif
""")

    def test_at_only_keeps_dollar_braces(self):
        out = IC.configure_file('#define A "@VERSION@"\n#define B "${FLAGS}"\n', self.values, at_only=True)
        self.assertEqual(out, '#define A "2.6.0"\n#define B "${FLAGS}"\n')

    def test_unknown_variables_are_named_all_at_once(self):
        text = "#cmakedefine NEW_SWITCH\n#define X @NEW_VALUE@\n#define Y @NEW_VALUE@\n"
        with self.assertRaisesRegex(IC.ConfigureError, r"c10/x\.h\.in: no value for NEW_SWITCH, NEW_VALUE \("):
            IC.configure_file(text, {}, where="c10/x.h.in")

    def test_cmake_truthiness(self):
        for v in (True, 1, "1", "ON", "yes", "TRUE", "anything"):
            self.assertTrue(IC.cmake_truthy(v), v)
        for v in (False, 0, "", "0", "OFF", "no", "false", "N", "IGNORE", "NOTFOUND", "CUDNN-NOTFOUND"):
            self.assertFalse(IC.cmake_truthy(v), v)

    def test_crlf_line_ends_kept(self):
        out = IC.configure_file("#cmakedefine01 C10_ON\r\n#cmakedefine C10_USE_GLOG\r\n", self.values)
        self.assertEqual(out, "#define C10_ON 1\r\n/* #undef C10_USE_GLOG */\r\n")


class TestConfigureHeaders(TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-intree-test-"))

    def tearDown(self):
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_fake_tree(self):
        tree = self.tmp / "tree"
        (tree / "c10/macros").mkdir(parents=True)
        (tree / "c10/macros/cmake_macros.h.in").write_text(CMAKE_MACROS_IN)
        conf = (IC.Configured("c10/macros/cmake_macros.h.in", "c10/macros/cmake_macros.h",
                              TestConfigureFile.values),)
        written = IC.configure_headers(tree, self.tmp / "build", conf)
        self.assertEqual(written, [self.tmp / "build/c10/macros/cmake_macros.h"])
        text = written[0].read_text()
        self.assertIn("#define C10_BUILD_SHARED_LIBS\n", text)
        self.assertIn("/* #undef C10_USE_GLOG */\n", text)
        self.assertNotIn("cmakedefine", text)

    def test_missing_template_is_a_clear_error(self):
        (self.tmp / "tree").mkdir()
        with self.assertRaisesRegex(IC.ConfigureError, r"c10/macros/cmake_macros\.h\.in: template missing"):
            IC.configure_headers(self.tmp / "tree", self.tmp / "build")
        self.assertFalse((self.tmp / "build/c10/macros/cmake_macros.h").exists())

    def test_values_cover_the_real_templates(self):
        tree = upstream_tree.cached_tree()
        if not (tree / "aten/src/ATen/Config.h.in").is_file():
            self.skipTest(f"no cached v2.6.0 tree at {tree} (this test uses no network)")
        written = {p.relative_to(self.tmp / "build").as_posix(): p.read_text()
                   for p in IC.configure_headers(tree, self.tmp / "build")}
        self.assertEqual(sorted(written), sorted(c.output for c in IC.CONFIGURED))
        for text in written.values():
            self.assertNotRegex(text, r"@\w+@|\$\{\w+\}|#\s*cmakedefine")
        self.assertIn("#define C10_BUILD_SHARED_LIBS\n", written["c10/macros/cmake_macros.h"])
        self.assertIn("#define C10_CUDA_BUILD_SHARED_LIBS\n", written["c10/cuda/impl/cuda_cmake_macros.h"])
        self.assertIn("#define AT_CUDNN_ENABLED() 1\n", written["aten/src/ATen/cuda/CUDAConfig.h"])
        self.assertIn("#define AT_MKL_ENABLED() 0\n", written["aten/src/ATen/Config.h"])


class TestUnitsAndDeps(TestCase):
    def test_unit_kind(self):
        kinds = {
            "aten/src/ATen/native/cuda/GridSampler.cu": "nvcc",
            "aten/src/ATen/native/cudnn/GridSampler.cpp": "cuda-cpp",
            "aten/src/ATen/native/cuda/Foo.cpp": "cuda-cpp",
            "aten/src/ATen/native/GridSampler.cpp": "cpp",
            "aten/src/ATen/native/cuda/GridSamplerDeterministic.cuh": "header",
            "aten/src/ATen/native/cuda/GridSamplerDeterministic.h": "header",
            "torch/__init__.py": None,
            "test/test_nn.py": None,
        }
        for path, kind in kinds.items():
            self.assertEqual(IC.unit_kind(path), kind, path)

    def test_parse_depfile(self):
        text = ("/w/obj/a.o: /w/t/a.cu /w/t/x\\ y.h \\\n  /usr/include/stdio.h \\\n"
                "  rel/b.h\n/w/t/extra.h:\n")
        self.assertEqual(IC.parse_depfile(text),
                         ["/w/t/a.cu", "/w/t/x y.h", "/usr/include/stdio.h", "rel/b.h"])

    def test_uncovered_headers(self):
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp)
            (tree / "a.h").write_text("")
            (tree / "b.cuh").write_text("")
            dep = tree / "u.d"
            dep.write_text(f"u.o: {tree}/u.cu \\\n {tree}/a.h\n")
            self.assertEqual(IC.uncovered_headers(["a.h", "b.cuh"], tree, [dep]), ["b.cuh"])
            self.assertEqual(IC.uncovered_headers(["a.h"], tree, [dep, tree / "missing.d"]), [])

    def test_toolchain_for(self):
        self.assertIs(IC.toolchain_for("2.6.0a0\n"), IC.CUDA_12_4)
        self.assertEqual(IC.CUDA_12_4.cxx_std, "c++17")
        with self.assertRaisesRegex(IC.SetupError, r"no CUDA toolchain known for PyTorch 2\.9\.0a0 \(known: 2\.6\)"):
            IC.toolchain_for("2.9.0a0")


class TestReuse(TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-intree-reuse-"))
        self.records = self.tmp / "records"
        self.cmd = [sys.executable, "-c", "pass", "-I<placeholder>"]

    def tearDown(self):
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)

    def work(self, name, header="int x;\n"):
        w = self.tmp / name
        (w / "tree").mkdir(parents=True)
        (w / "obj").mkdir()
        (w / "tree/u.cu").write_text("#include <h.h>\n")
        (w / "tree/h.h").write_text(header)
        (w / "obj/u.d").write_text(f"{w}/obj/u.o: {w}/tree/u.cu \\\n  {w}/tree/h.h\n")
        return w

    def cmd_in(self, w):
        return [*self.cmd, f"-I{w}/tree", f"{w}/tree/u.cu"]

    def test_identical_inputs_in_another_work_dir_are_reused(self):
        w1 = self.work("w1")
        IC.Reuse(self.records, w1).store("u.cu", self.cmd_in(w1), w1 / "obj/u.d")
        w2 = self.work("w2")
        self.assertIsNotNone(IC.Reuse(self.records, w2).hit("u.cu", self.cmd_in(w2)))

    def test_any_difference_compiles_again(self):
        w1 = self.work("w1")
        IC.Reuse(self.records, w1).store("u.cu", self.cmd_in(w1), w1 / "obj/u.d")
        w2 = self.work("w2", header="int y;\n")  # a header's content
        self.assertIsNone(IC.Reuse(self.records, w2).hit("u.cu", self.cmd_in(w2)))
        w3 = self.work("w3")
        self.assertIsNone(IC.Reuse(self.records, w3).hit("u.cu", [*self.cmd_in(w3), "-DNEW"]))  # flags
        self.assertIsNone(IC.Reuse(self.records, w3).hit("other.cu", self.cmd_in(w3)))  # no record
        self.assertIsNone(IC.Reuse(self.records, w3, enabled=False).hit("u.cu", self.cmd_in(w3)))
        (w3 / "tree/h.h").unlink()  # a file it read is gone
        self.assertIsNone(IC.Reuse(self.records, w3).hit("u.cu", self.cmd_in(w3)))

    def test_another_compiler_compiles_again(self):
        w1 = self.work("w1")
        IC.Reuse(self.records, w1).store("u.cu", self.cmd_in(w1), w1 / "obj/u.d")
        other = IC.Reuse(self.records, w1)
        other._compilers[sys.executable] = "a different compiler"
        self.assertIsNone(other.hit("u.cu", self.cmd_in(w1)))

    def test_record_is_readable_json(self):
        w1 = self.work("w1")
        IC.Reuse(self.records, w1).store("a/b/u.cu", self.cmd_in(w1), w1 / "obj/u.d")
        rec = json.loads((self.records / "a__b__u.cu.json").read_text())
        self.assertEqual(sorted(rec["deps"]), ["<work>/tree/h.h", "<work>/tree/u.cu"])
        self.assertNotIn(str(w1), json.dumps(rec))


class TestCore(TestCase):
    """The second patch of the copy, with the stack's core alone (detgrid patch --upto core): which
    units compile again, and the reset that makes the copy patchable again."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-intree-core-"))
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)

    def git(self, *args):
        import subprocess

        env = dict(__import__("os").environ, **IC._GIT_IDENTITY)
        return subprocess.run(["git", "-C", str(self.tree), *args], check=True, env=env,
                              capture_output=True, text=True).stdout

    def test_only_units_that_read_a_differing_file_compile_again(self):
        tree, obj = self.tmp / "tree", self.tmp / "obj"
        obj.mkdir()
        (obj / "det.d").write_text(f"det.o: {tree}/det.cu \\\n  {tree}/dense.cuh {tree}/det.h\n")
        (obj / "sampler.d").write_text(f"sampler.o: {tree}/sampler.cu {tree}/det.h\n")
        (obj / "cudnn.d").write_text("cudnn.o: ../tree/cudnn.cpp ../tree/shared.h\n")  # relative
        units = [("det.cu", "nvcc"), ("sampler.cu", "nvcc"), ("cudnn.cpp", "cuda-cpp"),
                 ("failed.cu", "nvcc"), ("new.cu", "nvcc")]
        depfiles = {"det.cu": obj / "det.d", "sampler.cu": obj / "sampler.d",
                    "cudnn.cpp": obj / "cudnn.d", "new.cu": obj / "missing.d"}
        # dense.cuh: only the whole stack has it; det.h is the same in both
        again = IC.units_to_compile_again(units, ["dense.cuh"], depfiles, tree)
        self.assertEqual(again, [("det.cu", "nvcc"), ("failed.cu", "nvcc"), ("new.cu", "nvcc")])
        # a unit that differs itself, and one whose relative depfile path reads a differing file
        again = IC.units_to_compile_again(units[:3], ["sampler.cu", "shared.h"], depfiles, tree)
        self.assertEqual(again, [("sampler.cu", "nvcc"), ("cudnn.cpp", "cuda-cpp")])

    def test_core_records_are_kept_apart_from_the_whole_stacks(self):
        work = self.tmp / "w"
        (work / "obj").mkdir(parents=True)
        (work / "u.cu").write_text("int x;\n")
        (work / "obj/u.d").write_text(f"u.o: {work}/u.cu\n")
        cmd = [sys.executable, "-c", "pass", f"{work}/u.cu"]
        reuse = IC.Reuse(self.tmp / "records", work)
        reuse.store("a/u.cu@core", cmd, work / "obj/u.d")
        self.assertTrue((self.tmp / "records" / "a__u.cu@core.json").is_file())
        self.assertIsNone(reuse.hit("a/u.cu", cmd))
        self.assertIsNotNone(reuse.hit("a/u.cu@core", cmd))

    def test_repatch_resets_the_copy_to_its_base_first(self):
        self.tree = self.tmp / "pytorch"
        self.tree.mkdir()
        (self.tree / "version.txt").write_text("2.6.0a0\n")
        (self.tree / "GridSampler.cu").write_text("stock\n")
        self.git("init", "-q")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "base")
        self.git("tag", "v2.6.0")
        # the whole stack's patch: a changed unit, two new files
        (self.tree / "GridSampler.cu").write_text("dispatch\n")
        (self.tree / "Det.cu").write_text("whole\n")
        (self.tree / "Dense.cuh").write_text("dense\n")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "whole stack")
        (self.tree / "stray.o").write_text("untracked\n")  # cleaned before the second patch
        seen = {}

        def core_patch(dest, tag, upto, out, log):
            seen.update(upto=upto, tag=tag, files=sorted(p.name for p in dest.iterdir()
                                                         if p.name != ".git"))
            (dest / "GridSampler.cu").write_text("dispatch\n")
            (dest / "Det.cu").write_text("core\n")
            self.git("add", "-A")
            self.git("commit", "-q", "-m", "core")
            return ["Det.cu", "GridSampler.cu"]

        with mock.patch.object(IC, "_detgrid_patch", side_effect=core_patch):
            changed, differing = IC.repatch_upto(self.tree, "core", self.tmp / "core.patch")
        self.assertEqual(seen, {"upto": "core", "tag": "v2.6.0",
                                "files": ["GridSampler.cu", "version.txt"]})
        self.assertEqual(changed, ["Det.cu", "GridSampler.cu"])
        self.assertEqual(differing, ["Dense.cuh", "Det.cu"])

    def test_the_copys_core_file_must_be_the_stacks_up_to_the_patch_applied(self):
        from detgrid.kit import stack

        copy = self.tmp / "copy"
        for name in stack.UPSTREAM_NAMES:
            for rel, text in stack.core_sources(IC.KIT_ROOT, name).items():
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                (copy / rel).write_text(text)
            self.assertEqual(IC.check_core_files(copy, name),
                             ["aten/src/ATen/native/cuda/GridSamplerDeterministic.cu"])
        # the whole stack's file is its last speed level's, not the core's
        core, top = stack.CORE, stack.UPSTREAM_NAMES[-1]
        self.assertTrue(stack.UPSTREAM_STACK[-1].speed_level)
        with self.assertRaisesRegex(IC.SetupError, f"not the stack's up to {core} \\(differs\\)"):
            IC.check_core_files(copy, core)
        (copy / "aten/src/ATen/native/cuda/GridSamplerDeterministic.cu").unlink()
        with self.assertRaisesRegex(IC.SetupError, f"not the stack's up to {top} \\(missing\\)"):
            IC.check_core_files(copy, top)

    def test_no_core_is_an_option(self):
        err = io.StringIO()
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()):
            rc = IC.main(["--pytorch", tmp, "--no-core"])
        self.assertEqual(rc, IC.EXIT_SETUP)
        self.assertIn("no version.txt", err.getvalue())


class TestToolchainParts(TestCase):
    def test_extract_includes_drops_the_package_prefix(self):
        with tempfile.TemporaryDirectory() as tmp:
            whl = Path(tmp) / "nvidia_x-1-py3-none-any.whl"
            with zipfile.ZipFile(whl, "w") as z:
                z.writestr("nvidia/cudnn/include/cudnn.h", "// cudnn\n")
                z.writestr("nvidia/cudnn/include/__init__.py", "")
                z.writestr("nvidia/cuda_nvcc/include/crt/host_config.h", "// crt\n")
                z.writestr("nvidia/cudnn/lib/libcudnn.so.9", "binary")
                z.writestr("nvidia_x-1.dist-info/RECORD", "")
            dest = Path(tmp) / "include"
            self.assertEqual(IC._extract_includes(whl, dest), 2)
            self.assertEqual((dest / "cudnn.h").read_text(), "// cudnn\n")
            self.assertTrue((dest / "crt/host_config.h").is_file())
            self.assertFalse((dest / "__init__.py").exists())
            self.assertEqual(IC.missing_headers(dest, ["cudnn.h", "crt/host_config.h", "cub/cub.cuh"]),
                             ["cub/cub.cuh"])

    def test_no_apt_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(IC.shutil, "which", return_value=None):
            with self.assertRaisesRegex(IC.SetupError, r"apt-get not found: nvcc 12\.4 comes from Debian's "
                                        r"nvidia-cuda-toolkit \(PyPI's nvidia-cuda-nvcc-cu12 wheels have no"):
                IC.fetch_debian_compiler(IC.CUDA_12_4, Path(tmp), log=lambda s: None)

    def test_nvcc_profile_points_into_the_toolchain(self):
        self.assertIn("NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice", IC.NVCC_PROFILE)
        self.assertIn('"-I$(TOP)/include"', IC.NVCC_PROFILE)
        self.assertEqual(IC.DEBIAN_FILES["usr/lib/nvidia-cuda-toolkit/bin/cicc"], "nvvm/bin/cicc")


class TestCompileCommands(TestCase):
    paths = IC.Paths(tree=Path("/w/pytorch"), build=Path("/w/build"), gen=Path("/g/aten/src"),
                     toolchain=Path("/tc"), objects=Path("/w/obj"))

    def test_nvcc_unit(self):
        cmd = IC.compile_command("aten/src/ATen/native/cuda/GridSampler.cu", "nvcc", self.paths, "c++17")
        self.assertEqual(cmd[:3], ["/tc/bin/nvcc", "-c", "-std=c++17"])
        for flag in ("-DCUB_WRAPPED_NAMESPACE=at_cuda_detail", "-DTORCH_CUDA_BUILD_MAIN_LIB",
                     "-DAT_PER_OPERATOR_HEADERS", "--expt-relaxed-constexpr", "--expt-extended-lambda",
                     "arch=compute_90,code=sm_90", "-I/g/aten/src", "-I/w/build", "-I/w/pytorch/aten/src"):
            self.assertIn(flag, cmd)
        self.assertEqual(cmd[cmd.index("-isystem") + 1], "/tc/include")
        # nvcc splits -Xcudafe values at commas: each piece must be a whole option
        suppress = cmd[cmd.index("-Xcudafe") + 1].split(",")
        self.assertTrue(suppress and all(s.startswith("--diag_suppress=") for s in suppress), suppress)
        self.assertEqual(cmd[-3:], ["-o", "/w/obj/aten__src__ATen__native__cuda__GridSampler.cu.o",
                                    "/w/pytorch/aten/src/ATen/native/cuda/GridSampler.cu"])
        # generated headers before the tree's own: a stale Config.h in a tree must not win
        self.assertLess(cmd.index("-I/g/aten/src"), cmd.index("-I/w/pytorch/aten/src"))

    def test_cpp_units(self):
        cpu = IC.compile_command("aten/src/ATen/native/GridSampler.cpp", "cpp", self.paths, "c++17")
        self.assertEqual(cpu[0], "g++")
        self.assertIn("-DCAFFE2_BUILD_MAIN_LIB", cpu)
        self.assertNotIn("-DTORCH_CUDA_BUILD_MAIN_LIB", cpu)
        self.assertNotIn("/tc/include", cpu)
        gpu = IC.compile_command("aten/src/ATen/native/cudnn/GridSampler.cpp", "cuda-cpp", self.paths, "c++17")
        self.assertIn("-DTORCH_CUDA_BUILD_MAIN_LIB", gpu)
        self.assertEqual(gpu[gpu.index("-isystem") + 1], "/tc/include")
        self.assertIn("-Werror", gpu)


class TestCompatHeaders(TestCase):
    """The core calls helpers that torch 2.15's GridSampler.cuh has and v2.6.0's lacks: the kit's
    compat folder goes ahead of the tree's headers for the core's unit alone, in a tree before
    2.15, with the release as macros where the tree has no generated torch/version.h."""

    core = "aten/src/ATen/native/cuda/GridSamplerDeterministic.cu"

    def test_flags_by_release_and_version_header(self):
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp)
            compat = f"-I{IC.COMPAT_INCLUDE}"
            self.assertEqual(IC.compat_flags(tree, "2.6.0a0\n"),
                             (compat, "-DTORCH_VERSION_MAJOR=2", "-DTORCH_VERSION_MINOR=6"))
            self.assertEqual(IC.compat_flags(tree, "2.14.1"),
                             (compat, "-DTORCH_VERSION_MAJOR=2", "-DTORCH_VERSION_MINOR=14"))
            self.assertEqual(IC.compat_flags(tree, "2.15.0a0"), ())
            self.assertEqual(IC.compat_flags(tree, "2.16.0a0"), ())
            # a configured tree's own torch/version.h gives the release
            header = tree / "torch/csrc/api/include/torch/version.h"
            header.parent.mkdir(parents=True)
            header.write_text("#pragma once\n")
            self.assertEqual(IC.compat_flags(tree, "2.6.0a0"), (compat,))
            with self.assertRaises(IC.SetupError):
                IC.release_of("main")
            with self.assertRaises(IC.SetupError):
                IC.compat_flags(tree, "2.6.0", compat=tree / "nowhere")

    def test_core_unit_alone_gets_the_compat_folder_first(self):
        paths = IC.Paths(tree=Path("/w/pytorch"), build=Path("/w/build"), gen=Path("/g/aten/src"),
                         toolchain=Path("/tc"), objects=Path("/w/obj"),
                         compat=("-I/kit/compat", "-DTORCH_VERSION_MAJOR=2",
                                 "-DTORCH_VERSION_MINOR=6"))
        core = IC.compile_command(self.core, "nvcc", paths, "c++17")
        self.assertLess(core.index("-I/kit/compat"), core.index("-I/g/aten/src"))
        self.assertLess(core.index("-I/kit/compat"), core.index("-I/w/pytorch/aten/src"))
        self.assertIn("-DTORCH_VERSION_MINOR=6", core)
        for rel, kind in (("aten/src/ATen/native/cuda/GridSampler.cu", "nvcc"),
                          ("aten/src/ATen/native/GridSampler.cpp", "cpp"),
                          ("aten/src/ATen/native/cudnn/GridSampler.cpp", "cuda-cpp")):
            cmd = IC.compile_command(rel, kind, paths, "c++17")
            self.assertNotIn("-I/kit/compat", cmd)
            self.assertNotIn("-DTORCH_VERSION_MINOR=6", cmd)
        # without compat flags (a tree at 2.15 or later) the core compiles like the rest
        plain = IC.compile_command(self.core, "nvcc", TestCompileCommands.paths, "c++17")
        self.assertNotIn(f"-I{IC.COMPAT_INCLUDE}", plain)

    def test_the_compat_header_reads_the_release_where_it_can(self):
        text = (IC.COMPAT_INCLUDE / "ATen/native/cuda/GridSampler.cuh").read_text()
        self.assertIn("#include_next <ATen/native/cuda/GridSampler.cuh>", text)
        self.assertIn("#if __has_include(<torch/version.h>)", text)
        self.assertIn("#if !defined(TORCH_VERSION_MAJOR) || !defined(TORCH_VERSION_MINOR)", text)


class TestMain(TestCase):
    def test_not_a_tree_exits_2_with_the_reason(self):
        err = io.StringIO()
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()):
            rc = IC.main(["--pytorch", tmp])
        self.assertEqual(rc, IC.EXIT_SETUP)
        self.assertIn("no version.txt (not a PyTorch source tree)", err.getvalue())

    def test_unknown_version_exits_2_before_fetching_anything(self):
        err = io.StringIO()
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()), \
                mock.patch.object(IC, "ensure_toolchain", side_effect=AssertionError("fetched")):
            Path(tmp, "version.txt").write_text("3.1.0a0\n")
            rc = IC.main(["--pytorch", tmp])
        self.assertEqual(rc, IC.EXIT_SETUP)
        self.assertIn("no CUDA toolchain known for PyTorch 3.1.0a0", err.getvalue())


if __name__ == "__main__":
    run_tests()
