"""`detgrid patch` on a real PyTorch tree (Debian's v2.6.0 source) and on synthetic main-shaped files.

The real-tree tests skip, with the reason, when the tree is not cached and Debian cannot be reached.
"""

import collections
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from itertools import product
from pathlib import Path

import torch
import torch.nn.functional as F

from torch.testing._internal.common_utils import DeterministicGuard, TestCase, run_tests

from detgrid import patch as P
from detgrid import upstream_tree

KIT = Path(__file__).resolve().parents[1]
FIXTURE_MAIN = Path(__file__).resolve().parent / "fixtures" / "upstream_main"
CHECKED_IN = KIT / "patches" / "v2.6.0.patch"
# where the kernel files come from (the tool honours the same variable)
KERNELS = Path(os.environ.get("DETGRID_KIT_ROOT") or KIT) / "aten_kernels" / "aten/src/ATen/native/cuda"


def run_patch(*argv, env=None):
    out, err = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = P.main(["patch", *map(str, argv)])
    finally:
        os.environ.clear()
        os.environ.update(old)
    return rc, out.getvalue(), err.getvalue()


def snapshot(tree: Path):
    """Every file's bytes (git metadata aside): 'untouched' means this is equal."""
    return {
        str(p.relative_to(tree)): p.read_bytes()
        for p in tree.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(tree).parts
    }


def assert_untouched(tc, tree, before):
    after = snapshot(tree)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    tc.assertTrue(not changed, f"files changed: {changed[:10]}")


def git(tree, *args):
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout


def func_body(text, ret, name):
    """The brace-matched body of the one definition of name (the tool's own scanner)."""
    defs = P._find_defs(text, ret, name)
    assert len(defs) == 1, f"{len(defs)} definitions of {name}"
    return text[defs[0].body_open : defs[0].body_close + 1]


def include_lines(text):
    return re.findall(r"^#include[^\n]*$", text, re.M)


def linter(name):
    """Command for flake8 / ruff: this Python's module, else one on PATH; None if neither."""
    r = subprocess.run([sys.executable, "-m", name, "--version"], capture_output=True, text=True)
    if r.returncode == 0:
        return [sys.executable, "-m", name]
    return [shutil.which(name)] if shutil.which(name) else None


def lint_findings(cmd, tree, files):
    """(file, code, text of the flagged line) for each finding: stable under line shifts, so
    the findings after the patch minus those before are exactly the ones the patch brings."""
    if "ruff" in " ".join(cmd):
        r = subprocess.run([*cmd, "check", "--no-cache", "--output-format=json", *files],
                           cwd=tree, capture_output=True, text=True)
        rows = [(os.path.relpath(f["filename"], tree), f["location"]["row"], f["code"] or "syntax")
                for f in json.loads(r.stdout or "[]")]
    else:
        r = subprocess.run([*cmd, "--format=%(path)s\t%(row)d\t%(code)s", *files],
                           cwd=tree, capture_output=True, text=True)
        rows = [(a, int(b), c) for a, b, c in (ln.split("\t") for ln in r.stdout.splitlines())]
    if r.returncode not in (0, 1):
        raise AssertionError(f"{cmd} failed: {r.stderr[-500:]}")
    lines = {f: (Path(tree) / f).read_text().splitlines() for f in {row[0] for row in rows}}
    return collections.Counter((f, code, lines[f][row - 1].strip() if row <= len(lines[f]) else "")
                               for f, row, code in rows)


_TREE = None
_TREE_ERR = None


def real_tree():
    global _TREE, _TREE_ERR
    if _TREE is None and _TREE_ERR is None:
        try:
            _TREE = upstream_tree.fetch()
        except Exception as e:  # noqa: BLE001 - any failure to fetch is a skip reason
            _TREE_ERR = f"Debian's pytorch {upstream_tree.DEBIAN_VERSION} source unavailable: {e}"
    if _TREE is None:
        raise unittest.SkipTest(_TREE_ERR)
    return _TREE


