# Owner(s): ["module: nn"]
"""detgrid.kit.textdiff, which stores a speed level of the upstream core as
its diff to the core's file, and detgrid.kit.stack.core_sources, which
applies the levels' diffs in order: a diff made from two texts takes the
first to the second, one that does not apply says where, and each level's
diff applies to today's core and changes nothing but the run sums."""

import difflib
import os
import re
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid import levels
from detgrid.kit import stack, textdiff

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_FILE = f"{stack.KERNEL_DIR}/GridSamplerDeterministic.cu"

OLD = "".join(f"line {i}\n" for i in range(1, 21))


def edited(text, changes):
    """text with line number -> replacement (None drops the line)."""
    lines = text.splitlines(keepends=True)
    for number in sorted(changes, reverse=True):
        if changes[number] is None:
            del lines[number - 1]
        else:
            lines[number - 1] = changes[number]
    return "".join(lines)


class TestTextDiff(TestCase):
    def test_make_then_apply_gives_the_new_text(self):
        cases = {
            "one line changed": edited(OLD, {10: "ten\n"}),
            "two hunks": edited(OLD, {2: "two\n", 18: "eighteen\nand more\n"}),
            "lines dropped": edited(OLD, {1: None, 20: None}),
            "lines added at both ends": "first\n" + OLD + "last\n",
            "unchanged": OLD,
            "no newline at the end": OLD + "tail",
            "everything removed": "",
        }
        for what, new in cases.items():
            with self.subTest(what):
                diff = textdiff.make(OLD, new, "file.txt")
                self.assertEqual(textdiff.apply(OLD, diff, "file.txt"), new)
        self.assertEqual(textdiff.make(OLD, OLD, "file.txt"), "")

    def test_the_diff_names_the_file(self):
        diff = textdiff.make(OLD, edited(OLD, {3: "three\n"}), "dir/file.txt")
        self.assertTrue(diff.startswith("--- a/dir/file.txt\n+++ b/dir/file.txt\n@@ "), diff)

    def test_a_diff_that_does_not_apply_names_the_line(self):
        diff = textdiff.make(OLD, edited(OLD, {10: "ten\n"}), "file.txt")
        # Line 10 itself (a removed line) no longer reads as the diff expects.
        with self.assertRaisesRegex(textdiff.DiffError,
                                    r"^level/file\.txt: the diff does not apply at line 10$"):
            textdiff.apply(edited(OLD, {10: "something else\n"}), diff, "level/file.txt")
        # A context line (three before the change) moved.
        with self.assertRaisesRegex(textdiff.DiffError,
                                    r"^f: the diff does not apply at line 7$"):
            textdiff.apply(edited(OLD, {7: "seven\n"}), diff, "f")
        # A text that ends before the hunk (at line 5; the hunk's first line is 7).
        with self.assertRaisesRegex(textdiff.DiffError, r"^f: the diff does not apply at line 7$"):
            textdiff.apply("".join(OLD.splitlines(keepends=True)[:5]), diff, "f")

    def test_a_diff_with_a_line_that_is_no_diff_line_is_refused(self):
        diff = textdiff.make(OLD, edited(OLD, {10: "ten\n"}), "file.txt")
        broken = diff.replace("+ten\n", "?ten\n")
        with self.assertRaisesRegex(textdiff.DiffError,
                                    r"^f: line \d+ of the diff is not a diff line$"):
            textdiff.apply(OLD, broken, "f")

    def test_a_new_file_is_a_diff_from_the_empty_text(self):
        new = "first\nsecond\nthird\n"
        diff = textdiff.make("", new, "new.cu")
        self.assertIn("@@ -0,0 +1,3 @@", diff)
        self.assertEqual(textdiff.apply("", diff, "new.cu"), new)
        # ... and it applies to nothing else.
        with self.assertRaises(textdiff.DiffError):
            textdiff.apply("already here\n", diff + "@@ -1,1 +1,1 @@\n-other\n+x\n", "new.cu")

    def test_folders_apply_in_order_and_may_add_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            first, second = Path(tmp) / "first", Path(tmp) / "second"
            first.mkdir()
            second.mkdir()
            (first / "a.cu.diff").write_text(textdiff.make("x\n", "y\n", "a.cu"))
            (second / "a.cu.diff").write_text(textdiff.make("y\n", "z\n", "a.cu"))
            (second / "b.cuh.diff").write_text(textdiff.make("", "new\n", "b.cuh"))
            texts = {"a.cu": "x\n"}
            self.assertEqual(textdiff.apply_folders(texts, [first, second]),
                             {"a.cu": "z\n", "b.cuh": "new\n"})
            self.assertEqual(texts, {"a.cu": "x\n"})  # the caller's dict is left alone
            with self.assertRaisesRegex(textdiff.DiffError, "^second/a.cu.diff: "):
                textdiff.apply_folders(texts, [second])

    def test_the_empty_diff_leaves_the_text(self):
        self.assertEqual(textdiff.apply(OLD, "", "f"), OLD)


