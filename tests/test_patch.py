"""`detgrid patch` on a real PyTorch tree (Debian's v2.6.0 source) and on synthetic main-shaped files.

The real-tree tests skip, with the reason, when the tree is not cached and Debian cannot be reached.
"""

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

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
        self.assertIn(P.DET_LAUNCHER + "(", cu)
        self.assertEqual(cu.count('alertNotDeterministic("grid_sampler_3d_backward_cuda")'), 1)
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
        self.assertEqual(cu.count("deterministicAlgorithms()"), 1)
        self.assertIn(f"{P.DET_LAUNCHER}(\n        grad_in, grad_grid_out, gout, self, coords,", cu)
        self.assertIn("if (mask[0]) {\n    at::globalContext().alertNotDeterministic(", cu)
        self.assertIn('alertNotDeterministic("grid_sampler_3d_backward_cuda")', cu)
        cudnn = (self.tree / P.CUDNN).read_text()
        self.assertNotIn("alertNotDeterministic", cudnn)
        self.assertIn("grad_output_t,\n        input_t,\n        grid_t,", cudnn)
        self.assertIn("!at::globalContext().deterministicAlgorithms() &&\n      cond_cudnn_grid_sampler(",
                      (self.tree / P.COMPOSITE).read_text())
        self.assertIn('"grid_sampler_2d_backward_cuda",\n            False,\n',
                      (self.tree / P.TEST_TORCH).read_text())
        nn = (self.tree / P.TEST_NN).read_text()
        self.assertLess(nn.index("def test_grid_sample_2d_backward_deterministic("),
                        nn.index("    @dtypes(torch.float)\n    def test_grid_sample_nan_inf"))
        self.assertEqual(nn.count("DeterministicGuard"), 4)  # the existing import + 3 uses, no new import
        compile(nn, P.TEST_NN, "exec")
        doc = (self.tree / P.INIT).read_text()
        act, throw = doc.split("will throw a")
        self.assertIn("grid_sample` when attempting to differentiate a CUDA tensor\n          with 4-D", act)
        self.assertIn("with 5-D input\n        * :func:`torch.cumsum`", throw)
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


if __name__ == "__main__":
    run_tests()
