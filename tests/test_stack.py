# Owner(s): ["module: nn"]
"""The upstream change as a stack (detgrid.kit.stack, patches/stack/): the markers cut the
sources into levels, every level compiles on its own and gives the golden bits, and the
checked-in patches and bodies are what the tools write from the sources today."""

import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid.bench import workloads
from detgrid.kit import stack, stack_patches, upstream_tree
from golden import corpus

KIT = Path(__file__).resolve().parents[1]
STACK = KIT / "patches" / "stack"
GOLDEN = corpus.load()

# Instantiates the whole pipeline over an executor that runs each stage once, so every stage
# body is compiled, without CUDA: what a level's files need of each other and of ATen.
HOST_UNIT = textwrap.dedent("""\
    #include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>
    namespace gsd = at::native::grid_sampler_deterministic;
    struct Executor {
      template <typename count_t, typename Stage>
      void for_each(count_t, const Stage& s) const { s(count_t(0)); }
      template <typename row_t, typename col_t, typename Stage>
      void for_each_row(row_t, col_t, const Stage& s) const { s(s.row(row_t(0)), col_t(0)); }
      template <typename key_t>
      void stable_sort_pairs(const key_t*, key_t*, const int32_t*, int32_t*, int32_t, int) const {}
      void inclusive_sum(const int32_t*, int32_t*, int32_t) const {}
      c10::DataPtr allocate(int64_t) const { return {}; }
      void zero(void*, int64_t) const {}
      void begin_chunk() const {}
    };
    template void gsd::run_deterministic_backward<Executor>(
        const Executor&, const at::native::GridSamplerBackwardCall&, const gsd::BackwardPlan&);
    gsd::BackwardPlan plan(const at::native::GridSamplerBackwardCall& call) {
      return gsd::plan_backward(gsd::describe_backward(call));
    }
    """)


def visible_words(text: str) -> int:
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<details>.*?</details>", "", text, flags=re.S)
    return len(re.findall(r"\w+", text))


class TestCut(TestCase):
    def test_a_block_is_kept_from_its_level_on(self):
        text = "a\n// [stack: dense]\nb\n// [end stack: dense]\nc\n"
        self.assertEqual(stack.cut(text, "core"), "a\nc\n")
        self.assertEqual(stack.cut(text, "index32"), "a\nc\n")
        self.assertEqual(stack.cut(text, "dense"), "a\nb\nc\n")

    def test_a_replaced_line_reads_its_older_code_before_its_level(self):
        text = "  x = wide(); // [stack: index32 replaces: x = narrow();]\n"
        self.assertEqual(stack.cut(text, "core"), "  x = narrow();\n")
        self.assertEqual(stack.cut(text, "index32"), "  x = wide();\n")

    def test_a_dropped_block_between_blank_lines_leaves_one(self):
        text = "a\n\n// [stack: cells]\nb\n// [end stack: cells]\n\nc\n"
        self.assertEqual(stack.cut(text, "dense"), "a\n\nc\n")

    def test_bad_markers_are_refused_with_their_line(self):
        for text, why in (("// [stack: nope]\n// [end stack: nope]\n", "no level 'nope'"),
                          ("// [stack: dense]\n", "never closed"),
                          ("// [end stack: dense]\n", "closes nothing"),
                          ("x; // [stack: core]\n", "no level 'core'")):
            with self.assertRaisesRegex(stack.StackError, why):
                stack.cut(text, "core", where="f.cuh")

    def test_the_whole_stack_is_the_sources_without_their_markers(self):
        source = KIT / "aten_kernels" / stack.KERNEL_DIR
        for rel, text in stack.kernel_sources(KIT).items():
            original = (source / Path(rel).name).read_text()
            self.assertEqual(
                text.splitlines(),
                [re.sub(r"\s*// \[stack: [\w-]+(?: replaces: .*)?\]$", "", line)
                 for line in original.splitlines() if not re.match(r"\s*// \[(end )?stack:", line)],
                rel)

    def test_each_level_adds_its_files_and_the_core_file_set_is_fixed(self):
        self.assertEqual(stack.kernel_files("core"), stack.KERNEL_CORE_FILES)
        on_disk = sorted(p.name for p in (KIT / "aten_kernels" / stack.KERNEL_DIR).iterdir())
        self.assertEqual(sorted(stack.kernel_files()), on_disk)

    def test_no_level_file_is_named_in_a_lower_level(self):
        for level in stack.LEVEL_NAMES:
            text = "".join(stack.kernel_sources(KIT, level).values())
            later = [f for f in stack.kernel_files() if f not in stack.kernel_files(level)]
            self.assertEqual([f for f in later if f in text], [], level)


