"""`detgrid patch` on a real PyTorch tree (Debian's v2.6.0 source), on main as known and on a tree
with #196856 (tests/fixtures/*/README.md say what they mirror): the core (`--upto core`), the
cuDNN patch after it (`--upto cudnn`) and the core's speed levels after that (the default: the
whole stack), their anchors, refusals and idempotence.

The real-tree tests skip, with the reason, when the tree is not cached and Debian cannot be reached.
"""

import ast
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
import textwrap
import unittest
from itertools import product
from pathlib import Path
from typing import Dict

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import patch as P
from detgrid.kit import stack, upstream_tree

KIT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_MAIN = FIXTURES / "upstream_main"
FIXTURE_196856 = FIXTURES / "upstream_196856"
CHECKED_IN = KIT / "patches" / "v2.6.0.patch"
CHECKED_IN_TESTS = KIT / "patches" / "v2.6.0-tests.patch"
# where the kernel files come from (the tool honours the same variable)
KIT_ROOT = Path(os.environ.get("DETGRID_KIT_ROOT") or KIT)
KERNELS = KIT_ROOT / "aten_kernels" / "aten/src/ATen/native/cuda"
AUTHOR = "Patch Tester <patch.tester@example.com>"
# the commit's identity, whatever this machine's git configuration says
IDENTITY = {"GIT_AUTHOR_NAME": "Patch Tester", "GIT_AUTHOR_EMAIL": "patch.tester@example.com",
            "GIT_COMMITTER_NAME": "Patch Tester", "GIT_COMMITTER_EMAIL": "patch.tester@example.com"}


def run_patch(*argv, env=None):
    out, err = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    os.environ.update({**IDENTITY, **(env or {})})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = P.main(["patch", *map(str, argv)])
            except SystemExit as e:  # argparse
                rc = e.code
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


def git_copy(src: Path, dest: Path) -> Path:
    """``src``'s files as a one-commit git checkout at ``dest``."""
    shutil.copytree(src, dest)
    env = dict(os.environ, **IDENTITY)
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(dest), *cmd], check=True, capture_output=True, env=env)
    return dest


def leftovers(tree: Path, *dirs: Path):
    """Temporaries and journals that must not survive a run."""
    found = [p for d in (tree, *dirs) for p in Path(d).rglob("*") if p.name.endswith(".detgrid-tmp")]
    found += list((tree / ".git").glob("detgrid-patch.json*"))
    return found


def diff_part(patch_text: str) -> str:
    """A format-patch file without what changes from one run to the next (hashes, date,
    author, base): the diffs, from the first `diff --git` to the signature."""
    body = patch_text[patch_text.index("diff --git") :]
    body = re.sub(r"^index [0-9a-f]+\.\.[0-9a-f]+", "index", body, flags=re.M)
    body = re.sub(r"^base-commit: [0-9a-f]+\n", "", body, flags=re.M)
    return body[: body.rindex("\n-- \n")] if "\n-- \n" in body else body


def func_body(text, ret, name):
    """The brace-matched body of the one definition of name (the tool's own scanner)."""
    defs = P._find_defs(text, ret, name)
    assert len(defs) == 1, f"{len(defs)} definitions of {name}"
    return text[defs[0].body_open : defs[0].body_close + 1]


# the CUDA backwards that allocate grad_input: the patch leaves this file as it is
CUDA_CPP = "aten/src/ATen/native/cuda/GridSampler.cpp"
# #191915's checks, as main's launchers call them (tests/fixtures/upstream_main/README.md)
CHECKS_191915 = {2: "check_grid_sampler_2d_backward(input, grid, grad_output);\n",
                 3: "check_grid_sampler_3d_backward(input, grid, grad_output, interpolation_mode);\n"}


def assert_one_decision_per_call(tc, tree, pristine):
    """grad_input stays zero-filled as stock allocates it (cuda/GridSampler.cpp byte for byte,
    without a read of the flag), and each backward launcher reads deterministicAlgorithms()
    exactly once: no second read can disagree with the one that picked the kernel."""
    tc.assertEqual((tree / CUDA_CPP).read_bytes(), (pristine / CUDA_CPP).read_bytes(), CUDA_CPP)
    tc.assertNotIn("deterministicAlgorithms", (tree / CUDA_CPP).read_text())
    cu = (tree / P.CU).read_text()
    for dims in P.DIMS:
        body = P._code_only(func_body(cu, r"\bvoid", P.LAUNCHERS[dims]))
        tc.assertEqual(body.count("deterministicAlgorithms()"), 1, P.LAUNCHERS[dims])


def include_lines(text):
    return re.findall(r"^#include[^\n]*$", text, re.M)


def det_branch(args, alert, mask="output_mask", ctx="globalContext()", ind="  "):
    """The launcher's branch as the patch writes it: ``args`` the argument lines of the call,
    ``alert`` the caller the else branch alerts as."""
    i = ind + "  "
    return (f"{ind}if ({mask}[0] && {ctx}.deterministicAlgorithms()) {{\n"
            f"{i}// See Note [Deterministic grid_sampler backward]: grad_input without\n"
            f"{i}// atomics. The kernel below then computes grad_grid alone, one writer\n"
            f"{i}// per element.\n"
            f"{i}{P.DET_LAUNCHER}(\n"
            + "".join(f"{i}    {line}\n" for line in args)
            + f"{i}{mask}[0] = false;\n"
            f"{ind}}} else if ({mask}[0]) {{\n"
            f"{i}// See Note [Writing Nondeterministic Operations]\n"
            f"{i}// Nondeterministic because of atomicAdd usage\n"
            f'{i}{ctx}.alertNotDeterministic("{alert}");\n'
            f"{ind}}}\n")


DEFAULT_ARGS = ("grad_input, grad_output, input, grid, interpolation_mode, padding_mode,",
                "align_corners);")
# the files each patch writes on main as known (its cuDNN backward alerts already: #180417)
CORE_PATHS = sorted((P.CORE_SOURCE, P.CU, P.CU_HEADER, P.TEST_NN, P.TEST_TORCH))
CUDNN_PATHS_MAIN = sorted((P.COMPOSITE, P.INIT, P.NOTES[1], P.TEST_NN, P.TEST_TORCH))


def changed_paths(tree, rev="HEAD~1"):
    return sorted(git(tree, "diff", "--name-only", rev, "HEAD").split())


def subject(tree):
    return git(tree, "log", "-1", "--format=%s").strip()


def composite_condition(text):
    """The condition of grid_sampler()'s cuDNN branch."""
    body = func_body(text, r"\bTensor", "grid_sampler")
    start = body.index("if (cond_cudnn_grid_sampler(")
    return body[start + 4 : P._match(body, start + 3, "(", ")")]


def linter(name):
    """Command for flake8 / ruff: this Python's module, else one on PATH; None if neither."""
    r = subprocess.run([sys.executable, "-m", name, "--version"], capture_output=True, text=True)
    if r.returncode == 0:
        return [sys.executable, "-m", name]
    return [shutil.which(name)] if shutil.which(name) else None