class TestPatchRealTree(TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="detgrid-patch-"))
        cls._patched = None

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def fresh(self, name):
        return upstream_tree.fresh_git_copy(self.tmp / name, real_tree())

    def test_applies_then_noop(self):
        tree = self.fresh("apply")
        out = self.tmp / "apply.patch"
        rc, stdout, stderr = run_patch("--pytorch", tree, "--out", out)
        self.assertEqual(rc, 0, stderr)
        self.assertIn("base: v2.6.0", stdout)
        for name in P.KERNEL_FILES:
            self.assertEqual((tree / P.KERNEL_DIR / name).read_bytes(),
                             (KERNELS / name).read_bytes())
        cu = (tree / P.CU).read_text()
        for dims in P.DIMS:
            self.assertIn(P.DET_LAUNCHERS[dims] + "(", cu)
            # deterministic on both: the backward alerts are gone, not merely unreachable
            self.assertNotIn(f'alertNotDeterministic("grid_sampler_{dims}d_backward_cuda")', cu)
        after = snapshot(tree)
        rc, stdout, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "again.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertIn("already applied", stdout)
        assert_untouched(self, tree, after)
        self.assertFalse((self.tmp / "again.patch").exists())

        # the produced patch re-applies to a pristine copy, and --check says so
        pristine = self.fresh("pristine")
        subprocess.run(["git", "apply", "--check", str(out)], cwd=pristine, check=True)
        rc, stdout, _ = run_patch("--pytorch", pristine, "--check", "--out", out)
        self.assertEqual(rc, 0)
        self.assertIn("applies cleanly", stdout)
        rc, stdout, _ = run_patch("--pytorch", tree, "--check", "--out", out)
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)

        # patches/v2.6.0.patch is what the tool produces from this tree today
        regen = f"cd {KIT} && .venv/bin/{upstream_tree.REGENERATE}"
        self.assertTrue(CHECKED_IN.is_file(), f"patches/v2.6.0.patch missing; run: {regen}")
        self.assertTrue(
            CHECKED_IN.read_text() == out.read_text(),
            f"patches/v2.6.0.patch is stale (aten_kernels/ or patch.py changed); regenerate it with "
            f"`{regen}` and commit it")

    def patched(self):
        """One patched copy (and the tool's stdout) for the tests that only read it."""
        cls = type(self)
        if cls._patched is None:
            tree = self.fresh("patched")
            rc, stdout, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "patched.patch")
            self.assertEqual(rc, 0, stderr)
            cls._patched = (tree, stdout)
        return cls._patched

    def test_dispatch_in_both_launchers(self):
        tree, _ = self.patched()
        pristine = (real_tree() / P.CU).read_text()
        cu = (tree / P.CU).read_text()
        for dims in P.DIMS:
            body = func_body(cu, r"\bvoid", P.LAUNCHERS[dims])
            branch = ("if (globalContext().deterministicAlgorithms() && output_mask[0]) {\n"
                      f"    {P.DET_LAUNCHERS[dims]}(\n"
                      "        grad_input, grad_grid, grad_output, input, grid,\n"
                      "        interpolation_mode, padding_mode, align_corners,\n"
                      "        output_mask);\n    return;\n  }\n")
            self.assertEqual(body.count(branch), 1, body[:1500])
            # after the shape checks, before the atomicAdd kernel is launched
            self.assertLess(body.index(f"check_grid_sampler_{dims}d("), body.index(branch))
            self.assertLess(body.index(branch), body.index(f"grid_sampler_{dims}d_backward_kernel<scalar_t>"))
            self.assertNotIn("alertNotDeterministic", body)
        # everything outside the two launchers is as it was, includes aside
        for dims in P.DIMS:
            cu = cu.replace(func_body(cu, r"\bvoid", P.LAUNCHERS[dims]), "{}")
            pristine = pristine.replace(func_body(pristine, r"\bvoid", P.LAUNCHERS[dims]), "{}")
        self.assertEqual(include_lines(cu), [include_lines(pristine)[0], include_lines(pristine)[1],
                                             f"#include <ATen/native/cuda/{P.DET_HEADER}>",
                                             *include_lines(pristine)[2:]])
        self.assertEqual(re.sub(r"^#include[^\n]*\n", "", cu, flags=re.M),
                         re.sub(r"^#include[^\n]*\n", "", pristine, flags=re.M))

    def test_caller_skips_zero_fill_only_in_deterministic_mode(self):
        tree, _ = self.patched()
        cpp = (tree / P.CUDA_CPP).read_text()
        ret = r"std::tuple<\s*Tensor\s*,\s*Tensor\s*>"
        for dims in P.DIMS:
            body = func_body(cpp, ret, f"grid_sampler_{dims}d_backward_cuda")
            self.assertIn(
                "    if (input_requires_grad) {\n"
                "      // The deterministic backward writes every element of grad_input, so it\n"
                f"      // needs no zero fill (see launch_grid_sampler_{dims}d_backward_kernel).\n"
                "      if (at::globalContext().deterministicAlgorithms()) {\n"
                "        return at::empty_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT);\n"
                "      }\n"
                "      return at::zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT);\n"
                "    } else {\n", body)
            # grad_grid and the launcher call are untouched
            self.assertEqual(body.count("empty_like("), 2)
        self.assertIn("#include <ATen/Context.h>\n", cpp)
        self.assertEqual(cpp.count("#include <ATen/ops/empty_like.h>"), 1)  # present in v2.6.0

    def test_docs_list_grid_sample_as_deterministic(self):
        tree, stdout = self.patched()
        doc = (tree / P.INIT).read_text()
        start = doc.index("def use_deterministic_algorithms(")
        act, throw = doc[start : doc.index("In addition, several operations", start)].split(
            "operations will throw a")
        self.assertEqual(act.count("grid_sample"), 1)
        self.assertIn(f"        * {P.GS} when attempting to differentiate a CUDA tensor\n\n", act)
        self.assertNotIn("grid_sample", throw)
        self.assertIn("with indices output when called on a CUDA tensor\n        * :func:`torch.cumsum`", throw)
        # the notes page: a subsection beside the CUDA convolution one, same heading level
        notes = (tree / P.NOTES[0]).read_text()
        conv, grid, rnn = (notes.index(t) for t in ("CUDA convolution determinism\n-------",
                                                    "CUDA grid sampling\n------------------\n",
                                                    "CUDA RNN and LSTM\n-------"))
        self.assertLess(conv, grid)
        self.assertLess(grid, rnn)
        self.assertIn("bitwise identical gradients.\n\nCUDA RNN and LSTM", notes)
        self.assertIn(":func:`torch.nn.functional.grid_sample`", notes[grid:rnn])
        self.assertNotIn("mentions grid_sample", stdout)

    def test_generated_tests(self):
        tree, _ = self.patched()
        tt = (tree / P.TEST_TORCH).read_text()
        for dims in P.DIMS:
            m = re.search(rf"def test_nondeterministic_alert_grid_sample_{dims}d\(.*?\n    (?=\S)", tt, re.S)
            self.assertIn("no alert on any device.\n        self.check_nondeterministic_alert(\n"
                          f"            lambda: res.backward(grad, retain_graph=True),\n"
                          f"            'grid_sampler_{dims}d_backward_cuda',\n            False)\n", m.group(0))
        nn = (tree / P.TEST_NN).read_text()
        cls = nn.index("class TestNNDeviceType(")
        end = re.compile(r"^\S", re.M).search(nn, cls + 1).start()
        for name in P.NN_TEST_NAMES:
            self.assertEqual(nn.count(f"def {name}("), 1)
            self.assertTrue(cls < nn.index(f"def {name}(") < end, name)
        self.assertIn("test_grid_sample_3d_backward_deterministic_matches_default", P.NN_TEST_NAMES)
        self.assertIn("test_grid_sample_3d_backward_deterministic", P.NN_TEST_NAMES)
        self.assertEqual(P.NN_TESTS.count("atol=0, rtol=0"), 5)
        compile(nn, P.TEST_NN, "exec")

    def _check_lint(self, name, config):
        cmd = linter(name)
        if cmd is None:
            raise unittest.SkipTest(f"{name} is not installed (pip install {name})")
        src = real_tree() / config
        if not src.is_file() or (name == "ruff" and "[tool.ruff" not in src.read_text()):
            raise unittest.SkipTest(f"the checkout has no {name} configuration")
        tree = self.fresh(f"lint-{name}")
        shutil.copy2(src, tree / config)  # untracked: the patch's dirty check ignores it
        files = [P.INIT, P.TEST_TORCH, P.TEST_NN]
        # the linter runs, with this configuration, on these paths
        (tree / "test" / "lint_probe.py").write_text("import os\n")
        probe = lint_findings(cmd, tree, ["test/lint_probe.py"])
        self.assertIn(("test/lint_probe.py", "F401", "import os"), probe)
        (tree / "test" / "lint_probe.py").unlink()
        before = lint_findings(cmd, tree, files)
        rc, _, stderr = run_patch("--pytorch", tree, "--out", self.tmp / f"lint-{name}.patch")
        self.assertEqual(rc, 0, stderr)
        new = lint_findings(cmd, tree, files) - before
        self.assertEqual(dict(new), {}, f"{name} findings the patch brings")
        # B950 (flake8-bugbear) is the checkout's line-length rule: max-line-length 120, plus 10%
        added = [ln[1:] for ln in git(tree, "diff", "-U0", "--", *files).splitlines()
                 if ln.startswith("+") and not ln.startswith("+++")]
        self.assertTrue(added)
        self.assertEqual([ln for ln in added if len(ln) > 120], [])

    def test_patched_python_passes_checkout_flake8(self):
        self._check_lint("flake8", ".flake8")

    def test_patched_python_passes_checkout_ruff(self):
        self._check_lint("ruff", "pyproject.toml")

    def test_dirty_tree_refused(self):
        tree = self.fresh("dirty")
        with open(tree / P.TEST_NN, "a") as f:
            f.write("# local edit\n")
        before = snapshot(tree)
        rc, _, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "dirty.patch")
        self.assertEqual(rc, P.EXIT_DIRTY)
        self.assertIn("uncommitted changes", stderr)
        self.assertIn("test/test_nn.py", stderr)
        assert_untouched(self, tree, before)
        rc, _, stderr = run_patch("--pytorch", tree, "--allow-dirty", "--out", self.tmp / "dirty.patch")
        self.assertEqual(rc, 0, stderr)

    def test_sabotaged_anchor_leaves_tree_untouched(self):
        tree = self.fresh("sabotage")
        cu = tree / P.CU
        cu.write_text(cu.read_text().replace(
            'globalContext().alertNotDeterministic("grid_sampler_2d_backward_cuda");', ""))
        git(tree, "commit", "-qam", "sabotage")
        before = snapshot(tree)
        rc, _, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "sab.patch")
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn(P.CU, stderr)
        self.assertIn("alertNotDeterministic", stderr)
        self.assertIn("v2.6.0", stderr)
        assert_untouched(self, tree, before)
        self.assertEqual(git(tree, "status", "--porcelain"), "")

    def test_write_failure_rolls_back(self):
        tree = self.fresh("rollback")
        before = snapshot(tree)
        rc, _, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "rb.patch",
                                  env={"DETGRID_PATCH_FAIL_AFTER": "4"})
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn("restored", stderr)
        assert_untouched(self, tree, before)

    def test_new_files_pass_checkout_lint(self):
        tree = real_tree()
        files = {f"{P.KERNEL_DIR}/{n}": (KERNELS / n).read_bytes()
                 for n in P.KERNEL_FILES}
        self.assertEqual(P.lint_new_files(tree, files), [])
        # the linter does fire on what upstream forbids
        bad = {f"{P.KERNEL_DIR}/Bad.cu": b"#include <cub/cub.cuh>\n\tcudaStreamSynchronize(s);\n"}
        codes = " ".join(P.lint_new_files(tree, bad))
        for code in ("CUBINCLUDE", "RAWCUDA", "TABS"):
            self.assertIn(code, codes)