@instantiate_parametrized_tests
class TestEveryLevelCompilesAlone(TestCase):
    @parametrize("level", stack.LEVEL_NAMES)
    def test_host_build_of_the_level_compiles_without_warnings(self, level):
        from torch.utils import cpp_extension

        with tempfile.TemporaryDirectory(prefix="detgrid-level-") as tmp:
            for rel, text in stack.kernel_sources(KIT, level).items():
                path = Path(tmp) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            unit = Path(tmp) / "unit.cpp"
            unit.write_text(HOST_UNIT)
            includes = [f"-I{p}" for p in [Path(tmp) / "aten/src", *cpp_extension.include_paths()]]
            result = subprocess.run(
                [os.environ.get("CXX", "g++"), "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra",
                 "-Werror", "-Wno-unused-function", *includes, str(unit)],
                capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])


@instantiate_parametrized_tests
class TestEveryLevelGivesTheGoldenBits(TestCase):
    @parametrize("level", stack.LEVEL_NAMES)
    def test_grad_input_and_grad_grid_digests_hold(self, level):
        wrong = [case.name for case in corpus.CASES
                 if corpus.compute(case, level=level) != {k: v for k, v in GOLDEN[case.name].items()
                                                          if k != "description"}]
        self.assertEqual(wrong, [])

    def test_an_unknown_level_is_a_one_line_error(self):
        case = corpus.CASES[0]
        with self.assertRaisesRegex(ValueError, "unknown level 'fast'"):
            corpus.run(case, level="fast")


class TestLevelsRunTheirPrefix(TestCase):
    def counters(self, level):
        workload = workloads.BENCH_WORKLOADS["rtdetr_l80"]
        return workloads.full_size_work_counters(workload, "ordered", level=level)

    def test_the_core_sorts_64_bit_keys_per_tap_and_reduces_sparsely(self):
        core, top = self.counters("core"), self.counters(stack.TOP)
        self.assertEqual(core["elements_swept"], 0)
        self.assertEqual(core["key_bytes"], 8)
        self.assertEqual(core["items_sorted"], core["records"])
        self.assertEqual(top["items_sorted"] * 4, core["items_sorted"])

    def test_the_whole_stack_is_the_default(self):
        workload = workloads.BENCH_WORKLOADS["rtdetr_l80"]
        self.assertEqual(self.counters(stack.TOP), workloads.full_size_work_counters(workload))


class TestCheckedInStack(TestCase):
    def test_bodies_are_what_the_tool_writes_today(self):
        with tempfile.TemporaryDirectory() as tmp:
            stack_patches.write_bodies(Path(tmp))
            for level in stack.LEVELS:
                name = f"{level.patch}.md"
                self.assertEqual((Path(tmp) / name).read_text(), (STACK / name).read_text(),
                                 f"patches/stack/{name} is stale; run: {stack_patches.REGENERATE}")

    def test_bodies_keep_to_250_visible_words(self):
        for level in stack.LEVELS:
            text = (STACK / f"{level.patch}.md").read_text()
            self.assertLessEqual(visible_words(text), 250, level.patch)

    @unittest.skipUnless(upstream_tree.cached_tree().is_dir(), "the v2.6.0 tree is not cached")
    def test_patches_are_what_the_tool_writes_today_and_stack_to_the_whole_patch(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "stack"
            self.assertEqual(stack_patches.write_patches(out, "t", "t@t"), 0)
            for level in stack.LEVELS:
                name = f"{level.patch}.patch"
                self.assertEqual(_diff_part((out / name).read_text()),
                                 _diff_part((STACK / name).read_text()),
                                 f"patches/stack/{name} is stale; run: {stack_patches.REGENERATE}")
            tree = upstream_tree.fresh_git_copy(Path(tmp) / "tree")
            for level in stack.LEVELS:
                subprocess.run(["git", "apply", str(STACK / f"{level.patch}.patch")], cwd=tree,
                               check=True)
            for rel, text in stack.kernel_sources(KIT).items():
                self.assertEqual((tree / rel).read_text(), text, rel)
            shutil.rmtree(tree)


def _diff_part(text: str) -> str:
    """The diffs of a format-patch, without its header and its trailer."""
    start = text.index("\ndiff --git")
    end = text.rfind("\n-- \n")
    diffs = text[start:end if end > start else len(text)]
    return "\n".join(line for line in diffs.splitlines() if not line.startswith("base-commit:"))


if __name__ == "__main__":
    run_tests()
