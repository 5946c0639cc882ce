# Owner(s): ["module: nn"]
"""Tests of `detgrid build` (detgrid.kit.build) that need no GPU and no real PyTorch
build: the dry-run script (environment and commands, exactly), MAX_JOBS, and a
fake checkout whose stub build prints ninja-style `[n/m]` progress and fails on
demand with a compiler-style error: progress parsed, full log written, the first
error and the log path named, and a second run resuming without cleaning.

Names here avoid the word the device run selects tests by.
"""

import contextlib
import io
import json
import os
import shlex
import sys
import tempfile
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import build, cli

GIB = 2**30

# The stub build entry: ten objects; those already in build/objects are up to
# date (an incremental rebuild skips them); FAKE_FAIL_AT=k fails compiling obj k.
STUB_SETUP = r'''
import os, sys
os.makedirs("build", exist_ok=True)
done_file = os.path.join("build", "objects")
done = open(done_file).read().split() if os.path.exists(done_file) else []
todo = [f"obj{i}.o" for i in range(1, 11) if f"obj{i}.o" not in done]
fail_at = os.environ.get("FAKE_FAIL_AT")
print("-- Configuring done (CMake Warning: nothing to worry about)")
for i, target in enumerate(todo, 1):
    print(f"[{i}/{len(todo)}] Building CXX object {target}", flush=True)
    if fail_at and target == f"obj{fail_at}.o":
        print(f"FAILED: {target}")
        print('aten/src/ATen/native/cuda/GridSampler.cu(41): error: identifier "bogus" is undefined')
        print("aten/src/ATen/native/GridSampler.cpp:7:3: error: a later error")
        print("error: command '/usr/bin/ninja' failed with exit code 1")
        sys.exit(1)
    with open(done_file, "a") as f:
        f.write(target + "\n")
print("Successfully installed torch")
'''

# Stands in for `python`: records its arguments, then runs the stub setup.py.
FAKE_PYTHON = r'''#!{python}
import json, os, runpy, sys
with open("invocations.jsonl", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
runpy.run_path("setup.py")
'''


def make_fake_checkout(root):
    with open(os.path.join(root, "setup.py"), "w") as f:
        f.write(STUB_SETUP)
    python = os.path.join(root, "fake-python")
    with open(python, "w") as f:
        f.write(FAKE_PYTHON.replace("{python}", sys.executable))
    os.chmod(python, 0o755)
    return python


