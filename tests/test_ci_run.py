# Owner(s): ["module: nn"]
"""CI's script (.ci/run) runs README's test command as README gives it and
times every step; extension_tests.sh reruns only the tests of the compiled
extension against each CUDA build of torch (cuda_build_check.sh's build,
install_check.sh's wheel), leaving out only the kit's tooling tests, each of
which exists."""

import os
import re

from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def commands(script):
    """The script's logical lines that are neither blank nor comments."""
    text = re.sub(r"\\\n", " ", script)
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


class TestCiRun(TestCase):
    def test_runs_readmes_test_command_verbatim(self):
        first_block = read("README.md").split("```")[1]
        test_line = next(line for line in first_block.splitlines() if "pytest" in line)
        command = test_line.split("   #")[0].strip()
        self.assertIn(f"time {{ {command}; }}", commands(read(".ci", "run")))

    def test_every_step_prints_its_wall_time(self):
        lines = commands(read(".ci", "run"))
        timed = [i for i, line in enumerate(lines) if line.startswith("time {")]
        self.assertGreaterEqual(len(timed), 9)
        for i in timed:
            self.assertTrue(lines[i - 1].startswith("step "), lines[i - 1])
            self.assertRegex(lines[i], r"^time \{ .*; \}$")
        # every check runs inside a timed step
        for line in lines:
            if re.search(r"\.ci/\w+\.sh|detgrid bench|pytest", line):
                self.assertTrue(line.startswith("time {"), line)

    def test_side_lane_needs_nothing_of_the_main_lane(self):
        # The side lane starts before README's command has made .venv: what
        # it runs must make its own environments, and its failure must fail CI.
        script = read(".ci", "run")
        side = script[script.index("\n{\n"):script.index("side_lane=$!")]
        for name in re.findall(r"bash (\.ci/\w+\.sh)", side):
            self.assertNotIn(".venv/bin", read(*name.split("/")), name)
            self.assertNotIn("$root/.venv", read(*name.split("/")), name)
        self.assertIn('wait "$side_lane" || side_status=$?', script)
        self.assertIn('((${side_status:-0} == 0)) || {', script)


class TestExtensionTests(TestCase):
    def ignored(self):
        script = read(".ci", "extension_tests.sh")
        names = re.search(r"kit_tests=\(([^)]*)\)", script).group(1).split()
        self.assertIn('"${kit_tests[@]/#/--ignore=tests/}"', script)
        return names

    def test_leaves_out_only_test_files_that_exist(self):
        for name in self.ignored():
            self.assertTrue(os.path.isfile(os.path.join(ROOT, "tests", name)), name)

    def test_keeps_every_test_of_the_kernels_and_the_switch(self):
        # Tests built on the kernel helpers (detgrid_testing), or on the
        # package's public API (the switch, the recipe), run against every build.
        subjects = re.compile(r"^(from detgrid_testing import|import detgrid$)", re.M)
        for name in self.ignored():
            self.assertIsNone(subjects.search(read("tests", name)), name)

    def test_every_cuda_build_in_ci_runs_them(self):
        # CI builds the CUDA kernels twice: cuda_build_check.sh (2.15.0) and
        # install_check.sh's wheel (2.14.1); each runs the tests on its build.
        self.assertIn("bash .ci/cuda_build_check.sh 2.15.0", read(".ci", "run"))
        self.assertIn("bash .ci/install_check.sh", read(".ci", "run"))
        for script in ("cuda_build_check.sh", "install_check.sh"):
            self.assertRegex(
                "\n".join(commands(read(".ci", script))),
                r'bash "\$root/\.ci/extension_tests\.sh" "\$(venv|run_venv)/bin/python"',
                script)


if __name__ == "__main__":
    run_tests()
