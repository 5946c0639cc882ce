# Owner(s): ["module: nn"]
"""README's snippets do what README says: the Use block runs as pasted (on
this machine's torch: CUDA where there is a GPU and CUDA kernels, else the
CPU switch), and the install section names the command the install's own
failure message gives."""

import os
import re
import subprocess
import sys

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import toolchain

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def section(title):
    with open(README) as f:
        text = f.read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def code_blocks(text, language):
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


class TestReadme(TestCase):
    def test_use_snippet_runs_as_pasted_and_reproduces_its_bits(self):
        (snippet,) = code_blocks(section("Use"), "python")
        outputs = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-W", "error", "-c", snippet],
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(proc.stderr, "")  # "no error, no warning"
            outputs.append(proc.stdout)
        self.assertEqual(outputs[0], outputs[1])
        self.assertRegex(outputs[0], r"^True [0-9a-f]{64}\n$")  # the check held; one SHA-256

    def test_install_offers_the_command_of_the_failure_message(self):
        (commands,) = code_blocks(section("Install"), "sh")
        first = commands.splitlines()[0].split("   #")[0]
        self.assertEqual(first, toolchain.pip_toolkit_command("13.0"))
        self.assertIn("pip install --no-build-isolation .", commands)

    def test_paths_it_names_are_in_the_repository(self):
        # `dir/file.ext` in backticks; out/ is what the main job writes.
        with open(README) as f:
            paths = re.findall(r"`((?:\.?[\w-]+/)+[\w.-]+\.\w+)`", f.read())
        self.assertIn("tools/detgrid/bench/workloads.py", paths)
        missing = [p for p in paths if not p.startswith("out/")
                   and not os.path.exists(os.path.join(os.path.dirname(README), p))]
        self.assertEqual(missing, [])

    def test_readme_opens_with_the_main_job_and_the_tests(self):
        with open(README) as f:
            head = f.read().split("```")[1]
        self.assertIn("bash tools/setup.sh && .venv/bin/detgrid verify", head)
        self.assertIn("bash tools/setup.sh && .venv/bin/python -m pytest tests", head)

    def test_purpose_comes_first_and_the_gpu_status_near_the_top(self):
        with open(README) as f:
            text = f.read()
        first_paragraph = text.split("\n\n")[1]
        self.assertIn("deterministic CUDA backward", first_paragraph)
        self.assertLess(text.index("have not yet run on a GPU"), text.index("\n## "))
        self.assertIn("Researcher, this is your route", section("Install"))


if __name__ == "__main__":
    run_tests()
