# Owner(s): ["module: nn"]
"""`detgrid verify` and `detgrid bench` answer every bad argument with an
error on stderr and a non-zero exit, never a traceback; and bench checks
its output path before it runs, not after."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import unittest
from unittest import mock

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid.bench import matrix as bench
from detgrid.kit import cli

CUDA_USABLE = torch.cuda.is_available() and ops.has_cuda_kernels()

# Bad arguments that need no files: (name, argv).
BAD_ARGUMENTS = (
    ("verify_runs_zero", ["verify", "--runs", "0"]),
    ("verify_runs_one", ["verify", "--runs", "1"]),
    ("verify_runs_negative", ["verify", "--runs", "-3"]),
    ("verify_runs_not_a_number", ["verify", "--runs", "many"]),
    ("bench_reps_zero", ["bench", "--device", "cpu", "--reps", "0"]),
    ("bench_warmup_negative", ["bench", "--device", "cpu", "--warmup", "-1"]),
    ("bench_scale_zero", ["bench", "--device", "cpu", "--scale", "0"]),
    ("bench_scale_nan", ["bench", "--device", "cpu", "--scale", "nan"]),
    ("bench_scale_inf", ["bench", "--device", "cpu", "--scale", "inf"]),
    ("bench_budget_negative", ["bench", "--device", "cpu", "--budget-s", "-1"]),
    ("bench_unknown_workload", ["bench", "--device", "cpu", "--workloads", "nope"]),
    ("bench_render_missing_file", ["bench", "--render", "/nonexistent/r.json"]),
)


def run_cli(argv):
    """(exit code, stdout, stderr) of cli.main(argv), in this process. An
    exception escaping main is returned as its traceback on stderr, exit
    code None, so that a test sees it as a traceback would appear."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse
            code = e.code
        except Exception:
            err.write(traceback.format_exc())
            code = None
    return code, out.getvalue(), err.getvalue()