def lint_findings(cmd, tree, files, select=None):
    """(file, code, text of the flagged line) for each finding: stable under line shifts, so
    the findings after the patch minus those before are exactly the ones the patch brings."""
    sel = [f"--select={select}"] if select else []
    if "ruff" in " ".join(cmd):
        r = subprocess.run([*cmd, "check", "--no-cache", "--output-format=json", *sel, *files],
                           cwd=tree, capture_output=True, text=True)
        rows = [(os.path.relpath(f["filename"], tree), f["location"]["row"], f["code"] or "syntax")
                for f in json.loads(r.stdout or "[]")]
    else:
        r = subprocess.run([*cmd, "--format=%(path)s\t%(row)d\t%(code)s", *sel, *files],
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


# What only the extension's tests need: the host build's launch shape, which core_ops.cpp checks
# and sets through hostify's Config (issue 22: no test knobs in the upstream files).
KNOB_MESSAGES = ("block_size, grid_size and shuffle_seed",)
KNOB_STRUCTS = ("LaunchShape", "hostify::Config")
EXTENSION = KIT / "aten_kernels" / "extension"


class TestKernelFilesCarryNoKnobs(TestCase):
    def test_copied_files_hold_no_knob_override_or_validation(self):
        for name in P.CORE_FILES:
            text = (KERNELS / name).read_text()
            self.assertEqual([s for s in KNOB_MESSAGES + KNOB_STRUCTS if s in text], [], name)

    def test_the_knob_messages_are_the_extensions(self):
        # The strings the test above looks for are the ones the extension's launch shape uses,
        # so it would see them come back.
        text = "".join(p.read_text() for p in sorted(EXTENSION.iterdir()) if p.is_file())
        self.assertEqual([s for s in KNOB_MESSAGES + KNOB_STRUCTS if s not in text], [])


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

    def test_pristine_copies_of_one_tree_share_their_base_commit(self):
        # PR.md names the base commit: it must not move each time the patch is regenerated
        first = git(self.fresh("pristine-a"), "rev-parse", "HEAD").strip()
        second = git(self.fresh("pristine-b"), "rev-parse", "HEAD").strip()
        self.assertEqual(first, second)

    def test_applies_as_one_commit_then_noop(self):
        tree = self.fresh("apply")
        base = git(tree, "rev-parse", "HEAD").strip()
        out = self.tmp / "apply.patch"
        rc, stdout, stderr = run_patch("--pytorch", tree, "--out", out)
        self.assertEqual(rc, 0, stderr)
        self.assertIn("base: v2.6.0", stdout)
        # the core's file, as the whole stack (the core and its speed levels) has it
        for rel, text in stack.core_sources(KIT_ROOT, P.TOP).items():
            self.assertEqual((tree / rel).read_text(), text)
        cu = (tree / P.CU).read_text()
        for dims in P.DIMS:
            # deterministic on both: the alert is left only where deterministic mode never goes
            body = func_body(cu, r"\bvoid", P.LAUNCHERS[dims])
            self.assertEqual(body.count(det_branch(DEFAULT_ARGS, f"grid_sampler_{dims}d_backward_cuda")), 1)
        # one commit on the base, by the user's identity, holding the whole change
        self.assertEqual(git(tree, "rev-parse", "HEAD~1").strip(), base)
        self.assertEqual(git(tree, "log", "-1", "--format=%an <%ae>|%cn <%ce>").strip(), f"{AUTHOR}|{AUTHOR}")
        self.assertEqual(git(tree, "status", "--porcelain"), "")
        text = out.read_text()
        self.assertIn(f"From: {AUTHOR}\n", text)
        self.assertIn(f"Subject: [PATCH] {stack.UPSTREAM_STACK[0].title}\n", text)
        self.assertNotIn("detgrid@users.noreply", text)
        self.assertEqual(leftovers(tree, self.tmp), [])
        after = snapshot(tree)
        rc, stdout, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "again.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertIn("already applied", stdout)
        assert_untouched(self, tree, after)
        self.assertEqual(git(tree, "rev-parse", "HEAD~1").strip(), base)
        self.assertFalse((self.tmp / "again.patch").exists())

        # the produced patch applies to a pristine copy; --check builds the change itself
        pristine = self.fresh("pristine")
        subprocess.run(["git", "apply", "--check", str(out)], cwd=pristine, check=True)
        rc, stdout, _ = run_patch("--pytorch", pristine, "--check")
        self.assertEqual(rc, 0)
        # the core's file, GridSampler.cu and .h, the composite GridSampler.cpp,
        # cudnn/GridSampler.cpp, the notes page, test_nn.py, test_torch.py and torch/__init__.py
        self.assertIn(f"applies: {len(P.CORE_FILES) + 8} files", stdout)
        rc, stdout, _ = run_patch("--pytorch", tree, "--check")
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)

        # patches/v2.6.0.patch holds the diffs the tool produces from this tree today
        regen = f"cd {KIT} && .venv/bin/{upstream_tree.REGENERATE}"
        self.assertTrue(CHECKED_IN.is_file(), f"patches/v2.6.0.patch missing; run: {regen}")
        self.assertTrue(
            diff_part(CHECKED_IN.read_text()) == diff_part(text),
            f"patches/v2.6.0.patch is stale (aten_kernels/ or patch.py changed); regenerate it with "
            f"`{regen}` and commit it")

    def test_checked_in_tests_only_patch_is_what_the_tool_writes_today(self):
        tree = self.fresh("tests-only")
        out = self.tmp / "tests-only.patch"
        rc, _, stderr = run_patch("--pytorch", tree, "--tests-only", "--out", out)
        self.assertEqual(rc, 0, stderr)
        regen = f"cd {KIT} && .venv/bin/{upstream_tree.REGENERATE_TESTS}"
        self.assertTrue(CHECKED_IN_TESTS.is_file(), f"patches/v2.6.0-tests.patch missing; run: {regen}")
        self.assertTrue(
            diff_part(CHECKED_IN_TESTS.read_text()) == diff_part(out.read_text()),
            f"patches/v2.6.0-tests.patch is stale; regenerate it with `{regen}` and commit it")

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
            # grad_input by the deterministic launcher, then the existing kernel for grad_grid
            # alone (output_mask[0] cleared): one writer per grad_grid element; the alert, with
            # its Note, in the else branch that reaches the atomicAdd for grad_input
            branch = det_branch(DEFAULT_ARGS, f"grid_sampler_{dims}d_backward_cuda")
            self.assertEqual(body.count(branch), 1, body[:1500])
            # after the shape checks, before the atomicAdd kernel is launched
            self.assertLess(body.index(f"check_grid_sampler_{dims}d("), body.index(branch))
            self.assertLess(body.index(branch), body.index(f"grid_sampler_{dims}d_backward_kernel<scalar_t>"))
            self.assertEqual(body.count("alertNotDeterministic"), 1)
        # everything outside the two launchers is as it was, includes too: GridSampler.h, which
        # the file includes already, declares the launcher
        for dims in P.DIMS:
            cu = cu.replace(func_body(cu, r"\bvoid", P.LAUNCHERS[dims]), "{}")
            pristine = pristine.replace(func_body(pristine, r"\bvoid", P.LAUNCHERS[dims]), "{}")
        self.assertEqual(cu, pristine)

    def test_launcher_is_declared_beside_the_backward_launchers(self):
        tree, _ = self.patched()
        header, pristine = ((t / P.CU_HEADER).read_text() for t in (tree, real_tree()))
        end = pristine.index(";", pristine.index(f"void {P.LAUNCHERS[3]}(")) + 2
        self.assertEqual(header, pristine[:end] + "\n" + P.det_declaration() + pristine[end:])
        self.assertEqual(P.det_declaration(),
                         f"void {P.DET_LAUNCHER}(\n"
                         "    const TensorBase &grad_input, const TensorBase &grad_output,\n"
                         "    const TensorBase &input, const TensorBase &grid, int64_t interpolation_mode,\n"
                         "    int64_t padding_mode, bool align_corners);\n")
        # the kit's .cu defines what the header declares, and includes that header, in every
        # build of it the stack writes (the core's and each speed level's)
        for name in stack.UPSTREAM_NAMES:
            core = stack.core_sources(KIT_ROOT, name)[P.CORE_SOURCE]
            P.check_kit_core(P.CORE_SOURCE, core.encode())
            self.assertIn("#include <ATen/native/cuda/GridSampler.h>\n", core)

    def test_composite_leaves_cudnn_in_deterministic_mode(self):
        # the composite's cuDNN condition gains the flag, with a one-line why; nothing else of
        # the file changes but the include of ATen/Context.h
        tree, _ = self.patched()
        text, pristine = ((t / P.COMPOSITE).read_text() for t in (tree, real_tree()))
        cond = composite_condition(text)
        self.assertEqual(cond, composite_condition(pristine)
                         + " &&\n      !at::globalContext().deterministicAlgorithms()")
        self.assertIn(f"  {P.COMPOSITE_WHY}\n  if (cond_cudnn_grid_sampler(", text)
        self.assertEqual(text.replace(f"  {P.COMPOSITE_WHY}\n", "").replace(
            " &&\n      !at::globalContext().deterministicAlgorithms()", "").replace(
            "#include <ATen/Context.h>\n", ""), pristine)

    def test_grad_input_stays_zero_filled_and_the_flag_is_read_once(self):
        tree, _ = self.patched()
        assert_one_decision_per_call(self, tree, real_tree())

    def test_cudnn_backward_alerts_after_its_checks(self):
        # v2.6.0 lacks #180417's alert: the cuDNN patch adds it where #180417 put it
        tree, stdout = self.patched()
        cpp = (tree / P.CUDNN).read_text()
        ret = r"std::tuple<\s*Tensor\s*,\s*Tensor\s*>"
        body = [b for b in (cpp[d.body_open : d.body_close + 1] for d in P._find_defs(
            cpp, ret, "cudnn_grid_sampler_backward")) if "not compiled" not in b][0]
        order = [body.index(s) for s in ("check_grid_sampler_common(", "cond_cudnn_grid_sampler(",
                                          "  // See Note [Writing Nondeterministic Operations]\n",
                                          'globalContext().alertNotDeterministic("cudnn_grid_sampler_backward");',
                                          "cudnnSpatialTfSamplerBackward(")]
        self.assertEqual(order, sorted(order))
        self.assertNotIn("grid_sampler_2d_backward(", body)
        self.assertEqual(cpp.count("#include <ATen/Context.h>"), 1)
        self.assertNotIn("alerts in deterministic mode already", stdout)
        forward = func_body(cpp.split("#else // AT_CUDNN_ENABLED")[1], r"\bTensor", "cudnn_grid_sampler_forward")
        self.assertNotIn("deterministicAlgorithms", forward)

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
        self.assertIn("bitwise identical gradients.", notes[grid:rnn])
        self.assertIn("does not use cuDNN", notes[grid:rnn])
        self.assertIn("default mode's.\n\nCUDA RNN and LSTM", notes)
        self.assertIn(":func:`torch.nn.functional.grid_sample`", notes[grid:rnn])
        self.assertNotIn("mentions grid_sample", stdout)

    def test_generated_tests(self):
        tree, stdout = self.patched()
        tt = (tree / P.TEST_TORCH).read_text()
        for dims in P.DIMS:
            m = re.search(rf"def test_nondeterministic_alert_grid_sample_{dims}d\(.*?\n    (?=\S)", tt, re.S)
            self.assertIn("): no alert on any device.\n        self.check_nondeterministic_alert(\n"
                          f"            lambda: res.backward(grad, retain_graph=True),\n"
                          f"            'grid_sampler_{dims}d_backward_cuda',\n            False)\n", m.group(0))
        nn = (tree / P.TEST_NN).read_text()
        cls = nn.index("class TestNNDeviceType(")
        end = re.compile(r"^\S", re.M).search(nn, cls + 1).start()
        # v2.6.0 has no deterministic test: every one is added, but the gradgradcheck: v2.6.0 has
        # no derivative of grid_sampler_2d_backward
        gradgrad = "test_grid_sample_backward_deterministic_gradgradcheck"
        self.assertNotIn(gradgrad, nn)
        self.assertIn(f"not adding {gradgrad}", stdout)
        for name in (n for n in P.upstream_nn_tests().names if n != gradgrad):
            self.assertEqual(nn.count(f"def {name}("), 1)
            self.assertTrue(cls < nn.index(f"def {name}(") < end, name)
        self.assertEqual(P._module_imports(P.TEST_NN, nn)["DeterministicGuard"], 1)
        # it joins the tree's own common_utils import (one statement, backslash-continued)
        self.assertIn("    skipIfTorchDynamo, gcIfJetson, set_default_dtype, DeterministicGuard\n", nn)
        self.assertNotIn("import DeterministicGuard\n", nn)
        compile(nn, P.TEST_NN, "exec")
        message = git(tree, "log", "-1", "--format=%B")
        for name in (n for n in P.upstream_nn_tests().names if n != gradgrad):
            self.assertIn(f"adds {name}\n", message)
        self.assertIn("no longer picks cuDNN", " ".join(message.split()))
        # v2.6.0 has no cuDNN alert test: the cuDNN patch adds it, calling cuDNN directly, and
        # beside it the test that grid_sample on a cuDNN-eligible input does not alert
        for name, source in P.CUDNN_TESTS_SOURCE.items():
            self.assertEqual(tt.count(source), 1, name)
        self.assertLess(tt.index(f"def {P.ALERT_TESTS[0][0]}("), tt.index(f"def {P.CUDNN_ALERT_TEST}("))
        self.assertLess(tt.index(f"def {P.CUDNN_ALERT_TEST}("), tt.index(f"def {P.CUDNN_ROUTE_TEST}("))
        self.assertLess(tt.index(f"def {P.CUDNN_ROUTE_TEST}("), tt.index(f"def {P.ALERT_TESTS[1][0]}("))
        compile(tt, P.TEST_TORCH, "exec")

    def _check_lint(self, name, config):
        cmd = linter(name)
        if cmd is None:
            raise unittest.SkipTest(f"{name} is not installed (pip install {name})")
        src = real_tree() / config
        if not src.is_file() or (name == "ruff" and "[tool.ruff" not in src.read_text()):
            raise unittest.SkipTest(f"the checkout has no {name} configuration")
        tree = self.fresh(f"lint-{name}")
        shutil.copy2(src, tree / config)
        git(tree, "add", config)
        git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "lint config")
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
        added = [ln[1:] for ln in git(tree, "diff", "-U0", "HEAD~1", "--", *files).splitlines()
                 if ln.startswith("+") and not ln.startswith("+++")]
        self.assertTrue(added)
        self.assertEqual([ln for ln in added if len(ln) > 120], [])

    def test_patched_python_passes_checkout_flake8(self):
        self._check_lint("flake8", ".flake8")

    def test_patched_python_passes_checkout_ruff(self):
        self._check_lint("ruff", "pyproject.toml")

    def test_sabotaged_anchor_leaves_tree_untouched(self):
        tree = self.fresh("sabotage")
        cu = tree / P.CU
        cu.write_text(cu.read_text().replace(
            'globalContext().alertNotDeterministic("grid_sampler_2d_backward_cuda");', ""))
        git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "sabotage")
        before = snapshot(tree)
        rc, _, stderr = run_patch("--pytorch", tree, "--out", self.tmp / "sab.patch")
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn(P.CU, stderr)
        self.assertIn("alertNotDeterministic", stderr)
        assert_untouched(self, tree, before)
        self.assertEqual(git(tree, "status", "--porcelain"), "")

    def test_new_files_pass_checkout_lint(self):
        tree = real_tree()
        for name in stack.UPSTREAM_NAMES:  # every build of the core's file the stack writes
            files = {rel: text.encode("utf-8")
                     for rel, text in stack.core_sources(KIT_ROOT, name).items()}
            self.assertEqual(P.lint_new_files(tree, files), [], name)
        # the linter does fire on what upstream forbids
        bad = {f"{P.KERNEL_DIR}/Bad.cu": b"#include <cub/cub.cuh>\n\tcudaStreamSynchronize(s);\n"}
        codes = " ".join(P.lint_new_files(tree, bad))
        for code in ("CUBINCLUDE", "RAWCUDA", "TABS"):
            self.assertIn(code, codes)


