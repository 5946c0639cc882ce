# Owner(s): ["module: nn"]
"""The package's layout keeps its three parts apart: `import detgrid` (the
runtime: ops, the switch, the build guard, the extension) loads nothing of
detgrid.kit or detgrid.bench; the benchmark harness uses the runtime and
nothing of the kit; the packages setup.py ships are all three; and no two
modules import each other, directly or round a longer circle."""

import ast
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


def module_name(path):
    """detgrid.kit.build for tools/detgrid/kit/build.py; a package for its __init__.py."""
    parts = list(os.path.relpath(path, TOOLS)[:-len(".py")].split(os.sep))
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules():
    """{module name: source path} of every module under tools/detgrid."""
    modules = {}
    for root, dirs, files in os.walk(os.path.join(TOOLS, "detgrid")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                modules[module_name(os.path.join(root, name))] = os.path.join(root, name)
    return modules


def imported_modules(path, modules):
    """The package's modules that `path` imports anywhere in its code (in a
    function too: a deferred import closes a circle as surely, only later)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module_name(path).rsplit(".", 1)[0] if not path.endswith("__init__.py") \
        else module_name(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from detgrid.kit import apt` imports the module detgrid.kit.apt
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return found & set(modules)


def import_circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


class TestLayout(TestCase):
    def test_import_detgrid_loads_only_the_runtime_package(self):
        loaded = detgrid_modules_after("import detgrid")
        self.assertIn("detgrid.ops", loaded)
        self.assertEqual([m for m in loaded if m.startswith(("detgrid.kit", "detgrid.bench"))], [])

    def test_importing_the_recipe_loads_only_the_runtime_package(self):
        loaded = detgrid_modules_after(
            "from detgrid import check_determinism, dataloader_kwargs, seed_everything")
        self.assertIn("detgrid.seeding", loaded)
        self.assertEqual([m for m in loaded if m.startswith(("detgrid.kit", "detgrid.bench"))], [])

    def test_the_benchmark_harness_imports_nothing_of_the_kit(self):
        for module in pkgutil.iter_modules(detgrid.bench.__path__, "detgrid.bench."):
            loaded = detgrid_modules_after(f"import {module.name}")
            self.assertIn(module.name, loaded)
            self.assertEqual([m for m in loaded if m.startswith("detgrid.kit")], [], module.name)

    def test_no_module_of_the_package_imports_itself_back(self):
        modules = package_modules()
        graph = {name: imported_modules(path, modules) - {name}
                 for name, path in modules.items()}
        self.assertEqual(import_circles(graph), [])

    def test_import_circles_are_found_round_any_length(self):
        self.assertEqual(import_circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}), [["a", "b"]])
        self.assertEqual(import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}), [["a", "b", "c"]])
        self.assertEqual(import_circles({"a": {"b"}, "b": set()}), [])

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
