# Owner(s): ["module: nn"]
"""The pipeline's levels (detgrid.kit.stack, aten_kernels/pipeline/): the markers cut the
sources into levels, and every level compiles on its own and gives the pipeline's golden bits.
(The upstream stack's patches: tests/test_stack_patches.py.)"""

import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid.bench import workloads
from detgrid.kit import stack
from golden import corpus

KIT = Path(__file__).resolve().parents[1]
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
      template <typename Term>
      void inclusive_sum(int32_t, const Term& t, int32_t*) const { (void)t(0); }
      c10::DataPtr allocate(int64_t) const { return {}; }
      void zero(void*, int64_t) const {}
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
        self.assertEqual(stack.cut(text, "pipeline"), "a\nc\n")
        self.assertEqual(stack.cut(text, "index32"), "a\nc\n")
        self.assertEqual(stack.cut(text, "dense"), "a\nb\nc\n")

    def test_a_replaced_line_reads_its_older_code_before_its_level(self):
        text = "  x = wide(); // [stack: index32 replaces: x = narrow();]\n"
        self.assertEqual(stack.cut(text, "pipeline"), "  x = narrow();\n")
        self.assertEqual(stack.cut(text, "index32"), "  x = wide();\n")

    def test_a_dropped_block_between_blank_lines_leaves_one(self):
        text = "a\n\n// [stack: cells]\nb\n// [end stack: cells]\n\nc\n"
        self.assertEqual(stack.cut(text, "dense"), "a\n\nc\n")

    def test_bad_markers_are_refused_with_their_line(self):
        for text, why in (("// [stack: nope]\n// [end stack: nope]\n", "no level 'nope'"),
                          ("// [stack: dense]\n", "never closed"),
                          ("// [end stack: dense]\n", "closes nothing"),
                          ("x; // [stack: pipeline]\n", "no level 'pipeline'"),
                          ("x; // [stack: dense] and more\n", "must end its line")):
            with self.assertRaisesRegex(stack.StackError, why):
                stack.cut(text, "pipeline", where="f.cuh")

    def test_the_whole_stack_is_the_sources_without_their_markers(self):
        source = KIT / stack.PIPELINE_ROOT / stack.KERNEL_DIR
        for rel, text in stack.kernel_sources(KIT).items():
            original = (source / Path(rel).name).read_text()
            self.assertEqual(
                text.splitlines(),
                [re.sub(r"\s*// \[stack: [\w-]+(?: replaces: .*)?\]$", "", line)
                 for line in original.splitlines() if not re.match(r"\s*// \[(end )?stack:", line)],
                rel)

    def test_each_level_adds_its_files_and_the_first_levels_file_set_is_fixed(self):
        self.assertEqual(stack.kernel_files("pipeline"), stack.KERNEL_CORE_FILES)
        on_disk = sorted(p.name for p in (KIT / stack.PIPELINE_ROOT / stack.KERNEL_DIR).iterdir())
        self.assertEqual(sorted(stack.kernel_files()), on_disk)

    def test_every_level_keeps_to_pytorchs_80_columns(self):
        # PyTorch's clang-format wraps at 80: a level whose cut runs past it fails upstream's lint
        long_lines = [f"{level}: {rel}: {line.strip()}"
                      for level in stack.LEVEL_NAMES
                      for rel, text in stack.kernel_sources(KIT, level).items()
                      for line in text.splitlines() if len(line) > 80]
        self.assertEqual(long_lines, [])

    def test_no_level_file_is_named_in_a_lower_level(self):
        for level in stack.LEVEL_NAMES:
            text = "".join(stack.kernel_sources(KIT, level).values())
            later = [f for f in stack.kernel_files() if f not in stack.kernel_files(level)]
            self.assertEqual([f for f in later if f in text], [], level)

    def test_no_level_speaks_of_a_later_one(self):
        # A patch of the stack is read alone: neither its code nor its comments may name
        # what only a later level brings (its prose words, types and constants).
        names = stack.LEVEL_NAMES
        self.assertEqual(sorted(LATER_WORDS), sorted(names[1:]))
        cuts = {level: stack.kernel_sources(KIT, level) for level in names}
        offences = []
        for i, level in enumerate(names[1:], 1):
            words = [re.compile(w, re.I) for w in LATER_WORDS[level]]
            earlier = stack.kernel_files(names[i - 1])
            words += [re.compile(rf"\b{name}\b")
                      for name in sorted(set(declared_names(cuts[level], stack.LEVELS[i].files))
                                         - set(declared_names(cuts[level], earlier)))]
            for lower in names[:i]:
                for rel, text in cuts[lower].items():
                    offences += [f"{lower}: {Path(rel).name}:{number} speaks of {level}: "
                                 f"{line.strip()}"
                                 for number, line in enumerate(text.splitlines(), 1)
                                 if any(w.search(line) for w in words)]
        self.assertFalse(offences, "\n".join(offences))