class FixtureTree(TestCase):
    fixture = FIXTURE_MAIN
    flags = ()  # what every run of `detgrid patch` on this fixture passes

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-fixture-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.tree = git_copy(self.fixture, self.tmp / "tree")
        self.base = git(self.tree, "rev-parse", "HEAD").strip()

    def edit(self, rel, old, new, commit=True):
        f = self.tree / rel
        text = f.read_text()
        self.assertIn(old, text)
        f.write_text(text.replace(old, new))
        if commit:
            git(self.tree, "commit", "-qam", f"edit {rel}")
            self.base = git(self.tree, "rev-parse", "HEAD").strip()

    def assert_refused(self, *expected, rc=P.EXIT_ANCHOR, env=None, flags=None):
        before = snapshot(self.tree)
        flags = self.flags if flags is None else flags
        rc_, _, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "x.patch", *flags,
                                   env=env)
        self.assertEqual(rc_, rc, stderr)
        for e in expected:
            self.assertIn(e, stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        assert_untouched(self, self.tree, before)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD").strip(), self.base)
        self.assertFalse((self.tmp / "x.patch").exists())
        self.assertEqual(leftovers(self.tree, self.tmp), [])
        return stderr

    def patch_ok(self, *extra):
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "m.patch",
                                       *self.flags, *extra)
        self.assertEqual(rc, 0, stderr)
        return stdout

    def assert_noop(self):
        before, head = snapshot(self.tree), git(self.tree, "rev-parse", "HEAD")
        rc, stdout, _ = run_patch("--pytorch", self.tree, "--out", self.tmp / "again.patch")
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)
        assert_untouched(self, self.tree, before)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD"), head)
        self.assertFalse((self.tmp / "again.patch").exists())

    def assert_no_new_lint(self, name):
        cmd = linter(name)
        if cmd is None:
            raise unittest.SkipTest(f"{name} is not installed")
        files = ["test/test_nn.py", "test/test_torch.py", "torch/__init__.py"]
        # pyflakes' codes (F811 redefinition, F401, F821 ...) and syntax errors; the fixtures
        # carry no style configuration of their own
        before = lint_findings(cmd, self.tree, files, select="F,E9")
        self.patch_ok()
        after = lint_findings(cmd, self.tree, files, select="F,E9")
        self.assertEqual(dict(after - before), {}, f"{name} findings the patch brings")