class TestGeneratedNNTests(TestCase):
    """The tests the patch adds to test/test_nn.py, run here on CPU (@onlyCUDA stubbed out): their
    shapes, modes and helpers must work, and the CPU backward they then exercise is deterministic."""

    def generated(self, name):
        ns = dict(torch=torch, F=F, product=product, DeterministicGuard=DeterministicGuard,
                  unittest=unittest, TEST_CUDNN=False, TestCase=TestCase,
                  onlyCUDA=lambda f: f, dtypes=lambda *_: (lambda f: f))
        exec("class Generated(TestCase):\n" + P.NN_TESTS, ns)
        return getattr(ns["Generated"](name), name)

    def test_generated_tests_run_on_cpu(self):
        names = [n for n in P.NN_TEST_NAMES if "cudnn" not in n]  # cuDNN is CUDA-only
        self.assertEqual(len(names), 4)
        for name, dtype in product(names, (torch.float, torch.double)):
            with self.subTest(name=name, dtype=dtype):
                self.generated(name)("cpu", dtype)

    def test_generated_tests_can_fail(self):
        # a backward that differs from run to run must fail the reproducibility check
        calls = []

        def noisy(self, input, grid, grad_output, **kwargs):
            calls.append(1)
            return torch.full_like(input, len(calls)), torch.zeros_like(grid)

        test = self.generated("test_grid_sample_3d_backward_deterministic")
        test.__self__._grid_sample_grads = noisy.__get__(test.__self__)
        with self.assertRaises(AssertionError):
            test("cpu", torch.float)