# The run sums of the core's file: SortedChunk (what they read of a sorted
# chunk), the stored partials' and the run sums' kernels, and their launches
# in sum_grad_input.
def run_sum_regions(text):
    """[(first, last)] line indices (0-based, inclusive) of the run sums in text."""
    lines = text.splitlines()

    def index(pattern, start=0):
        for i in range(start, len(lines)):
            if re.search(pattern, lines[i]):
                return i
        raise AssertionError(f"no line matches {pattern!r}")

    struct = index(r"^struct SortedChunk \{$")
    first = struct
    while first > 0 and lines[first - 1].strip():  # its comment and template line
        first -= 1
    last = index(r"^\}$", index(r"__global__ void sum_runs_kernel\("))
    launch_first = index(r"^\s*sorted\.slots = ceil_div\(count, kPartialRecords\);$")
    launch_last = index(r"sorted, sums, grad_input\.mutable_data_ptr<scalar_t>\(\)\);",
                        launch_first)
    return [(first, last), (launch_first + 1, launch_last)]


def without_run_sums(text):
    lines = text.splitlines(keepends=True)
    for first, last in sorted(run_sum_regions(text), reverse=True):
        del lines[first:last + 1]
    return lines


def changes_outside_run_sums(core, level):
    """The lines level changes outside the run sums, but for what a level of
    the run sums may add there: kChannelGroup with its comment, and the
    launches' count of channel groups (removed lines as '- ...')."""
    wrong = []
    for line in difflib.ndiff(without_run_sums(core), without_run_sums(level)):
        tag, text = line[:2], line[2:].strip()
        if tag == "- " or (tag == "+ " and not (
                text == "" or text.startswith("//") or "kChannelGroup" in text
                or "channel_groups" in text)):
            wrong.append(tag + text)
    return wrong


class TestCoreSources(TestCase):
    def test_the_core_is_the_file_as_it_is(self):
        sources = stack.core_sources(ROOT)
        with open(os.path.join(ROOT, stack.UPSTREAM_ROOT, CORE_FILE), encoding="utf-8") as f:
            self.assertEqual(sources, {CORE_FILE: f.read()})

    def test_each_level_applies_to_todays_core(self):
        for level in levels.CORE_BUILDS[1:]:
            with self.subTest(level=level):
                sources = stack.core_sources(ROOT, upto=level)
                self.assertEqual(list(sources), [CORE_FILE])
                self.assertNotEqual(sources[CORE_FILE], stack.core_sources(ROOT)[CORE_FILE])

    def test_every_speed_level_has_its_diff(self):
        for part in levels.UPSTREAM_STACK:
            folder = os.path.join(ROOT, stack.LEVELS_ROOT, part.name)
            with self.subTest(part=part.name):
                self.assertEqual(os.path.isdir(folder), part.speed_level)
                if part.speed_level:
                    self.assertTrue(sorted(os.listdir(folder)))

    def test_a_prefix_without_a_speed_level_is_the_core(self):
        for part in levels.UPSTREAM_STACK:
            if part.speed_level:
                break
            self.assertEqual(stack.core_sources(ROOT, upto=part.name), stack.core_sources(ROOT))

    def test_grouped_channels_changes_only_the_run_sums(self):
        # Outside the run sums (SortedChunk, the stored partials' and the run
        # sums' kernels, their launches) the level only adds: kChannelGroup
        # with its comment, and the launches' count of channel groups. The
        # records kernels, the sort and unique_by_key are the core's.
        core = stack.core_sources(ROOT)[CORE_FILE]
        level = stack.core_sources(ROOT, upto="grouped-channels")[CORE_FILE]
        self.assertEqual(changes_outside_run_sums(core, level), [])
        self.assertNotEqual(without_run_sums(core), without_run_sums(level))  # it adds some
        # The check sees a change to the records kernels or the sort.
        for old, new in (("within_bounds_3d(tz, ty, tx, inp_D, inp_H, inp_W)",
                          "within_bounds_3d(tz, tx, ty, inp_D, inp_H, inp_W)"),
                         ("/*descending=*/false", "/*descending=*/true")):
            self.assertIn(old, level)
            self.assertTrue(changes_outside_run_sums(core, level.replace(old, new)), new)
        # The run sums themselves did change, and each region is found in both.
        for text in (core, level):
            self.assertEqual(len(run_sum_regions(text)), 2)
        self.assertNotEqual(core.splitlines()[slice(*run_sum_regions(core)[0])],
                            level.splitlines()[slice(*run_sum_regions(level)[0])])

    def test_an_unknown_patch_is_refused_in_one_line(self):
        with self.assertRaisesRegex(stack.StackError, r"^unknown patch 'no-such-level'; "
                                    r"the stack is core, "):
            stack.core_sources(ROOT, upto="no-such-level")

    def test_a_diff_that_no_longer_applies_names_the_level(self):
        # The level's diff against a core whose run sums moved on.
        core = stack.core_sources(ROOT)[CORE_FILE]
        name = "GridSamplerDeterministic.cu"
        with open(os.path.join(ROOT, stack.LEVELS_ROOT, "grouped-channels", name + ".diff"),
                  encoding="utf-8") as f:
            diff = f.read()
        moved = core.replace("constexpr int64_t kMaxRunSumBlocks = 4096;",
                             "constexpr int64_t kMaxRunSumBlocks = 8192;")
        self.assertNotEqual(moved, core)
        with self.assertRaisesRegex(textdiff.DiffError,
                                    r"^grouped-channels/GridSamplerDeterministic\.cu\.diff: "
                                    r"the diff does not apply at line \d+$"):
            textdiff.apply(moved, diff, f"grouped-channels/{name}.diff")


if __name__ == "__main__":
    run_tests()