class TestPatch196856(FixtureTree):
    """A tree with PR #196856 (tests/fixtures/upstream_196856/README.md): its deterministic
    branch, cuDNN delegation and six tests are there already. Replacing that branch is an
    explicit choice, so the runs below pass the flag that makes it."""

    fixture = FIXTURE_196856
    flags = ("--replace-existing-deterministic-path",)

    def test_plain_run_refuses_an_existing_deterministic_path(self):
        stderr = self.assert_refused("has a deterministic path already", "grid_sampler_2d_backward_det()",
                                     "--replace-existing-deterministic-path", flags=())
        self.assertIn("nothing was changed", stderr)

    def test_check_without_the_flag_refuses_too(self):
        before = snapshot(self.tree)
        rc, _, stderr = run_patch("--pytorch", self.tree, "--check")
        self.assertEqual(rc, P.EXIT_ANCHOR, stderr)
        self.assertIn("--replace-existing-deterministic-path", stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        assert_untouched(self, self.tree, before)

    def test_applies_and_replaces_the_existing_branch(self):
        stdout = self.patch_ok()
        self.assertIn("base: v2.11.0", stdout)
        self.assertIn("replaced an existing deterministic branch", stdout)
        cu = (self.tree / P.CU).read_text()
        self.assertNotIn("grid_sampler_2d_backward_det(", cu)
        self.assertNotIn("grid_sampler_3d_backward_det(", cu)
        self.assertEqual(cu.count("deterministicAlgorithms()"), 2)
        assert_one_decision_per_call(self, self.tree, FIXTURE_196856)
        # 2D: renamed parameters, upstream's early return removed with its comment
        ctx = "at::globalContext()"
        self.assertIn("  check_grid_sampler_2d(self, coords);\n\n"
                      + det_branch(("grad_in, gout, self, coords, interpolation_mode, padding_mode,",
                                    "align_corners);"), "grid_sampler_2d_backward_cuda", "mask", ctx)
                      + "  if (gout.numel() > 0) { /* the atomicAdd kernel */ }\n}", cu)
        # 3D: upstream's if/else collapsed into our branch + its else body
        self.assertIn("  check_grid_sampler_3d(volume, coords, interp);\n\n"
                      + det_branch(("grad_volume, gout, volume, coords, interp, padding, corners);",),
                                   "grid_sampler_3d_backward_cuda", "mask", ctx)
                      + "  if (gout.numel() > 0) { /* the atomicAdd kernel */ }\n}", cu)
        self.assertNotIn("Deterministic path (sort by destination)", cu)
        # the replaced branches' header is no longer included; GridSampler.h declares ours
        self.assertNotIn("GridSamplerDet.h", cu)
        self.assertEqual(include_lines(cu), ["#include <ATen/native/cuda/GridSampler.h>",
                                             "#include <ATen/native/GridSamplerUtils.h>"])
        self.assertIn(P.det_declaration(), (self.tree / P.CU_HEADER).read_text())
        self.assert_noop()

    def test_upstream_pieces_already_there_are_kept(self):
        stdout = self.patch_ok()
        changed = git(self.tree, "diff", "--name-only", "HEAD~1", "HEAD").split()
        # #196856's cuDNN delegation (a deterministic path: nothing to alert about), docstring,
        # launcher alert tests and notes stay as written
        for rel in (P.CUDNN, CUDA_CPP, P.INIT, P.NOTES[1]):
            self.assertNotIn(rel, changed)
            self.assertEqual((self.tree / rel).read_bytes(), (FIXTURE_196856 / rel).read_bytes())
        self.assertIn("the cuDNN backward has a deterministic path of its own", stdout)
        for name, _ in P.ALERT_TESTS:
            self.assertIn(f"{name} already expects no alert", stdout)
        # the composite leaves cuDNN in deterministic mode all the same; the cuDNN alert test
        # (expecting no alert here, as #196856 wrote it) reaches cuDNN by a direct call
        self.assertIn(P.COMPOSITE, changed)
        tt = (self.tree / P.TEST_TORCH).read_text()
        start, end = P._method(tt, P.CUDNN_ALERT_TEST)
        self.assertIn("res = torch.cudnn_grid_sampler(input, grid)\n", tt[start:end])
        self.assertIn("'cudnn_grid_sampler_backward',\n            False)", tt[start:end])
        self.assertEqual(tt.count(P.CUDNN_TESTS_SOURCE[P.CUDNN_ROUTE_TEST]), 1)

    def test_only_tests_upstream_lacks_are_added(self):
        stdout = self.patch_ok()
        nn = (self.tree / P.TEST_NN).read_text()
        upstream = ("test_grid_sample_dispatch", "test_grid_sample_gradcheck",
                    "test_grid_sample_expanded_streams_and_graph", "test_grid_sample_long_segments",
                    "test_grid_sample_chunk_boundary", "test_grid_sample_backward_output_mask")
        original = (FIXTURE_196856 / P.TEST_NN).read_text()
        for name in upstream:  # kept, byte for byte
            self.assertEqual(nn.count(f"def {name}("), 1)
            body = P._all_test_sources(original)[name]
            self.assertIn(body, nn)
        added = P._added_tests(P.Plan(P.Base("", None, ""),
                                      {P.TEST_NN: original.encode()}, {P.TEST_NN: nn.encode()}), P.TEST_NN)
        # upstream's expanded-inputs and gradgradcheck tests cover those two of ours
        self.assertEqual(added, ["test_grid_sample_2d_backward_deterministic",
                                 "test_grid_sample_3d_backward_deterministic",
                                 "test_grid_sample_backward_deterministic_grid_only",
                                 "test_grid_sample_backward_deterministic_sparse_reduction",
                                 "test_grid_sample_backward_deterministic_several_chunks",
                                 "test_grid_sample_backward_deterministic_many_channels",
                                 "test_grid_sample_backward_deterministic_large_index",
                                 "test_grid_sample_backward_deterministic_side_stream_and_graph",
                                 "test_grid_sample_backward_deterministic_dispatch",
                                 "test_grid_sample_backward_deterministic_input_only",
                                 "test_grid_sample_backward_deterministic_non_finite_grid",
                                 "test_grid_sample_backward_deterministic_5d_bicubic",
                                 "test_grid_sample_backward_deterministic_hot_run_across_chunks"])
        self.assertIn("not adding test_grid_sample_backward_deterministic_gradcheck", stdout)
        self.assertIn("not adding test_grid_sample_backward_deterministic_gradgradcheck", stdout)
        self.assertIn("not adding test_grid_sample_backward_deterministic_expanded_and_strided", stdout)
        self.assertIn("not adding test_grid_sample_2d_backward_deterministic_cudnn", stdout)
        self.assertIn("upstream's test_grid_sample_dispatch checks it", stdout)
        # placed after upstream's deterministic tests, inside TestNNDeviceType
        self.assertLess(nn.index("def test_grid_sample_backward_output_mask("),
                        nn.index("def test_grid_sample_2d_backward_deterministic("))
        self.assertLess(nn.index("def test_grid_sample_backward_deterministic_grid_only("),
                        nn.index("def test_grid_sample_large("))
        # main imports DeterministicGuard inside a multi-line import: no second import
        self.assertEqual(P._module_imports(P.TEST_NN, nn)["DeterministicGuard"], 1)
        self.assertNotIn("import DeterministicGuard\n", nn)
        compile(nn, P.TEST_NN, "exec")
        message = git(self.tree, "log", "-1", "--format=%B")
        self.assertIn("test_grid_sample_dispatch", message)  # upstream's kept tests are in the plan
        self.assertNotIn(P.CUDNN_ALERT_TEXT.split(",")[0] + ",", message)  # no cuDNN backward edit here
        self.assertNotIn("Docs:", message)
        self.assert_noop()

    def test_upstream_test_naming_another_kernel_is_reported(self):
        stdout = self.patch_ok()
        self.assertIn("test_grid_sample_dispatch expects a CUDA kernel named 'make_records'", stdout)

    def test_no_new_flake8_findings(self):
        self.assert_no_new_lint("flake8")

    def test_no_new_ruff_findings(self):
        self.assert_no_new_lint("ruff")

    def test_unknown_signature_is_refused(self):
        self.edit(P.CU, "    std::array<bool, 2> mask) {", "    std::array<bool, 2> mask,\n    int64_t extra) {")
        self.assert_refused("parameters", P.LAUNCHERS[2])

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
        git(self.tree, "commit", "-qam", "drop header")
        stdout = self.patch_ok()
        self.assertIn("#include <ATen/native/cuda/GridSamplerDet.h>\n", (self.tree / P.CU).read_text())
        self.assertNotIn("removed #include", stdout)

    def kit_with_core(self, edit):
        """A kit whose core .cu is the kit's with ``edit`` applied to its text."""
        kit = self.tmp / "kit"
        shutil.copytree(KERNELS, kit / "aten_kernels" / P.KERNEL_DIR)
        source = kit / "aten_kernels" / P.CORE_SOURCE
        source.write_text(edit(source.read_text()))
        return {"DETGRID_KIT_ROOT": str(kit)}

    def test_kit_without_its_launcher_is_refused(self):
        def drop(text):
            start = text.index(f"void {P.DET_LAUNCHER}(")
            body = text.index("{", start)
            return text[:start] + text[P._match(text, body, "{", "}") + 1 :]

        self.assert_refused(P.DET_LAUNCHER, "the kit does not define its launcher",
                            env=self.kit_with_core(drop))

    def test_kit_launcher_with_another_signature_is_refused(self):
        # the header's declaration and the dispatch's call would not match it
        self.assert_refused(P.DET_LAUNCHER, "with parameters", "int64_t padding_mode, int align_corners",
                            env=self.kit_with_core(lambda t: t.replace(
                                "    int64_t padding_mode,\n    bool align_corners) {",
                                "    int64_t padding_mode,\n    int align_corners) {")))

    def test_notes_page_gets_a_section(self):
        # a page that does not mention grid_sample yet; a "# comment" in a code block after the
        # anchor section is no heading
        self.edit(P.NOTES[1], self._grid_section(), "")
        stdout = self.patch_ok()
        text = (self.tree / P.NOTES[1]).read_text()
        self.assertIn("### CUDA grid sampling\n\nThe CUDA backward of {func}`torch.nn.functional.grid_sample`",
                      text)
        self.assertIn("default mode's.\n\n### CUDA Scaled Dot Product Attention\n", text)
        self.assertNotIn("mentions grid_sample", stdout)
        self.assert_noop()

    def _grid_section(self):
        text = (self.fixture / P.NOTES[1]).read_text()
        return text[text.index("### CUDA grid sampling") : text.index("### CUDA Scaled")]

    def test_notes_page_without_a_place_is_only_noted(self):
        md = self.tree / P.NOTES[1]
        md.write_text("# Reproducibility\n\nNothing per operation here.\n")
        git(self.tree, "commit", "-qam", "short page")
        stdout = self.patch_ok()
        self.assertIn("no 'CUDA convolution determinism' section", stdout)
        self.assertEqual(md.read_text(), "# Reproducibility\n\nNothing per operation here.\n")

    def test_older_partial_tests_are_completed(self):
        # one kit test already there (an older detgrid patch): the others are added, it is not
        self.edit(P.TEST_NN, "    @onlyCUDA\n    @tf32_on_and_off(0.005)\n    def test_grid_sample_large",
                  "    def test_grid_sample_backward_deterministic_grid_only(self, device):\n        pass\n\n"
                  "    @onlyCUDA\n    @tf32_on_and_off(0.005)\n    def test_grid_sample_large")
        self.patch_ok()
        nn = (self.tree / P.TEST_NN).read_text()
        self.assertEqual(nn.count("def test_grid_sample_backward_deterministic_grid_only("), 1)
        self.assertEqual(nn.count("def test_grid_sample_2d_backward_deterministic("), 1)
        self.assert_noop()

    def test_docstring_listing_both_ways_is_refused(self):
        self.edit(P.INIT, "        * :class:`torch.nn.AvgPool3d` when",
                  "        * :func:`torch.nn.functional.grid_sample` when attempting to "
                  "differentiate a CUDA tensor\n        * :class:`torch.nn.AvgPool3d` when")
        self.assert_refused("listed as both deterministic and throwing")


class TestPatchMain(FixtureTree):
    """Main as known (tests/fixtures/upstream_main/README.md): #180417 (the cuDNN backward
    alerts) and #177487 (grid_sampler_2d's double backward), not #196856."""

    def test_launchers_dispatch_on_grad_input_and_alert_no_more(self):
        self.patch_ok()
        cu = (self.tree / P.CU).read_text()
        for dims in P.DIMS:
            body = func_body(cu, r"\bvoid", P.LAUNCHERS[dims])
            self.assertEqual(body.count(det_branch(DEFAULT_ARGS, f"grid_sampler_{dims}d_backward_cuda")), 1)
            self.assertEqual(body.count("alertNotDeterministic"), 1)
            # the comments say what the code does, nothing about where it came from
            comments = " ".join(re.findall(r"//([^\n]*)", body)).lower()
            for word in ("detgrid", "kit", "extension", "knob", "#"):
                self.assertNotIn(word, comments)

    def test_grad_input_stays_zero_filled_and_the_flag_is_read_once(self):
        self.patch_ok()
        assert_one_decision_per_call(self, self.tree, self.fixture)
        self.assert_noop()

    def test_upto_core_is_the_core_alone(self):
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--upto", "core", "--out", self.tmp / "core.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(changed_paths(self.tree), CORE_PATHS)
        self.assertEqual(subject(self.tree), stack.UPSTREAM_STACK[0].title)
        # the cuDNN route: composite, cuDNN backward, docs and its tests are untouched
        for rel in (P.COMPOSITE, P.CUDNN, P.INIT, P.NOTES[1]):
            self.assertEqual((self.tree / rel).read_bytes(), (self.fixture / rel).read_bytes(), rel)
        tt, original = ((t / P.TEST_TORCH).read_text() for t in (self.tree, self.fixture))
        start, end = P._method(tt, P.CUDNN_ALERT_TEST)
        self.assertIn(tt[start:end], original)
        self.assertIsNone(P._method(tt, P.CUDNN_ROUTE_TEST))
        nn = (self.tree / P.TEST_NN).read_text()
        for name in P.upstream_nn_tests().names:
            self.assertEqual(nn.count(f"def {name}("), 0 if name in P.CUDNN_NN_TESTS else 1, name)
        message = " ".join(git(self.tree, "log", "-1", "--format=%B").split())
        self.assertNotIn("cuDNN", message)
        for word in ("stock", "level", "2.6", "2.12"):
            self.assertNotIn(word, message)
        # a second run at core changes nothing
        before = snapshot(self.tree)
        rc, stdout, _ = run_patch("--pytorch", self.tree, "--upto", "core", "--out", self.tmp / "again.patch")
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)
        assert_untouched(self, self.tree, before)

    def test_upto_core_then_cudnn_then_the_default_is_the_whole_change(self):
        # each run on a tree with the earlier patches committed finds their edits present and
        # adds its own patch alone; the tree is then the one the whole change in one go gives
        whole = git_copy(self.fixture, self.tmp / "whole")
        rc, _, stderr = run_patch("--pytorch", whole, "--out", self.tmp / "whole.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(subject(whole), stack.UPSTREAM_STACK[0].title)
        self.assertEqual((whole / P.CORE_SOURCE).read_text(),
                         stack.core_sources(KIT_ROOT, P.TOP)[P.CORE_SOURCE])
        self.patch_ok("--upto", "core")
        stdout = self.patch_ok("--upto", "cudnn")
        for dims in P.DIMS:
            self.assertIn(f"{dims}D deterministic dispatch already present", stdout)
        self.assertIn(f"{P.DET_LAUNCHER} already declared", stdout)
        self.assertEqual(changed_paths(self.tree), CUDNN_PATHS_MAIN)
        self.assertEqual(subject(self.tree), stack.UPSTREAM_STACK[1].title)
        nn = git(self.tree, "diff", "HEAD~1", "HEAD", "--", P.TEST_NN)
        self.assertEqual(re.findall(r"^\+    def (test_\w+)\(", nn, re.M), list(P.CUDNN_NN_TESTS))
        message = " ".join(git(self.tree, "log", "-1", "--format=%B").split())
        self.assertIn("no longer picks cuDNN", message)
        self.assertNotIn("unique_by_key", message)  # the core's text is the core's commit's
        self.assertNotIn("kChannelGroup", message)  # the speed level's is its own commit's
        # the default: the speed levels alone, each only the core's file
        stdout = self.patch_ok()
        self.assertNotIn("exists and differs", stdout)
        self.assertEqual(changed_paths(self.tree), [P.CORE_SOURCE])
        self.assertEqual(subject(self.tree), stack.UPSTREAM_STACK[2].title)
        message = " ".join(git(self.tree, "log", "-1", "--format=%B").split())
        self.assertIn("See #68959", message)
        self.assertIn("kChannelGroup = 4", message)
        for word in ("unique_by_key", "cuDNN", "Fixes", "Tests:", "level", "stock"):
            self.assertNotIn(word, message)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD^{tree}").strip(),
                         git(whole, "rev-parse", "HEAD^{tree}").strip())
        self.assert_noop()

    def test_upto_a_speed_level_writes_its_file_and_cudnn_the_cores(self):
        core = stack.core_sources(KIT_ROOT, "core")[P.CORE_SOURCE]
        level = stack.core_sources(KIT_ROOT, "grouped-channels")[P.CORE_SOURCE]
        self.assertNotEqual(core, level)
        self.assertIn("kChannelGroup", level)
        self.assertNotIn("kChannelGroup", core)
        self.assertEqual(stack.core_sources(KIT_ROOT, "cudnn")[P.CORE_SOURCE], core)
        cudnn = git_copy(self.fixture, self.tmp / "cudnn")
        rc, _, stderr = run_patch("--pytorch", cudnn, "--upto", "cudnn", "--out", self.tmp / "c.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertEqual((cudnn / P.CORE_SOURCE).read_text(), core)
        self.assertEqual(subject(cudnn), stack.UPSTREAM_STACK[0].title)
        self.patch_ok("--upto", "grouped-channels")
        self.assertEqual((self.tree / P.CORE_SOURCE).read_text(), level)
        # the speed level changes nothing but that file: the trees differ there alone
        level_tree, cudnn_tree = snapshot(self.tree), snapshot(cudnn)
        self.assertEqual(sorted(k for k in set(level_tree) | set(cudnn_tree)
                                if level_tree.get(k) != cudnn_tree.get(k)), [P.CORE_SOURCE])
        message = " ".join(git(self.tree, "log", "-1", "--format=%B").split())
        self.assertIn("unique_by_key", message)  # one commit: the core's text leads
        self.assertIn("kChannelGroup = 4", message)
        # the patch file holds the level's file
        text = (self.tmp / "m.patch").read_text()
        self.assertIn("+constexpr int kChannelGroup = 4;", text)
        # --upto adds patches and never takes one out: --upto cudnn on the whole stack finds
        # the core's file as the later speed level has it, and leaves it so
        before, head = snapshot(self.tree), git(self.tree, "rev-parse", "HEAD")
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--upto", "cudnn",
                                       "--out", self.tmp / "back.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertIn(f"{P.CORE_SOURCE}: already as the stack up to grouped-channels has it; "
                      "left as it is", stdout)
        self.assertIn("already applied", stdout)
        assert_untouched(self, self.tree, before)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD"), head)
        self.assertFalse((self.tmp / "back.patch").exists())

    def test_upto_names_a_patch_of_the_stack(self):
        for name in ("fast", "index32", "channel-groups"):
            rc, _, stderr = run_patch("--pytorch", self.tree, "--upto", name)
            self.assertEqual(rc, 2)
            self.assertIn(f"invalid choice: '{name}'", stderr)
            self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)

    def test_191915_checks_stay_ahead_of_the_dispatch(self):
        # the fixture is main with #191915: one backward check per launcher, declared in its
        # GridSamplerUtils.h, in place of check_grid_sampler_common + _2d/_3d
        header = (self.tree / "aten/src/ATen/native/GridSamplerUtils.h").read_text()
        pristine = (self.tree / P.CU).read_text()
        for dims, check in CHECKS_191915.items():
            self.assertIn(f"inline void check_grid_sampler_{dims}d_backward(", header)
            body = func_body(pristine, r"\bvoid", P.LAUNCHERS[dims])
            self.assertEqual(body.count(check), 1)
            self.assertNotIn("check_grid_sampler_common(", body)
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--check")
        self.assertEqual(rc, 0, stderr)
        self.assertIn(f"applies: {len(CORE_PATHS + CUDNN_PATHS_MAIN) - 2} files", stdout)
        self.patch_ok()
        cu = (self.tree / P.CU).read_text()
        for dims, check in CHECKS_191915.items():
            body, before = (func_body(t, r"\bvoid", P.LAUNCHERS[dims]) for t in (cu, pristine))
            branch = body.index("if (output_mask[0] && globalContext().deterministicAlgorithms()) {")
            # the check runs, unchanged, before the deterministic path can return
            self.assertEqual(body.count(check), 1)
            self.assertLess(body.index(check), branch)
            self.assertEqual(body[: body.index(check)], before[: before.index(check)])
        # the header the checks come from keeps its bytes and its include
        changed = git(self.tree, "diff", "--name-only", "HEAD~1", "HEAD").split()
        self.assertNotIn("aten/src/ATen/native/GridSamplerUtils.h", changed)
        self.assertIn("#include <ATen/native/GridSamplerUtils.h>", cu)
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--check")
        self.assertEqual(rc, 0, stderr)
        self.assertIn("already applied", stdout)
        self.assert_noop()

    def test_check_after_the_alert_is_refused(self):
        # the deterministic branch returns where the alert was: a check below it would be skipped
        check = CHECKS_191915[3]
        alert = 'globalContext().alertNotDeterministic("grid_sampler_3d_backward_cuda");\n'
        self.edit(P.CU, f"  {check}", "")
        self.edit(P.CU, f"  {alert}", f"  {alert}  {check}")
        self.assert_refused(P.CU, "check_grid_sampler_3d_backward(...) in launch_grid_sampler_3d_backward_kernel",
                            "runs after the nondeterministic alert", "that path would skip the check")

    def test_grad_input_allocation_of_any_shape_is_left_as_it_is(self):
        # the patch reads nothing in cuda/GridSampler.cpp: a shape no edit of it could anchor
        # on (a conditional allocation) applies, and the file keeps its bytes
        self.edit(CUDA_CPP, "  Tensor grad_input;\n  if (output_mask[0]) {\n"
                  "    grad_input = at::zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT);\n  }\n",
                  "  Tensor grad_input = output_mask[0]\n"
                  "      ? at::zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT)\n      : Tensor();\n")
        before = (self.tree / CUDA_CPP).read_bytes()
        self.patch_ok()
        self.assertEqual((self.tree / CUDA_CPP).read_bytes(), before)
        self.assertNotIn(CUDA_CPP, git(self.tree, "diff", "--name-only", "HEAD~1", "HEAD").split())
        self.assert_noop()

    def test_gradgradcheck_is_added_where_a_double_backward_exists(self):
        stdout = self.patch_ok()
        nn = (self.tree / P.TEST_NN).read_text()
        self.assertEqual(nn.count("def test_grid_sample_backward_deterministic_gradgradcheck("), 1)
        self.assertNotIn("skipTest", nn)  # decided here, not when the test runs
        self.assertNotIn("no derivative of grid_sampler_2d_backward", stdout)

    def test_gradgradcheck_runs_the_second_order_through_the_deterministic_path(self):
        # #177487's derivative is there: the added gradgradcheck differentiates the backward on
        # CUDA in deterministic mode, with grad_input requested (output_mask[0], the deterministic
        # branch) and without warn_only, so a launcher still on the atomicAdd kernel raises its
        # alert and the test fails
        self.patch_ok()
        nn = (self.tree / P.TEST_NN).read_text()
        name = "test_grid_sample_backward_deterministic_gradgradcheck"
        cls = nn.index("class TestNNDeviceType(")
        [(start, end)] = [(s, e) for n, s, e in P._test_methods(nn, cls, len(nn)) if n == name]
        method = ast.parse(textwrap.dedent(nn[start:end])).body[0]
        self.assertEqual([ast.unparse(d) for d in method.decorator_list], ["onlyCUDA"])
        self.assertEqual([a.arg for a in method.args.args], ["self", "device"])
        guarded = [w for w in ast.walk(method) if isinstance(w, ast.With)
                   and ast.unparse(w.items[0].context_expr) == "DeterministicGuard(True)"]
        self.assertEqual(len(guarded), 1)
        calls = [c for stmt in guarded[0].body for c in ast.walk(stmt)
                 if isinstance(c, ast.Call) and ast.unparse(c.func) == "torch.autograd.gradgradcheck"]
        self.assertEqual([ast.unparse(c.args[1]) for c in calls], ["(input, grid)"])
        self.assertEqual([ast.unparse(k) for k in calls[0].keywords], ["nondet_tol=0"])
        source = ast.unparse(method)
        self.assertNotIn("warn_only", source)
        self.assertIn("torch.randn(1, 2, 4, 4, device=device, dtype=torch.double, requires_grad=True)", source)
        self.assertIn("grid.requires_grad_()", source)
        # align_corners=False: never cuDNN's route (it needs True), the launcher's branch itself
        self.assertIn("F.grid_sample(input, grid, padding_mode=padding_mode, align_corners=False)", source)

    def test_gradgradcheck_is_left_out_without_a_double_backward(self):
        text = (self.tree / P.DERIVATIVES).read_text()
        start = text.index("# #177487")
        self.edit(P.DERIVATIVES, text[start : text.index("- name: grid_sampler_3d(")], "")
        stdout = self.patch_ok()
        nn = (self.tree / P.TEST_NN).read_text()
        self.assertNotIn("gradgradcheck", nn)
        self.assertIn("not adding test_grid_sample_backward_deterministic_gradgradcheck: "
                      "tools/autograd/derivatives.yaml has no derivative of grid_sampler_2d_backward", stdout)
        self.assertEqual(nn.count("def test_grid_sample_backward_deterministic_gradcheck("), 1)

    def test_not_implemented_double_backward_counts_as_none(self):
        self.edit(P.DERIVATIVES, "  grad_output, input, grid: grid_sampler_2d_second_order(",
                  "  grad_output, input, grid: not_implemented(\"grid_sampler_2d_backward\") # (")
        self.patch_ok()
        self.assertNotIn("gradgradcheck", (self.tree / P.TEST_NN).read_text())

    def test_checkout_without_derivatives_yaml_is_refused(self):
        (self.tree / P.DERIVATIVES).unlink()
        git(self.tree, "commit", "-qam", "no derivatives")
        self.base = git(self.tree, "rev-parse", "HEAD").strip()
        self.assert_refused(P.DERIVATIVES, "file missing")

    def test_cudnn_alert_is_kept_and_the_composite_leaves_cudnn(self):
        stdout = self.patch_ok()
        self.assertIn("the cuDNN backward alerts in deterministic mode already (#180417)", stdout)
        self.assertEqual((self.tree / P.CUDNN).read_bytes(), (self.fixture / P.CUDNN).read_bytes())
        text = (self.tree / P.COMPOSITE).read_text()
        self.assertTrue(composite_condition(text).endswith(
            "      align_corners &&\n      !at::globalContext().deterministicAlgorithms()"))
        self.assertEqual(text.count("deterministicAlgorithms()"), 1)
        self.assertIn(f"  {P.COMPOSITE_WHY}\n  if (cond_cudnn_grid_sampler(input, grid) &&\n", text)
        self.assertEqual(text.count("#include <ATen/Context.h>"), 1)
        self.assertLess(text.index("#include <ATen/core/Tensor.h>"), text.index("#include <ATen/Context.h>"))
        self.assert_noop()

    def test_cudnn_backward_without_an_alert_gets_one_after_its_checks(self):
        # the shape v2.6.0 has: no #180417
        alert = ('  // See Note [Writing Nondeterministic Operations]\n'
                 "  // cuDNN's spatial transformer backward accumulates with atomics.\n"
                 '  globalContext().alertNotDeterministic("cudnn_grid_sampler_backward");\n')
        self.edit(P.CUDNN, alert, "")
        self.patch_ok()
        cpp = (self.tree / P.CUDNN).read_text()
        self.assertIn('      "Invalid arguments to cudnn_grid_sampler_backward");\n'
                      "  // See Note [Writing Nondeterministic Operations]\n"
                      "  // Nondeterministic: cuDNN's sampler backward sums in no fixed order.\n"
                      '  globalContext().alertNotDeterministic("cudnn_grid_sampler_backward");\n'
                      "  auto grad_input_t", cpp)
        self.assertIn(P.CUDNN_ALERT_TEXT.split(",")[0], " ".join(git(self.tree, "log", "-1", "--format=%B").split()))
        self.assert_noop()

    def test_cudnn_backward_without_checks_or_alert_is_refused(self):
        self.edit(P.CUDNN, "  check_grid_sampler_common(input_t, grid_t);\n  TORCH_CHECK(\n"
                  "      cond_cudnn_grid_sampler(input_t, grid_t),\n"
                  "      \"Invalid arguments to cudnn_grid_sampler_backward\");\n"
                  "  // See Note [Writing Nondeterministic Operations]\n"
                  "  // cuDNN's spatial transformer backward accumulates with atomics.\n"
                  "  globalContext().alertNotDeterministic(\"cudnn_grid_sampler_backward\");\n", "")
        self.assert_refused(P.CUDNN, "after upstream's argument checks")
        # the core alone does not read the cuDNN backward
        self.patch_ok("--upto", "core")

    def test_composite_without_its_cudnn_branch_is_refused(self):
        self.edit(P.COMPOSITE, "  if (cond_cudnn_grid_sampler(input, grid) &&\n", "  if (true &&\n")
        self.assert_refused(P.COMPOSITE, "return cudnn_grid_sampler", "not found in grid_sampler")

    def test_header_without_the_backward_declarations_is_refused(self):
        header = (self.tree / P.CU_HEADER).read_text()
        start = header.index(f"void {P.LAUNCHERS[3]}(")
        self.edit(P.CU_HEADER, header[start : header.index(";", start) + 2], "")
        self.assert_refused(P.CU_HEADER, P.LAUNCHERS[3], "not declared once")

    def test_launcher_file_without_the_header_include_is_refused(self):
        self.edit(P.CU, "#include <ATen/native/cuda/GridSampler.h>\n", "")
        self.assert_refused(P.CU, "#include <ATen/native/cuda/GridSampler.h>", P.DET_LAUNCHER)

    def test_alert_tests(self):
        self.patch_ok()
        tt = (self.tree / P.TEST_TORCH).read_text()
        for name, caller in P.ALERT_TESTS:
            start, end = P._method(tt, name)
            self.assertRegex(tt[start:end], rf"'{caller}',\n            False\)", name)
        # the cuDNN alert test keeps expecting its alert, now reaching cuDNN by a direct call
        start, end = P._method(tt, P.CUDNN_ALERT_TEST)
        self.assertIn("'cudnn_grid_sampler_backward',\n            True)", tt[start:end])
        self.assertIn(f"                {P.DIRECT_CUDNN_COMMENT}\n"
                      "                res = torch.cudnn_grid_sampler(input, grid)\n", tt[start:end])
        self.assertNotIn("grid_sample(", tt[start:end])
        # and grid_sample on a cuDNN-eligible input must not alert
        self.assertEqual(tt.count(P.CUDNN_TESTS_SOURCE[P.CUDNN_ROUTE_TEST]), 1)
        self.assertEqual(P._method_end(tt, P.CUDNN_ALERT_TEST), tt.index(P.CUDNN_TESTS_SOURCE[P.CUDNN_ROUTE_TEST]))
        compile(tt, P.TEST_TORCH, "exec")
        message = git(self.tree, "log", "-1", "--format=%B")
        for name, _ in P.ALERT_TESTS:
            self.assertIn(f"{name} expects no alert", message)
        self.assertIn(f"{P.CUDNN_ALERT_TEST} calls torch.cudnn_grid_sampler directly", message)
        self.assertIn(f"adds {P.CUDNN_ROUTE_TEST}", message)

    def test_cudnn_alert_test_of_another_shape_is_refused(self):
        self.edit(P.TEST_TORCH, "res = torch.nn.functional.grid_sample(input, grid, align_corners=True)",
                  "res = run(input, grid)")
        self.assert_refused(P.TEST_TORCH, P.CUDNN_ALERT_TEST, "0 such calls found")

    def test_every_kit_test_is_added_with_one_import(self):
        self.patch_ok()
        nn = (self.tree / P.TEST_NN).read_text()
        for name in P.upstream_nn_tests().names:
            self.assertEqual(nn.count(f"def {name}("), 1)
        self.assertEqual(P._module_imports(P.TEST_NN, nn)["DeterministicGuard"], 1)
        self.assert_noop()

    def test_no_new_flake8_findings(self):
        self.assert_no_new_lint("flake8")

    def test_no_new_ruff_findings(self):
        self.assert_no_new_lint("ruff")

    def test_check_builds_the_change_without_writing(self):
        before = snapshot(self.tree)
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--check")
        self.assertEqual(rc, 0, stderr)
        # the core's file, GridSampler.cu and .h, the composite GridSampler.cpp, the notes page,
        # test_nn.py, test_torch.py and torch/__init__.py (the cuDNN backward alerts already)
        self.assertIn(f"applies: {len(CORE_PATHS + CUDNN_PATHS_MAIN) - 2} files", stdout)
        assert_untouched(self, self.tree, before)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD").strip(), self.base)
        self.assertEqual(leftovers(self.tree), [])

    def test_check_reports_an_anchor_it_cannot_find(self):
        self.edit(P.COMPOSITE, "    return cudnn_grid_sampler(input, grid);\n", "    return Tensor();\n")
        rc, _, stderr = run_patch("--pytorch", self.tree, "--check")
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn("not found in grid_sampler", stderr)


