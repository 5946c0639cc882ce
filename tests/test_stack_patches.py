# Owner(s): ["module: nn"]
"""The upstream change as a stack of patches (patches/stack/, detgrid.kit.stack_patches): the
checked-in patches and bodies are what the tools write today, and applying them in order to a
fresh v2.6.0 tree gives patches/v2.6.0.patch's tree, the core's file byte for byte as the whole
stack (the core and its speed levels) has it."""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import stack, stack_patches, upstream_tree

KIT = Path(__file__).resolve().parents[1]
STACK = KIT / "patches" / "stack"
WHOLE = KIT / "patches" / "v2.6.0.patch"


def visible_words(text: str) -> int:
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<details>.*?</details>", "", text, flags=re.S)
    return len(re.findall(r"\w+", text))


def _diff_part(text: str) -> str:
    """The diffs of a format-patch, without its header and its trailer."""
    start = text.index("\ndiff --git")
    end = text.rfind("\n-- \n")
    diffs = text[start:end if end > start else len(text)]
    return "\n".join(line for line in diffs.splitlines() if not line.startswith("base-commit:"))


def _subject(text: str) -> str:
    """The Subject header, its folded continuation lines (a long subject's) joined."""
    m = re.search(r"^Subject: \[PATCH\] (.*(?:\n[ \t].*)*)$", text, re.M)
    return re.sub(r"\n[ \t]", " ", m.group(1))


def _files(text: str):
    return re.findall(r"^diff --git a/(\S+)", text, re.M)


def _tree_files(tree: Path):
    return {str(p.relative_to(tree)): p.read_bytes() for p in tree.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(tree).parts}