class TestBadArguments(TestCase):
    def assert_clean_failure(self, argv):
        """A non-zero exit and an error on stderr, with no traceback; the run
        itself (bench.run_bench, verify.verify) never starts."""
        with mock.patch.object(bench, "run_bench", side_effect=AssertionError("bench ran")), \
                mock.patch("detgrid.kit.verify.verify", side_effect=AssertionError("verify ran")):
            code, out, err = run_cli(argv)
        self.assertNotIn("Traceback", out + err)
        self.assertIsNotNone(code, err)
        self.assertNotEqual(code, 0, err)
        self.assertRegex(err, r"(?m)^(detgrid \w+: |detgrid \w+: error: )", err)
        return err

    @parametrize("argv", [argv for _, argv in BAD_ARGUMENTS],
                 name_fn=lambda argv: next(n for n, a in BAD_ARGUMENTS if a == argv))
    def test_bad_argument_fails_without_traceback(self, argv):
        self.assert_clean_failure(argv)

    @parametrize("runs", ("0", "1"))
    def test_fewer_than_two_runs_are_refused_in_one_line(self, runs):
        err = self.assert_clean_failure(["verify", "--runs", runs])
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn(f"argument --runs: must be at least 2, got {runs}", err)

    @parametrize("dtype", ("float16", "bfloat16"))
    def test_verify_takes_the_reduced_precision_dtypes(self, dtype):
        with mock.patch("detgrid.kit.verify.verify", return_value=[]) as run:
            code, _, err = run_cli(["verify", "--device", "cpu", "--runs", "2", "--dtype", dtype])
        self.assertEqual(code, 0, err)
        self.assertEqual(run.call_args.kwargs["dtype"], getattr(torch, dtype))

    def test_bench_list_shows_only_the_workloads_asked_for(self):
        code, out, err = run_cli(["bench", "--list", "--workloads",
                                  "basicvsr_flow_warp,simplebev_lift_3d"])
        self.assertEqual(code, 0, err)
        listed = [line.split()[1] for line in out.splitlines()]
        self.assertEqual(listed, ["basicvsr_flow_warp", "simplebev_lift_3d"])
        code, out, _ = run_cli(["bench", "--list"])
        self.assertEqual(len(out.splitlines()), len(bench.listing()))

    def test_bench_list_refuses_an_unknown_workload(self):
        err = self.assert_clean_failure(["bench", "--list", "--workloads", "nope"])
        self.assertIn("unknown workload(s) nope", err)

    @unittest.skipIf(CUDA_USABLE, "CUDA is usable here")
    def test_device_cuda_without_cuda_fails_without_traceback(self):
        for verb in ("verify", "bench"):
            err = self.assert_clean_failure([verb, "--device", "cuda"])
            self.assertEqual(err.count("\n"), 1, err)
            self.assertIn(f"detgrid {verb}: --device cuda, but ", err)

    def test_render_of_a_file_that_is_not_json(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "r.json")
            with open(path, "w") as f:
                f.write("not json {")
            err = self.assert_clean_failure(["bench", "--render", path])
        self.assertIn(f"cannot read {path} as JSON", err)

    def test_render_of_a_file_that_is_not_utf8(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "r.json")
            with open(path, "wb") as f:
                f.write(b"\xff\xfe{")
            self.assert_clean_failure(["bench", "--render", path])

    def test_render_of_json_that_is_not_a_bench_result(self):
        with tempfile.TemporaryDirectory() as work:
            for text in ("[]", "{}", '{"workloads": 3}'):
                path = os.path.join(work, "r.json")
                with open(path, "w") as f:
                    f.write(text)
                err = self.assert_clean_failure(["bench", "--render", path])
                self.assertIn("is not a detgrid bench result", err)

    def test_render_of_a_directory(self):
        with tempfile.TemporaryDirectory() as work:
            self.assert_clean_failure(["bench", "--render", work])

    def test_out_on_a_directory_fails_before_the_run(self):
        with tempfile.TemporaryDirectory() as work:
            err = self.assert_clean_failure(["bench", "--device", "cpu", "--out", work])
        self.assertIn("is a directory", err)

    def test_out_whose_markdown_sibling_is_a_directory_fails_before_the_run(self):
        with tempfile.TemporaryDirectory() as work:
            os.mkdir(os.path.join(work, "r.md"))
            err = self.assert_clean_failure(
                ["bench", "--device", "cpu", "--out", os.path.join(work, "r.json")])
        self.assertIn("r.md is a directory", err)

    def test_out_below_a_file_fails_before_the_run(self):
        with tempfile.TemporaryDirectory() as work:
            blocker = os.path.join(work, "file")
            open(blocker, "w").close()
            err = self.assert_clean_failure(
                ["bench", "--device", "cpu", "--out", os.path.join(blocker, "sub", "r.json")])
        self.assertIn("is not a directory", err)

    def test_out_in_a_folder_yet_to_be_made_is_accepted(self):
        with tempfile.TemporaryDirectory() as work:
            bench.check_out(os.path.join(work, "new", "deeper", "r.json"))

    def test_bad_argument_in_a_real_process_prints_no_traceback(self):
        # The console entry point end to end, once: what a user sees.
        proc = subprocess.run([sys.executable, "-m", "detgrid", "bench", "--device", "cpu",
                               "--reps", "0"], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertNotIn("Traceback", proc.stdout + proc.stderr)
        self.assertIn("argument --reps: must be at least 1, got 0", proc.stderr)


class TestInsideAPyTorchCheckout(TestCase):
    """`python -m detgrid` puts the current directory first on sys.path: inside a PyTorch
    checkout `import torch` finds the checkout's torch/ package, which is no build (here a
    package with no __version__, as a checkout's is before it is built)."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="detgrid-checkout-")
        self.addCleanup(shutil.rmtree, self.work, ignore_errors=True)
        os.mkdir(os.path.join(self.work, "torch"))
        with open(os.path.join(self.work, "torch", "__init__.py"), "w") as f:
            f.write("# a source checkout's torch/, not built\n")

    def run_module(self, *argv):
        proc = subprocess.run([sys.executable, "-m", "detgrid", *argv], cwd=self.work,
                              capture_output=True, text=True, timeout=300)
        self.assertNotIn("Traceback", proc.stdout + proc.stderr)
        return proc

    def test_patch_starts_without_torch(self):
        # no checkout here (no version.txt): patch gets as far as saying so, in one line
        proc = self.run_module("patch", "--pytorch", ".", "--check")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertEqual(proc.stderr.strip().splitlines(),
                         [f"detgrid patch: {self.work} is not a PyTorch checkout (no version.txt)"])

    def test_patch_check_runs_on_a_checkout(self):
        tree = os.path.join(self.work, "tree")
        shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "upstream_main"), tree)
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
            subprocess.run(["git", "-C", tree, *args], check=True, capture_output=True)
        proc = subprocess.run([sys.executable, "-m", "detgrid", "patch", "--pytorch", ".", "--check"],
                              cwd=tree, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("applies:", proc.stdout)

    def test_verbs_that_need_torch_say_so_in_one_line(self):
        for argv in (["verify"], ["report", "--out", os.path.join(self.work, "out")]):
            proc = self.run_module(*argv)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertIn(f"the torch Python imports here ({self.work}/torch) is not an installed "
                          "build", lines[0])
            self.assertIn("run detgrid from another directory", lines[0])

    def test_version_needs_no_torch(self):
        proc = self.run_module("--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(proc.stdout.startswith("detgrid "), proc.stdout)


instantiate_parametrized_tests(TestBadArguments)

if __name__ == "__main__":
    run_tests()