class TestTestsOnly(FixtureTree):
    """`detgrid patch --tests-only`: the tests as a patch of their own, for any deterministic
    backward to be run against; no kernel, no dispatch."""

    TESTS = sorted((P.TEST_NN, P.TEST_TORCH))

    def test_writes_only_the_tests_as_a_commit_and_patch_of_their_own(self):
        out = self.tmp / "tests.patch"
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--tests-only", "--out", out)
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(sorted(git(self.tree, "diff", "--name-only", "HEAD~1", "HEAD").split()), self.TESTS)
        text = out.read_text()
        self.assertEqual(sorted(re.findall(r"^diff --git a/(\S+)", text, re.M)), self.TESTS)
        self.assertIn(f"Subject: [PATCH] {P.TESTS_ONLY_SUBJECT}\n", text)
        self.assertNotIn("Fixes #68959", text)
        self.assertFalse((self.tree / P.CORE_SOURCE).exists())
        nn = (self.tree / P.TEST_NN).read_text()
        for name in P.upstream_nn_tests().names:  # main as known: the gradgradcheck too
            self.assertEqual(nn.count(f"def {name}("), 1, name)
        tt = (self.tree / P.TEST_TORCH).read_text()
        self.assertEqual(len(re.findall(r"'grid_sampler_\dd_backward_cuda',\n\s+False\)", tt)), 2)
        self.assertIn("res = torch.cudnn_grid_sampler(input, grid)\n", tt)
        self.assertIsNotNone(P._method(tt, P.CUDNN_ROUTE_TEST))
        # a second run has nothing left to do
        before = snapshot(self.tree)
        rc, stdout, _ = run_patch("--pytorch", self.tree, "--tests-only", "--out", self.tmp / "again.patch")
        self.assertEqual(rc, 0)
        self.assertIn("already applied", stdout)
        assert_untouched(self, self.tree, before)

    def test_check_plans_only_the_tests(self):
        rc, stdout, stderr = run_patch("--pytorch", self.tree, "--tests-only", "--check")
        self.assertEqual(rc, 0, stderr)
        self.assertIn(f"applies: 2 files ({', '.join(self.TESTS)})", stdout)

    def test_upto_core_writes_the_cores_tests_alone(self):
        rc, _, stderr = run_patch("--pytorch", self.tree, "--tests-only", "--upto", "core",
                                  "--out", self.tmp / "core-tests.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(changed_paths(self.tree), self.TESTS)
        tt, original = ((t / P.TEST_TORCH).read_text() for t in (self.tree, self.fixture))
        start, end = P._method(tt, P.CUDNN_ALERT_TEST)
        self.assertIn(tt[start:end], original)
        self.assertNotIn(f"def {P.CUDNN_NN_TESTS[0]}(", (self.tree / P.TEST_NN).read_text())

    def test_runs_on_a_tree_with_another_deterministic_backward(self):
        # #196856's tree: its path stays, the tests it lacks are added; its cuDNN alert test
        # reaches cuDNN by a direct call
        tree = git_copy(FIXTURE_196856, self.tmp / "pr")
        rc, stdout, stderr = run_patch("--pytorch", tree, "--tests-only", "--out", self.tmp / "pr.patch")
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(changed_paths(tree), self.TESTS)
        self.assertIn("grid_sampler_2d_backward_det(", (tree / P.CU).read_text())
        self.assertNotIn("make_records", stdout)  # no kernel of ours to compare names with

    def test_replacing_a_path_with_tests_only_is_refused_in_one_line(self):
        stderr = self.assert_refused("--tests-only", "--replace-existing-deterministic-path",
                                     rc=P.EXIT_USAGE,
                                     flags=("--tests-only", "--replace-existing-deterministic-path"))
        self.assertNotIn("Traceback", stderr)

    def test_unknown_argument_is_one_line(self):
        rc, _, stderr = run_patch("--pytorch", self.tree, "--tests-onyl")
        self.assertEqual(rc, 2)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("--tests-onyl", stderr)


def without_identity(home: Path) -> Dict[str, str]:
    """An environment with no git identity at all: an empty HOME, no global or system config,
    no GIT_AUTHOR_*/GIT_COMMITTER_*."""
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY}
    env.update(HOME=str(home), GIT_CONFIG_GLOBAL=str(home / "none"), GIT_CONFIG_NOSYSTEM="1",
               PYTHONPATH=str(KIT / "tools"))
    return env