class TestCheckedInStack(TestCase):
    def test_the_stack_is_the_core_the_cudnn_route_then_the_speed_levels(self):
        self.assertEqual(stack.UPSTREAM_NAMES, ("core", "cudnn", "grouped-channels"))
        self.assertEqual([u.speed_level for u in stack.UPSTREAM_STACK], [False, False, True])
        on_disk = sorted(p.name for p in STACK.iterdir())
        self.assertEqual(on_disk, sorted(f"{u.patch}.{ext}" for u in stack.UPSTREAM_STACK
                                         for ext in ("md", "patch")))

    def test_bodies_are_what_the_tool_writes_today(self):
        with tempfile.TemporaryDirectory() as tmp:
            stack_patches.write_bodies(Path(tmp))
            for part in stack.UPSTREAM_STACK:
                name = f"{part.patch}.md"
                self.assertEqual((Path(tmp) / name).read_text(), (STACK / name).read_text(),
                                 f"patches/stack/{name} is stale; run: {stack_patches.REGENERATE}")

    def test_bodies_keep_to_250_visible_words(self):
        for part in stack.UPSTREAM_STACK:
            text = (STACK / f"{part.patch}.md").read_text()
            self.assertLessEqual(visible_words(text), 250, part.patch)
            self.assertTrue(text.startswith(f"# {part.title}\n"), part.patch)
            self.assertIn("**BC notes**", text, part.patch)

    def test_a_speed_levels_body_is_its_body_md(self):
        for part in stack.UPSTREAM_STACK:
            if part.speed_level:
                source = KIT / stack.LEVELS_ROOT / part.name / stack_patches.BODY_FILE
                self.assertEqual(stack_patches.body_source(part), source)
                self.assertEqual((STACK / f"{part.patch}.md").read_text(),
                                 f"# {part.title}\n\n{source.read_text()}")

    def test_bodies_carry_the_bc_notes(self):
        core, cudnn, level = ((STACK / f"{u.patch}.md").read_text() for u in stack.UPSTREAM_STACK)
        self.assertIn("`warn_only=True` takes the new path", core)
        self.assertIn("no longer alert", core)
        self.assertIn("rounded once", " ".join(core.split()))
        self.assertIn("the forward leaves cuDNN", " ".join(cudnn.split()))
        self.assertIn("bits can change", " ".join(cudnn.split()))

    def test_the_speed_levels_body_says_what_it_changes_costs_and_must_time(self):
        level = (STACK / f"{stack.UPSTREAM_STACK[2].patch}.md").read_text()
        words = " ".join(level.split())
        for term in ("`kChannelGroup = 4`", "record ids, weights and grad_output offsets",
                     "added in the same order", "grad_input keeps its bits",
                     "four accumulators", "runs x ceil(C/4) instead of runs x C",
                     "**Counters**", "Record visits", "**Cost**", "registers",
                     "**What a GPU run must time to accept it**",
                     "`detgrid bench`'s `core` and `grouped-channels` rows",
                     "at most 1, no row slower by more than 5%",
                     "bits equal to the previous patch's"):
            self.assertIn(term, words)
        self.assertNotIn("<!--", level)  # no placeholder left unfilled
        for word in ("likely", "host", "executor", "pipeline"):
            self.assertNotIn(word, level.lower())

    def test_patches_say_what_they_hold_in_the_words_of_the_review(self):
        for part in stack.UPSTREAM_STACK:
            text = (STACK / f"{part.patch}.patch").read_text()
            self.assertEqual(_subject(text), part.title)
            message = text[: text.index("\ndiff --git")]
            for word in ("stock", "level", "2.6.0", "v2.6"):
                self.assertNotIn(word, message.split("\n---\n")[0], part.patch)
        core, cudnn, level = ((STACK / f"{u.patch}.patch").read_text() for u in stack.UPSTREAM_STACK)
        self.assertEqual(sorted(_files(core)), sorted([
            "aten/src/ATen/native/cuda/GridSampler.cu", "aten/src/ATen/native/cuda/GridSampler.h",
            "aten/src/ATen/native/cuda/GridSamplerDeterministic.cu", "test/test_nn.py",
            "test/test_torch.py"]))
        self.assertEqual(sorted(_files(cudnn)), sorted([
            "aten/src/ATen/native/GridSampler.cpp", "aten/src/ATen/native/cudnn/GridSampler.cpp",
            "docs/source/notes/randomness.rst", "test/test_nn.py", "test/test_torch.py",
            "torch/__init__.py"]))
        core_message = " ".join(core[: core.index("\ndiff --git")].split())
        for term in ("2^19 records", "unique_by_key", "partials of 256 records", "rounded once",
                     "canUse32BitIndexMath", "64 MiB", "caching allocator", "FMA contraction",
                     "no longer alert"):
            self.assertIn(term, core_message)
        self.assertNotIn("cuDNN", core_message)
        # a speed level: the core's file alone, its message its own
        self.assertEqual(_files(level), ["aten/src/ATen/native/cuda/GridSamplerDeterministic.cu"])
        self.assertNotIn("new file mode", level)
        level_message = " ".join(level[: level.index("\ndiff --git")].split())
        for term in ("See #68959", "kChannelGroup = 4", "grad_input's bits do not change",
                     "runs x ceil(C/4)", "Test Plan: python test/test_nn.py -k"):
            self.assertIn(term, level_message)
        for term in ("Fixes #68959", "unique_by_key", "cuDNN", "Tests:"):
            self.assertNotIn(term, level_message)

    def test_patches_are_what_the_tool_writes_today_and_stack_to_the_whole_patch(self):
        # Asked when the test runs, not when it is collected: on a fresh machine test_patch
        # fetches the tree earlier in the same run, and this check must not be skipped there.
        if not upstream_tree.cached_tree().is_dir():
            self.skipTest("the v2.6.0 tree is not cached")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "stack"
            self.assertEqual(stack_patches.write_patches(out, "t", "t@t"), 0)
            for part in stack.UPSTREAM_STACK:
                name = f"{part.patch}.patch"
                self.assertEqual(_diff_part((out / name).read_text()),
                                 _diff_part((STACK / name).read_text()),
                                 f"patches/stack/{name} is stale; run: {stack_patches.REGENERATE}")
            stacked = upstream_tree.fresh_git_copy(Path(tmp) / "stacked")
            for part in stack.UPSTREAM_STACK:
                subprocess.run(["git", "apply", str(STACK / f"{part.patch}.patch")], cwd=stacked,
                               check=True)
            whole = upstream_tree.fresh_git_copy(Path(tmp) / "whole")
            subprocess.run(["git", "apply", str(WHOLE)], cwd=whole, check=True)
            got, want = _tree_files(stacked), _tree_files(whole)
            self.assertEqual(sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k)), [])
            for rel, text in stack.core_sources(KIT, stack.UPSTREAM_NAMES[-1]).items():
                self.assertEqual((stacked / rel).read_bytes(), text.encode("utf-8"), rel)
            # the patches before the speed levels give the core's file as the core has it
            before = upstream_tree.fresh_git_copy(Path(tmp) / "before")
            for part in stack.UPSTREAM_STACK:
                if not part.speed_level:
                    subprocess.run(["git", "apply", str(STACK / f"{part.patch}.patch")],
                                   cwd=before, check=True)
            for rel, text in stack.core_sources(KIT, stack.CORE).items():
                self.assertEqual((before / rel).read_bytes(), text.encode("utf-8"), rel)
            shutil.rmtree(before)
            shutil.rmtree(stacked)
            shutil.rmtree(whole)


if __name__ == "__main__":
    run_tests()