# What only a level brings, in words a lower level's code or comments would use.
LATER_WORDS = {
    "index32": [r"index_32bit", r"key_32bit", r"has_32bit_index_math", r"fits_32bit_indexing",
                r"keys_fit_32bit", r"32-bit (keys|index|indices)"],
    "dense": [r"\bdense", r"segment table", r"segment_table"],
    "cells": [r"PerCell", r"keying", r"per-cell", r"\bcell keys?\b", r"num_cells"],
    "channels-fastest": [r"channels[ _-]fastest", r"channels-last", r"copy_grad_output"],
    "hot-fold": [r"\bhot\b", r"hot_"],
    "channel-groups": [r"channel[ _]groups?\b", r"group_width"],
    "fused-fills": [r"\bfused", r"\bfuse_"],
}


def declared_names(sources, files):
    """The namespace-level types and the k-constants declared in a level's own files."""
    found = set()
    for rel, text in sources.items():
        if Path(rel).name in files:
            found.update(re.findall(r"^(?:struct|class|enum class)\s+([A-Z]\w+)", text, re.M))
            found.update(re.findall(r"constexpr\s+[\w:]+\s+(k[A-Z]\w+)\s*=", text))
    return sorted(found)


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


# The first level's files alone, run on the host with a serial executor of their own, so
# nothing of the extension or of a later level is compiled in. They must give the golden bits,
# and plan the chunks that level="pipeline" plans.
CORE_UNIT = textwrap.dedent("""\
    #include <ATen/ATen.h>
    #include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>
    #include <c10/core/CPUAllocator.h>
    #include <algorithm>
    #include <cstring>
    #include <numeric>
    #include <tuple>
    #include <vector>
    namespace gsd = at::native::grid_sampler_deterministic;
    template <typename Stage> struct IsPointPass : std::false_type {};
    template <int kTaps, typename Args>
    struct IsPointPass<gsd::PointPass<kTaps, Args>> : std::true_type {};
    struct SerialExecutor {
      int64_t* chunks;  // every chunk begins with its point pass
      template <typename count_t, typename Stage>
      void for_each(count_t count, const Stage& stage) const {
        if constexpr (IsPointPass<Stage>::value) ++*chunks;
        for (count_t i = 0; i < count; ++i) stage(i);
      }
      template <typename row_t, typename col_t, typename Stage>
      void for_each_row(row_t rows, col_t cols, const Stage& stage) const {
        for (row_t r = 0; r < rows; ++r) {
          const auto row = stage.row(r);
          for (col_t c = 0; c < cols; ++c) stage(row, c);
        }
      }
      template <typename key_t>
      void stable_sort_pairs(const key_t* keys_in, key_t* keys_out, const int32_t* values_in,
                             int32_t* values_out, int32_t count, int) const {
        std::vector<int32_t> order(count);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return keys_in[a] < keys_in[b]; });
        for (int32_t i = 0; i < count; ++i) {
          keys_out[i] = keys_in[order[i]];
          values_out[i] = values_in[order[i]];
        }
      }
      template <typename Term>
      void inclusive_sum(int32_t count, const Term& term, int32_t* out) const {
        for (int32_t i = 0, sum = 0; i < count; ++i) {
          out[i] = sum += term(i);
        }
      }
      c10::DataPtr allocate(int64_t bytes) const { return c10::GetCPUAllocator()->allocate(bytes); }
      void zero(void* data, int64_t bytes) const { std::memset(data, 0, bytes); }
    };
    std::tuple<at::Tensor, int64_t> core_backward(
        const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& grid,
        int64_t interpolation_mode, int64_t padding_mode, bool align_corners) {
      const at::Tensor grad_input = at::empty(input.sizes(), input.options());
      const at::native::GridSamplerBackwardCall call{
          grad_input, grad_output, input, grid, interpolation_mode, padding_mode, align_corners};
      int64_t chunks = 0;
      gsd::run_deterministic_backward(
          SerialExecutor{&chunks}, call, gsd::plan_backward(gsd::describe_backward(call)));
      return {grad_input, chunks};
    }
    """)