class TestCommonUtilsImport(TestCase):
    """A name the added tests need from common_utils joins the checkout's import of it."""

    def joined(self, text):
        return P._join_common_utils_import(P.TEST_NN, text, ["DeterministicGuard", "X"])

    def test_a_backslash_continued_import_gains_the_names_on_its_last_line(self):
        text = ("import os\nfrom torch.testing._internal.common_utils import a, \\\n"
                "    b\nimport sys\n")
        self.assertEqual(self.joined(text),
                         "import os\nfrom torch.testing._internal.common_utils import a, \\\n"
                         "    b, DeterministicGuard, X\nimport sys\n")

    def test_a_parenthesised_list_of_one_name_a_line_gains_a_line_each(self):
        text = "from torch.testing._internal.common_utils import (\n    a,\n    b,\n)\n"
        self.assertEqual(self.joined(text), "from torch.testing._internal.common_utils import (\n"
                         "    a,\n    b,\n    DeterministicGuard,\n    X,\n)\n")

    def test_a_parenthesised_list_on_one_line_stays_on_it(self):
        for text in ("from torch.testing._internal.common_utils import (a, b)\n",
                     "from torch.testing._internal.common_utils import (a, b,)\n"):
            self.assertEqual(self.joined(text), "from torch.testing._internal.common_utils "
                             "import (a, b, DeterministicGuard, X)\n")
            compile(self.joined(text), P.TEST_NN, "exec")

    def test_a_file_without_the_import_is_refused(self):
        with self.assertRaises(P.AnchorError):
            self.joined("import os\n")


