# Owner(s): ["module: nn"]
"""The package's layout keeps its three parts apart: `import detgrid` (the
runtime: ops, the switch, the build guard, the extension) loads nothing of
detgrid.kit or detgrid.bench; the benchmark harness uses the runtime and
nothing of the kit; and the packages setup.py ships are all three."""

import json
import os
import pkgutil
import subprocess
import sys

import setuptools
from torch.testing._internal.common_utils import TestCase, run_tests

import detgrid.bench

# What setup.py packages: tools/ of this source tree.
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def detgrid_modules_after(statement):
    """The detgrid modules a fresh interpreter has loaded after `statement`."""
    code = (f"{statement}\nimport json, sys\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'detgrid')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{statement!r} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


class TestLayout(TestCase):
    def test_import_detgrid_loads_only_the_runtime_package(self):
        loaded = detgrid_modules_after("import detgrid")
        self.assertIn("detgrid.ops", loaded)
        self.assertEqual([m for m in loaded if m.startswith(("detgrid.kit", "detgrid.bench"))], [])

    def test_the_benchmark_harness_imports_nothing_of_the_kit(self):
        for module in pkgutil.iter_modules(detgrid.bench.__path__, "detgrid.bench."):
            loaded = detgrid_modules_after(f"import {module.name}")
            self.assertIn(module.name, loaded)
            self.assertEqual([m for m in loaded if m.startswith("detgrid.kit")], [], module.name)

    def test_setup_ships_the_runtime_the_kit_and_the_bench(self):
        # setup.py: packages=find_packages("tools"); a folder without
        # __init__.py would be left out of the wheel.
        self.assertEqual(sorted(setuptools.find_packages(TOOLS)),
                         ["detgrid", "detgrid.bench", "detgrid.kit"])
        for root, dirs, files in os.walk(os.path.join(TOOLS, "detgrid")):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if any(name.endswith(".py") for name in files):
                self.assertIn("__init__.py", files, root)


if __name__ == "__main__":
    run_tests()