class TestTheFirstLevelAloneRunsOnTheHost(TestCase):
    @classmethod
    def setUpClass(cls):
        from torch.utils import cpp_extension

        cls.tmp = tempfile.mkdtemp(prefix="detgrid-core-")
        for rel, text in stack.kernel_sources(KIT, "pipeline").items():
            path = Path(cls.tmp) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        cls.core = cpp_extension.load_inline(
            name="detgrid_core_alone", cpp_sources=[CORE_UNIT], functions=["core_backward"],
            extra_include_paths=[str(Path(cls.tmp) / "aten/src")],
            extra_cflags=["-std=c++20", "-O1"], build_directory=cls.tmp, verbose=False)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_grad_input_has_the_golden_bits_and_level_pipeline_plans_its_chunks(self):
        wrong, chunks_differ = [], []
        for case in corpus.CASES:
            if not case.output_mask[0]:
                continue
            grad_output, inp, grid = corpus.make_inputs(case)
            grad_input, chunks = self.core.core_backward(
                grad_output, inp, grid, corpus.MODES[case.mode], corpus.PADDINGS[case.padding],
                case.align_corners)
            if corpus.tensor_digest(grad_input) != GOLDEN[case.name]["grad_input"]:
                wrong.append(case.name)
            counted = ops.work_counters(grad_output, inp, grid, corpus.MODES[case.mode],
                                        corpus.PADDINGS[case.padding], case.align_corners,
                                        [True, False], level="pipeline")
            if grad_input.numel() and counted["chunks"] != chunks:
                chunks_differ.append((case.name, chunks, counted["chunks"]))
        self.assertEqual(wrong, [])
        self.assertEqual(chunks_differ, [])


class TestLevelsRunTheirPrefix(TestCase):
    def counters(self, level):
        workload = workloads.BENCH_WORKLOADS["rtdetr_l80"]
        return workloads.full_size_work_counters(workload, "ordered", level=level)

    def test_the_first_level_sorts_64_bit_keys_per_tap_and_reduces_sparsely(self):
        core, top = self.counters("pipeline"), self.counters(stack.TOP)
        self.assertEqual(core["elements_swept"], 0)
        self.assertEqual(core["key_bytes"], 8)
        self.assertEqual(core["items_sorted"], core["records"])
        self.assertEqual(top["items_sorted"] * 4, core["items_sorted"])

    def test_the_whole_stack_is_the_default(self):
        workload = workloads.BENCH_WORKLOADS["rtdetr_l80"]
        self.assertEqual(self.counters(stack.TOP), workloads.full_size_work_counters(workload))


if __name__ == "__main__":
    run_tests()