class TestWritePatchAuthor(TestCase):
    """`python -m detgrid.kit.upstream_tree --write-patch FILE`: the patch's author is the user's
    git identity as the kit's checkout sees it; without one, nothing is written."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="detgrid-author-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        (self.tmp / "home").mkdir()
        self.kit = self.tmp / "kit"  # a kit checkout: its git config, the kernel sources
        self.kit.mkdir()
        os.symlink(KIT / "aten_kernels", self.kit / "aten_kernels")
        subprocess.run(["git", "init", "-q", str(self.kit)], check=True)
        self.env = dict(without_identity(self.tmp / "home"), DETGRID_KIT_ROOT=str(self.kit))

    def write_patch(self, *argv):
        return subprocess.run([sys.executable, "-m", "detgrid.kit.upstream_tree", *argv],
                              env=self.env, capture_output=True, text=True, timeout=600)

    def test_missing_identity_is_refused_in_one_line(self):
        out = self.tmp / "v.patch"
        r = self.write_patch("--write-patch", str(out))
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("git user.name and user.email are not set", r.stderr)
        self.assertFalse(out.exists())

    def test_missing_file_argument_is_refused_in_one_line(self):
        r = self.write_patch("--write-patch")
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stderr.strip().splitlines(),
                         ["detgrid upstream_tree: --write-patch needs the patch file to write "
                          "(e.g. patches/v2.6.0.patch)"])

    def test_the_kit_checkouts_identity_is_the_author(self):
        real_tree()
        for key, value in (("user.name", "Kit User"), ("user.email", "kit.user@example.com")):
            git(self.kit, "config", key, value)
        out = self.tmp / "v.patch"
        r = self.write_patch("--write-patch", str(out))
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("From: Kit User <kit.user@example.com>\n", out.read_text())


class TestPatchRefusals(FixtureTree):
    """Everything that must stop the patch before a byte is written, with a one-line reason."""

    def test_dirty_file_the_change_writes_is_refused_even_with_allow_dirty(self):
        self.edit(P.TEST_NN, "import unittest\n", "import unittest  # local edit\n", commit=False)
        for extra in ((), ("--allow-dirty",)):
            before = snapshot(self.tree)
            rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp / "x.patch", *extra)
            self.assertEqual(rc, P.EXIT_DIRTY, stderr)
            self.assertIn("test/test_nn.py", stderr)
            assert_untouched(self, self.tree, before)

    def test_untracked_file_where_the_change_creates_one_is_refused(self):
        (self.tree / P.CORE_SOURCE).write_text("// mine\n")
        self.assert_refused(P.CORE_SOURCE, "uncommitted changes", rc=P.EXIT_DIRTY)

    def test_other_dirty_files_need_allow_dirty_and_stay_out_of_the_commit(self):
        (self.tree / "version.txt").write_text("2.12.0a0\n# local\n")
        self.assert_refused("uncommitted changes", "version.txt", "--allow-dirty", rc=P.EXIT_DIRTY)
        self.patch_ok("--allow-dirty")
        self.assertNotIn("version.txt", git(self.tree, "diff", "--name-only", "HEAD~1", "HEAD"))
        self.assertIn("version.txt", git(self.tree, "status", "--porcelain"))

    def test_dirty_tree_is_refused_when_nothing_is_left_to_change(self):
        self.patch_ok()
        self.base = git(self.tree, "rev-parse", "HEAD").strip()
        (self.tree / "version.txt").write_text("2.12.0a0\n# local\n")
        self.assert_refused("uncommitted changes", rc=P.EXIT_DIRTY)

    def test_unset_identity_is_refused(self):
        home = self.tmp / "home"
        home.mkdir()
        env = {"HOME": str(home), "GIT_CONFIG_GLOBAL": str(home / "none"), "GIT_CONFIG_NOSYSTEM": "1",
               **{k: "" for k in IDENTITY}}
        self.assert_refused("git user.name and user.email are not set", rc=P.EXIT_ANCHOR, env=env)

    def test_out_that_is_a_directory_is_refused(self):
        rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.tmp)
        self.assertEqual(rc, P.EXIT_USAGE)
        self.assertIn("is a directory", stderr)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD").strip(), self.base)
        self.assertEqual(leftovers(self.tree, self.tmp), [])

    def test_out_in_a_missing_or_unwritable_directory_is_refused(self):
        targets = [self.tmp / "missing" / "x.patch"]
        if not os.access("/proc/sys", os.W_OK):  # even root cannot write there
            targets.append(Path("/proc/sys/x.patch"))
        for out in targets:
            before = snapshot(self.tree)
            rc, _, stderr = run_patch("--pytorch", self.tree, "--out", out)
            self.assertEqual(rc, P.EXIT_USAGE, stderr)
            self.assertIn(str(out), stderr)
            assert_untouched(self, self.tree, before)
            self.assertEqual(git(self.tree, "rev-parse", "HEAD").strip(), self.base)

    def test_file_that_is_not_utf8_is_refused(self):
        for rel in ("version.txt", P.NOTES[1]):
            with self.subTest(rel=rel):
                path = self.tree / rel
                original = path.read_bytes()
                path.write_bytes(original + b"\xff\xfe\n")
                git(self.tree, "commit", "-qam", "bytes")
                self.base = git(self.tree, "rev-parse", "HEAD").strip()
                self.assert_refused(rel, "not UTF-8")
                path.write_bytes(original)
                git(self.tree, "commit", "-qam", "restore")
                self.base = git(self.tree, "rev-parse", "HEAD").strip()

    def test_paths_that_are_not_checkouts_are_named(self):
        plain = self.tmp / "plain"
        plain.mkdir()
        no_git = self.tmp / "no-git"
        shutil.copytree(FIXTURE_MAIN, no_git)
        for path, why in ((self.tmp / "nowhere", "no such directory"),
                          (plain, "is not a PyTorch checkout"),
                          (no_git, "is not the top of a git checkout")):
            rc, _, stderr = run_patch("--pytorch", path)
            self.assertNotEqual(rc, 0)
            self.assertIn(str(path), stderr)
            self.assertIn(why, stderr)
            self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)

    def test_kit_without_kernel_sources_is_refused(self):
        # what a non-editable install looks like: the package without aten_kernels/ beside it
        self.assert_refused("aten_kernels", "pip install -e", env={"DETGRID_KIT_ROOT": str(self.tmp)})


class TestPatchCrashSafety(FixtureTree):
    """Stopped at any point, by a failure, SIGINT, SIGTERM or SIGKILL, the next run finishes
    with the same commit contents as an uninterrupted run, and no temporary survives."""

    def setUp(self):
        super().setUp()
        reference = git_copy(self.fixture, self.tmp / "reference")
        rc, _, stderr = run_patch("--pytorch", reference, "--out", self.tmp / "reference.patch")
        self.assertEqual(rc, 0, stderr)
        self.expected_tree = git(reference, "rev-parse", "HEAD^{tree}").strip()
        self.expected_patch = diff_part((self.tmp / "reference.patch").read_text())
        self.out = self.tmp / "out" / "change.patch"
        self.out.parent.mkdir()

    def subprocess_patch(self, env=None):
        """`detgrid patch` in a child process; the detgrid package is loaded without its
        __init__ (which imports torch), so that the child starts fast."""
        code = ("import sys, types; pkg = types.ModuleType('detgrid'); pkg.__path__ = [sys.argv[1]]; "
                "sys.modules['detgrid'] = pkg; from detgrid.kit import patch; "
                "sys.exit(patch.main(['patch', '--pytorch', sys.argv[2], '--out', sys.argv[3]]))")
        return subprocess.Popen([sys.executable, "-c", code, str(KIT / "tools" / "detgrid"),
                                 str(self.tree), str(self.out)],
                                env={**os.environ, **IDENTITY, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def assert_finished_by_next_run(self):
        """The next run completes the interrupted apply (or rolls it back and applies again)."""
        child = self.subprocess_patch()
        stdout, stderr = child.communicate(timeout=120)
        self.assertEqual(child.returncode, 0, stdout + stderr)
        self.assertNotIn("Traceback", stderr)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD~1").strip(), self.base)
        self.assertEqual(git(self.tree, "rev-parse", "HEAD^{tree}").strip(), self.expected_tree)
        self.assertEqual(git(self.tree, "status", "--porcelain", "--untracked-files=all"), "")
        self.assertEqual(diff_part(self.out.read_text()), self.expected_patch)
        self.assertEqual(leftovers(self.tree, self.out.parent), [])

    def start_over(self):
        """The pristine checkout and no patch file (each case starts from there)."""
        git(self.tree, "reset", "-q", "--hard", self.base)
        git(self.tree, "clean", "-qfd")
        (self.tree / ".git" / "detgrid-patch.json").unlink(missing_ok=True)
        for p in self.out.parent.iterdir():
            p.unlink()

    def test_failure_at_every_step_rolls_back_in_process(self):
        for step in range(1, len(P.patch_apply.CHECKPOINTS) + 1):
            with self.subTest(step=P.patch_apply.CHECKPOINTS[step - 1]):
                self.start_over()
                rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.out,
                                          env={P.patch_apply.STOP_AT_ENV: f"{step}:raise"})
                self.assertEqual(rc, P.EXIT_ANCHOR)
                self.assertIn("stopped by", stderr)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertEqual(leftovers(self.tree, self.out.parent), [])
                committed = P.patch_apply.CHECKPOINTS[step - 1] in ("committed", "patch file written")
                if committed:  # completed: the commit stands and the patch file is written
                    self.assertIn("completed an interrupted apply", stderr)
                    self.assertEqual(git(self.tree, "rev-parse", "HEAD^{tree}").strip(), self.expected_tree)
                    self.assertEqual(diff_part(self.out.read_text()), self.expected_patch)
                else:
                    self.assertIn("rolled back an interrupted apply", stderr)
                    self.assertEqual(git(self.tree, "rev-parse", "HEAD").strip(), self.base)
                    self.assertEqual(git(self.tree, "status", "--porcelain", "--untracked-files=all"), "")
                    self.assertFalse(self.out.exists())

    def test_sigkill_at_every_step_is_finished_by_the_next_run(self):
        for step in range(1, len(P.patch_apply.CHECKPOINTS) + 1):
            with self.subTest(step=P.patch_apply.CHECKPOINTS[step - 1]):
                self.start_over()
                child = self.subprocess_patch({P.patch_apply.STOP_AT_ENV: f"{step}:kill"})
                child.communicate(timeout=120)
                self.assertEqual(child.returncode, -9)
                self.assertTrue((self.tree / ".git" / "detgrid-patch.json").exists())
                self.assert_finished_by_next_run()

    def test_real_signals_at_several_moments(self):
        import signal
        import time
        for sig, delay in product((signal.SIGKILL, signal.SIGTERM, signal.SIGINT), (0.05, 0.15, 0.3)):
            with self.subTest(signal=sig.name, delay=delay):
                self.start_over()
                child = self.subprocess_patch()
                time.sleep(delay)
                child.send_signal(sig)
                child.communicate(timeout=120)  # wherever it was: importing, planning, applying
                self.assert_finished_by_next_run()

    def test_journal_with_moved_head_is_left_to_the_user(self):
        child = self.subprocess_patch({P.patch_apply.STOP_AT_ENV: "3:kill"})
        child.communicate(timeout=120)
        git(self.tree, "stash", "-q", "--include-untracked")
        git(self.tree, "commit", "-q", "--allow-empty", "-m", "moved on")
        rc, _, stderr = run_patch("--pytorch", self.tree, "--out", self.out)
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn("records an interrupted apply", stderr)
        self.assertIn("delete", stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)

    def test_check_and_report_refuse_a_tree_with_an_interrupted_apply(self):
        child = self.subprocess_patch({P.patch_apply.STOP_AT_ENV: "3:kill"})
        child.communicate(timeout=120)
        rc, _, stderr = run_patch("--pytorch", self.tree, "--check")
        self.assertEqual(rc, P.EXIT_ANCHOR)
        self.assertIn("records an interrupted apply: run `detgrid patch", stderr)
        self.assert_finished_by_next_run()


if __name__ == "__main__":
    run_tests()