def invocations(root):
    path = os.path.join(root, "invocations.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


class TestBuildPlan(TestCase):
    def test_dry_run_prints_exact_environment_and_commands(self):
        with tempfile.TemporaryDirectory() as root:
            make_fake_checkout(root)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = cli.main(["build", "--pytorch", root, "--dry-run", "--jobs", "8",
                               "--cuda-arch", "9.0"])
            self.assertEqual(rc, 0)
            py = shlex.quote(sys.executable)
            expected = [
                "# detgrid build --mode full (dry run: nothing was run)",
                f"# full log: {os.path.join(root, 'detgrid-build.log')}",
                "# environment: inherited, plus:",
                "export BUILD_TEST=0", "export MAX_JOBS=8", "export TORCH_CUDA_ARCH_LIST=9.0",
                "export USE_CUDA=1", "export USE_DISTRIBUTED=0", "export USE_FLASH_ATTENTION=0",
                "export USE_MEM_EFF_ATTENTION=0", "export USE_NINJA=1",
                f"cd {root}",
                f"{py} -m pip install -e . -v --no-build-isolation",
            ]
            self.assertEqual(out.getvalue().splitlines()[:len(expected)], expected)

    def test_dry_run_runs_nothing(self):
        with tempfile.TemporaryDirectory() as root:
            make_fake_checkout(root)
            with contextlib.redirect_stdout(io.StringIO()):
                cli.main(["build", "--pytorch", root, "--dry-run", "--cuda-arch", "9.0"])
            self.assertEqual(sorted(os.listdir(root)), ["fake-python", "setup.py"])

    def test_full_plan_updates_submodules_and_requirements_when_present(self):
        with tempfile.TemporaryDirectory() as root:
            make_fake_checkout(root)
            os.mkdir(os.path.join(root, ".git"))
            open(os.path.join(root, "requirements.txt"), "w").close()
            plan = build.plan_build(root, "full", jobs=4, cuda_arch="8.0;9.0", python="py")
            self.assertEqual(plan.commands, [
                ["git", "submodule", "update", "--init", "--recursive"],
                ["py", "-m", "pip", "install", "-r", "requirements.txt"],
                ["py", "-m", "pip", "install", "-e", ".", "-v", "--no-build-isolation"],
            ])
            self.assertIn("export TORCH_CUDA_ARCH_LIST='8.0;9.0'", plan.script())

    def test_arch_comes_from_local_gpu_and_flag_overrides_it(self):
        with tempfile.TemporaryDirectory() as root:
            make_fake_checkout(root)
            plan = build.plan_build(root, detect_arch=lambda: "9.0", jobs=1)
            self.assertEqual(plan.env["TORCH_CUDA_ARCH_LIST"], "9.0")
            plan = build.plan_build(root, cuda_arch="8.6", detect_arch=lambda: "9.0", jobs=1)
            self.assertEqual(plan.env["TORCH_CUDA_ARCH_LIST"], "8.6")

    def test_full_mode_without_gpu_needs_the_arch_flag(self):
        with tempfile.TemporaryDirectory() as root:
            make_fake_checkout(root)
            with self.assertRaisesRegex(build.BuildError, "--cuda-arch"):
                build.plan_build(root, detect_arch=lambda: None)
            err = io.StringIO()
            with mock.patch.object(build, "local_cuda_arch", lambda: None), \
                    contextlib.redirect_stderr(err):
                rc = cli.main(["build", "--pytorch", root, "--dry-run"])
            self.assertEqual(rc, 2)
            self.assertIn("pass --cuda-arch", err.getvalue())

    def test_a_folder_without_setup_py_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            with self.assertRaisesRegex(build.BuildError, "not a PyTorch checkout"):
                build.plan_build(root, cuda_arch="9.0")
        with self.assertRaisesRegex(build.BuildError, "needs --pytorch"):
            build.plan_build(None, "full", cuda_arch="9.0")

    def test_extension_plan_installs_the_kit_against_installed_torch(self):
        plan = build.plan_build(mode="extension", jobs=3, python="py", detect_arch=lambda: None,
                                editable=False)
        self.assertEqual(plan.cwd, build.KIT_ROOT)
        self.assertTrue(os.path.isfile(os.path.join(plan.cwd, "setup.py")))
        self.assertEqual(plan.commands, [["py", "-m", "pip", "install", "--no-build-isolation", "."]])
        self.assertEqual(plan.env, {"MAX_JOBS": "3"})
        plan = build.plan_build(mode="extension", jobs=3, python="py", cuda_arch="9.0",
                                editable=True)
        self.assertEqual(plan.env["TORCH_CUDA_ARCH_LIST"], "9.0")

    def test_extension_plan_keeps_an_editable_install_editable(self):
        plan = build.plan_build(mode="extension", jobs=1, python="py", editable=True)
        self.assertEqual(plan.commands,
                         [["py", "-m", "pip", "install", "--no-build-isolation", "-e", "."]])
        self.assertIn("kept editable", plan.script())

    def test_max_jobs_is_min_of_cores_and_memory_over_2_5_gib(self):
        self.assertEqual(build.default_max_jobs(16, 128 * GIB), 16)
        self.assertEqual(build.default_max_jobs(16, 20 * GIB), 8)
        self.assertEqual(build.default_max_jobs(64, 100 * GIB), 40)
        self.assertEqual(build.default_max_jobs(4, 1 * GIB), 1)
        self.assertGreaterEqual(build.default_max_jobs(), 1)
        plan = build.plan_build(mode="extension", cores=16, mem_bytes=20 * GIB)
        self.assertEqual(plan.env["MAX_JOBS"], "8")


class TestBuildRun(TestCase):
    def run_fake(self, root, fail_at=None):
        python = make_fake_checkout(root) if not os.path.exists(os.path.join(root, "setup.py")) \
            else os.path.join(root, "fake-python")
        plan = build.plan_build(root, "full", jobs=2, cuda_arch="9.0", python=python)
        if fail_at:
            plan.env["FAKE_FAIL_AT"] = str(fail_at)
        events = []
        result = build.run_build(plan, on_event=lambda kind, data: events.append((kind, data)))
        return plan, result, events

    def test_progress_is_parsed_and_full_log_written(self):
        with tempfile.TemporaryDirectory() as root:
            plan, result, events = self.run_fake(root)
            self.assertTrue(result.ok)
            progress = [data for kind, data in events if kind == "progress"]
            self.assertEqual(progress, [(i, 10) for i in range(1, 11)])
            self.assertEqual(result.progress, (10, 10))
            with open(result.log_path) as f:
                log = f.read()
            self.assertEqual(result.log_path, os.path.join(root, "detgrid-build.log"))
            self.assertIn("[7/10] Building CXX object obj7.o", log)
            self.assertIn("export MAX_JOBS=2", log)
            self.assertIn("Successfully installed torch", log)

    def test_failure_names_first_compiler_error_and_log_path(self):
        with tempfile.TemporaryDirectory() as root:
            _, result, _ = self.run_fake(root, fail_at=4)
            self.assertFalse(result.ok)
            self.assertEqual(result.returncode, 1)
            self.assertEqual(result.progress, (4, 10))
            self.assertEqual(result.first_error,
                             'aten/src/ATen/native/cuda/GridSampler.cu(41): error: identifier '
                             '"bogus" is undefined')
            summary = result.summary()
            self.assertIn(result.first_error, summary)
            self.assertIn(f"full log: {os.path.join(root, 'detgrid-build.log')}", summary)
            with open(result.log_path) as f:
                self.assertIn("# failed with exit code 1", f.read())

    def test_first_error_prefers_compiler_lines_over_earlier_generic_ones(self):
        error, strong = None, False
        for line in ["CMake Error: something generic", "x.cpp:3:1: error: real one",
                     "y.cpp:9:2: fatal error: later"]:
            error, strong = build.first_error_line(line, error, strong)
        self.assertEqual(error, "x.cpp:3:1: error: real one")

    def test_rerun_resumes_with_the_same_command_without_cleaning(self):
        with tempfile.TemporaryDirectory() as root:
            _, failed, _ = self.run_fake(root, fail_at=4)
            self.assertFalse(failed.ok)
            _, resumed, events = self.run_fake(root)
            self.assertTrue(resumed.ok)
            runs = invocations(root)
            self.assertEqual(len(runs), 2)
            self.assertEqual(runs[0], runs[1])
            self.assertEqual(runs[0], ["-m", "pip", "install", "-e", ".", "-v", "--no-build-isolation"])
            # objects 1-3 survived: only the remaining 7 were built
            self.assertEqual([d for k, d in events if k == "progress"][-1], (7, 7))
            with open(os.path.join(root, "build", "objects")) as f:
                self.assertEqual(len(f.read().split()), 10)

    def test_cli_prints_error_summary_and_exits_nonzero_on_failure(self):
        with tempfile.TemporaryDirectory() as root:
            python = make_fake_checkout(root)
            plan = build.plan_build(root, "full", jobs=1, cuda_arch="9.0", python=python)
            plan.env["FAKE_FAIL_AT"] = "2"
            err, out = io.StringIO(), io.StringIO()
            with mock.patch.object(build, "plan_build", lambda *a, **k: plan), \
                    contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                rc = cli.main(["build", "--pytorch", root])
            self.assertEqual(rc, 1)
            self.assertIn('GridSampler.cu(41): error: identifier "bogus"', err.getvalue())
            self.assertIn(os.path.join(root, "detgrid-build.log"), err.getvalue())
            self.assertIn("[", err.getvalue())  # the progress bar


if __name__ == "__main__":
    run_tests()