class TestPatchSyntheticMain(TestCase):
    """Files shaped like upstream main (renamed launcher parameters, one per line, at::-qualified
    context, an existing deterministic branch, a cuDNN alert): the anchors are semantic."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-main-"))
        self.tree = self.tmp / "tree"
        shutil.copytree(FIXTURE_MAIN, self.tree)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_main_shaped_tree(self):
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "m.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertIn("base: v2.11.0", stdout)
        self.assertIn("replaced an existing deterministic branch", stdout)
        self.assertIn("randomness.md mentions grid_sample", stdout)
        cu = (self.tree / P.CU).read_text()
        self.assertNotIn("grid_sampler_2d_backward_det(", cu)
        self.assertNotIn("grid_sampler_3d_backward_det(", cu)
        self.assertEqual(cu.count("deterministicAlgorithms()"), 2)
        self.assertIn(f"{P.DET_LAUNCHER}(\n        grad_in, grad_grid_out, gout, self, coords,", cu)
        # 3D: renamed parameters, and upstream's if/else collapsed into our branch + its else body
        self.assertIn(f"{P.DET_LAUNCHERS[3]}(\n        grad_volume, grad_coords, gout, volume, coords,\n"
                      "        interp, padding, corners,\n        mask);\n    return;\n  }\n", cu)
        self.assertIn("single writer per element.\n  if (gout.numel() > 0) { /* the atomicAdd kernel */ }\n}",
                      cu)
        self.assertNotIn("alertNotDeterministic", cu)
        # the replaced branches' header is no longer included; ours is, once
        self.assertNotIn("GridSamplerDet.h", cu)
        self.assertIn("removed #include <ATen/native/cuda/GridSamplerDet.h>", stdout)
        self.assertEqual(cu.count(f"#include <ATen/native/cuda/{P.DET_HEADER}>"), 1)
        cpp = (self.tree / P.CUDA_CPP).read_text()
        for alloc in ("input", "volume"):
            self.assertIn("if (at::globalContext().deterministicAlgorithms()) {\n"
                          f"        return at::empty_like({alloc}, LEGACY_CONTIGUOUS_MEMORY_FORMAT);\n"
                          f"      }}\n      return at::zeros_like({alloc}, LEGACY_CONTIGUOUS_MEMORY_FORMAT);", cpp)
        self.assertIn("#include <ATen/native/cuda/GridSampler.h>\n#include <ATen/Context.h>\n", cpp)
        self.assertIn("#include <ATen/ops/empty.h>\n#include <ATen/ops/empty_like.h>\n", cpp)
        cudnn = (self.tree / P.CUDNN).read_text()
        self.assertNotIn("alertNotDeterministic", cudnn)
        self.assertIn("grad_output_t,\n        input_t,\n        grid_t,", cudnn)
        self.assertIn("!at::globalContext().deterministicAlgorithms() &&\n      cond_cudnn_grid_sampler(",
                      (self.tree / P.COMPOSITE).read_text())
        tt = (self.tree / P.TEST_TORCH).read_text()
        self.assertIn('"grid_sampler_2d_backward_cuda",\n            False,\n', tt)
        self.assertIn('(fn, "grid_sampler_3d_backward_cuda", False)\n', tt)
        nn = (self.tree / P.TEST_NN).read_text()
        for name in P.NN_TEST_NAMES:
            self.assertLess(nn.index(f"def {name}("),
                            nn.index("    @dtypes(torch.float)\n    def test_grid_sample_nan_inf"))
        self.assertEqual(nn.count("DeterministicGuard"), 4)  # the existing import + 3 uses, no new import
        compile(nn, P.TEST_NN, "exec")
        doc = (self.tree / P.INIT).read_text()
        act, throw = doc.split("will throw a")
        self.assertIn("requires grad\n        * :func:`torch.nn.functional.grid_sample` when attempting to "
                      "differentiate a CUDA tensor\n\n", act)
        self.assertNotIn("grid_sample", throw)
        self.assertIn("- ``linear``\n\n        * :func:`torch.cumsum`", throw)
        # main's notes page already has a grid sampling section: noted, left alone
        self.assertEqual((self.tree / P.NOTES[1]).read_bytes(), (FIXTURE_MAIN / P.NOTES[1]).read_bytes())
        # idempotent
        before = snapshot(self.tree)
        rc, stdout, _ = run_patch("--pytorch", self.tree, "--out", self.tmp / "m2.patch")
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)
        assert_untouched(self, self.tree, before)

    def test_unknown_signature_is_refused(self):
        cu = self.tree / P.CU
        cu.write_text(cu.read_text().replace("    std::array<bool, 2> mask) {", "    std::array<bool, 2> mask,\n"
                                             "    int64_t extra) {"))
        before = snapshot(self.tree)
        rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "x.patch")
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn("parameters", stderr)
        self.assertIn("v2.11.0", stderr)
        assert_untouched(self, self.tree, before)

    def edit(self, rel, old, new):
        f = self.tree / rel
        text = f.read_text()
        self.assertIn(old, text)
        f.write_text(text.replace(old, new))

    def assert_refused(self, *expected):
        before = snapshot(self.tree)
        rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "x.patch")
        self.assertEqual(rc, P.EXIT_ANCHOR, stderr)
        for e in expected:
            self.assertIn(e, stderr)
        assert_untouched(self, self.tree, before)
        self.assertFalse((self.tmp / "x.patch").exists())

    def patch_ok(self):
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "m.patch")
        self.assertEqual(rc, 0, stderr)
        return stdout

    def test_unknown_3d_signature_is_refused(self):
        self.edit(P.CU, "    bool corners,\n    std::array<bool, 2> mask) {",
                  "    bool corners,\n    std::array<bool, 2> mask,\n    int64_t extra) {")
        self.assert_refused(P.LAUNCHERS[3], "parameters", "extra", "v2.11.0")

    def test_missing_3d_alert_is_refused(self):
        self.edit(P.CU, 'at::globalContext().alertNotDeterministic("grid_sampler_3d_backward_cuda");', "")
        self.assert_refused('alertNotDeterministic("grid_sampler_3d_backward_cuda")', P.LAUNCHERS[3])

    def test_stale_include_kept_while_still_used(self):
        # something else in the file still calls into the replaced path's header
        self.edit(P.CU, "} // namespace at::native",
                  "void warm_up(const TensorBase& t) {\n"
                  "  grid_sampler_3d_backward_det(t, t, t, t, t, {true, true});\n}\n\n"
                  "} // namespace at::native")
        stdout = self.patch_ok()
        self.assertIn("#include <ATen/native/cuda/GridSamplerDet.h>\n", (self.tree / P.CU).read_text())
        self.assertNotIn("removed #include", stdout)

    def test_stale_include_kept_when_header_missing(self):
        # the tree cannot tell what the header declared: leave the include to a human
        (self.tree / P.KERNEL_DIR / "GridSamplerDet.h").unlink()
        stdout = self.patch_ok()
        self.assertIn("#include <ATen/native/cuda/GridSamplerDet.h>\n", (self.tree / P.CU).read_text())
        self.assertNotIn("removed #include", stdout)

    def test_kit_without_3d_launcher_is_refused(self):
        kit = self.tmp / "kit"
        shutil.copytree(KERNELS, kit / "aten_kernels" / P.KERNEL_DIR)
        header = kit / "aten_kernels" / P.KERNEL_DIR / P.DET_HEADER
        text = header.read_text()
        start = text.index(f"void {P.DET_LAUNCHERS[3]}(")
        header.write_text(text[:start] + text[text.index(";", start) + 1 :])
        before = snapshot(self.tree)
        rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "x.patch",
                                  env={"DETGRID_KIT_ROOT": str(kit)})
        self.assertEqual(rc, P.EXIT_ANCHOR, stderr)
        self.assertIn(P.DET_LAUNCHERS[3], stderr)
        self.assertIn("3D launcher", stderr)
        assert_untouched(self, self.tree, before)

    def test_unfamiliar_allocation_keeps_zero_fill(self):
        # a zeros_like that is not the masked grad_input allocation: left alone (only a note)
        self.edit(P.CUDA_CPP, "    if (wants_input_grad) {\n      return at::zeros_like(volume,",
                  "    if (volume.defined()) {\n      return at::zeros_like(volume,")
        stdout = self.patch_ok()
        self.assertIn("grid_sampler_3d_backward_cuda: grad_input allocation not in the expected shape", stdout)
        cpp = (self.tree / P.CUDA_CPP).read_text()
        self.assertNotIn("empty_like(volume", cpp)
        self.assertIn("return at::empty_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT);", cpp)

    def test_notes_page_gets_a_section(self):
        # a main-shaped page that does not mention grid_sample yet; a "# comment" in a code block
        # after the anchor section is no heading
        md = self.tree / P.NOTES[1]
        md.write_text("# Reproducibility\n\n## Avoiding nondeterministic algorithms\n\n"
                      "### CUDA convolution determinism\n\nSome text.\n\n```python\n# not a heading\n```\n\n"
                      "### CUDA RNN and LSTM\n\nMore text.\n\n## DataLoader\n")
        stdout = self.patch_ok()
        text = md.read_text()
        self.assertIn("```\n\n### CUDA grid sampling\n\nThe CUDA backward of {func}`torch.nn.functional.grid_sample`",
                      text)
        self.assertIn("bitwise identical gradients.\n\n### CUDA RNN and LSTM\n", text)
        self.assertNotIn("mentions grid_sample", stdout)
        # a second run sees its own section and changes nothing
        before = snapshot(self.tree)
        rc, stdout, _ = run_patch("--pytorch", self.tree, "--out", self.tmp / "m2.patch")
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)
        assert_untouched(self, self.tree, before)

    def test_notes_page_without_a_place_is_only_noted(self):
        md = self.tree / P.NOTES[1]
        md.write_text("# Reproducibility\n\nNothing per operation here.\n")
        stdout = self.patch_ok()
        self.assertIn("no 'CUDA convolution determinism' section", stdout)
        self.assertEqual(md.read_text(), "# Reproducibility\n\nNothing per operation here.\n")

    def test_older_partial_tests_are_refused(self):
        # only the 2D test present (an older detgrid patch): inserting all again would redefine it
        self.edit(P.TEST_NN, "    def test_other(self, device):",
                  "    def test_grid_sample_2d_backward_deterministic(self, device):\n        pass\n\n"
                  "    def test_other(self, device):")
        self.assert_refused("only some of the tests present", "test_grid_sample_2d_backward_deterministic")

    def test_docstring_listing_both_ways_is_refused(self):
        self.edit(P.INIT, "that requires grad\n",
                  "that requires grad\n        * :func:`torch.nn.functional.grid_sample` when attempting to "
                  "differentiate a CUDA tensor\n          with 4-D input\n")
        self.assert_refused("listed as both deterministic and throwing")


if __name__ == "__main__":
    run_tests()
