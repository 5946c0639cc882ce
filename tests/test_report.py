# Owner(s): ["module: nn"]
"""Tests of `detgrid report`: the evidence it gathers (from stubbed runs, so each outcome can be
forced), the ISSUE.md / PR.md / COMMENT_196856.md it renders from it (shape, length, claims, AI
disclosure, draft marking), its bad arguments, and that the committed top-level bodies are the
current output on this set-up."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid.kit import cli
from detgrid.kit import report as R

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_MAIN = Path(__file__).resolve().parent / "fixtures" / "upstream_main"
ENV = {"torch": "9.9.9+test", "python": "3.11.0", "cuda_available": False, "device_name": None,
       "cpu_capability": "DEFAULT", "machine": "x86_64"}
PLACEHOLDERS = re.compile(r"\bTODO\b|\bTBD\b|\bFIXME\b|\bXXX\b|<fill|lorem ipsum|\?\?\?", re.I)
SPECULATION = re.compile(r"\blikely\b|\bprobably\b|\bpresumably\b|\bshould be on main\b", re.I)
IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}
# A maintainer asked for a comment of a few lines, a PR body fix_issue.md does not call spam and
# a comment on #196856 of a few lines (issue 59, section 5).
ISSUE_WORDS, PR_WORDS, COMMENT_WORDS = 150, 400, 300
LIMITS = {"ISSUE.md": ISSUE_WORDS, "PR.md": PR_WORDS, "COMMENT_196856.md": COMMENT_WORDS}
# The rows of the comment's side-by-side of #196856 and the core (issue 59, section 5.3)
SIDE_BY_SIDE_ROWS = ("New code", "Records per chunk", "Sort key + id", "Partials", "Buffers",
                     "Half sums across chunks", "grad_grid")
# The core's entry, as the machine-code count writes it (benchmarks/machine_code.json's "core")
MACHINE_CODE = {"arch": "sm_90", "kernels": 192, "text_bytes": 4404019}
CORE_SOURCE = Path("aten_kernels/aten/src/ATen/native/cuda/GridSamplerDeterministic.cu")

SYNTHETIC_PATCH = """\
From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001
From: A Person <a.person@example.com>
Date: Tue, 1 Dec 2026 09:00:00 +0000
Subject: [PATCH] synthetic

---
diff --git a/a/old.cpp b/a/old.cpp
--- a/a/old.cpp
+++ b/a/old.cpp
@@ -1,4 +1,5 @@
 keep
--- a removed line that looks like a header
+++ an added line that looks like a header
+another added line
 keep
 keep
diff --git a/b/new.h b/b/new.h
new file mode 100644
--- /dev/null
+++ b/b/new.h
@@ -0,0 +1,2 @@
+#pragma once
+int f();
\\ No newline at end of file

base-commit: 0123456789abcdef0123456789abcdef01234567
--\x20
2.39.2
"""


def claims_json(script, statuses, exit_code):
    return json.dumps({"script": script, "device": "cpu", "claims": [
        {"claim": f"{script} claim {i}", "status": s, "detail": f"detail {i}"}
        for i, s in enumerate(statuses)], "exit_code": exit_code}, indent=2) + "\n"


class StubRunner:
    """Stands in for subprocess: the repro scripts' outputs and exit codes, by script name."""

    def __init__(self, outcomes):
        self.outcomes = outcomes
        self.commands = []

    def __call__(self, cmd, cwd):
        self.commands.append(list(cmd))
        if cmd[1:3] == ["-m", "torch.utils.collect_env"]:
            return 0, "FAKE collect_env output\nPyTorch version: 9.9.9+test\n", ""
        return self.outcomes[os.path.basename(cmd[1])]


DEFAULT_OUTCOMES = {
    "show_error.py": (77, claims_json("show_error", ["not checkable here"] * 2, 77), ""),
    "show_nondeterminism.py": (0, claims_json("show_nondeterminism", ["not checkable here", "pass"], 0), ""),
    "show_fix.py": (0, claims_json("show_fix", ["pass", "pass"], 0), ""),
}
GPU_ROW = {"row": 1, "name": "zoom", "status": "measured", "stock_route": "native",
           "variants": {"native": {"median_ms": 2.0}, "detgrid": {"median_ms": 1.0}},
           "ratio": 0.5, "extra_peak_mib": 3.0, "max_rel_diff": 1e-7, "correct": True}


def make_kit(tmp, patch_text=SYNTHETIC_PATCH):
    kit = Path(tmp) / "kit"
    (kit / "patches").mkdir(parents=True)
    (kit / "patches" / "v9.1.0.patch").write_text(patch_text)
    return kit


def stub_report(tmp, outcomes=None, **kwargs):
    runner = StubRunner({**DEFAULT_OUTCOMES, **(outcomes or {})})
    return R.gather(kit_root=make_kit(tmp), runner=runner, env=dict(ENV), **kwargs), runner


def bodies(report):
    return {"ISSUE.md": R.render_issue(report), "PR.md": R.render_pr(report),
            "COMMENT_196856.md": R.render_comment_196856(report)}


def agent(text):
    """The generated part of a body, quote markers removed."""
    quoted = text[text.index("### Agent report"):]
    return "\n".join(re.sub(r"^> ?", "", line) for line in quoted.splitlines())


def section(text, heading):
    """The text under a Markdown heading (quote markers removed) up to the next heading."""
    plain = "\n".join(re.sub(r"^> ?", "", line) for line in text.splitlines())
    m = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", plain, re.M | re.S)
    return m.group(1).strip() if m else None


def in_view(text):
    """What a reader sees without opening the collapsed appendix."""
    return re.sub(r"<details>.*?</details>", "", re.sub(r"<!--.*?-->", "", text, flags=re.S), flags=re.S)


def words_in_view(text):
    """The limits' measure as the issue states it: word-character runs once HTML comments and
    <details> blocks are removed (written here independently of R.visible_words)."""
    return len(re.findall(r"\w+", in_view(text)))


def side_by_side(text):
    """The rows of the tables in view: {row label: (#196856's, the core's)}."""
    rows = {}
    for line in agent(in_view(text)).splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and not all(c and set(c) <= set("-") for c in cells):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def kit_with_machine_code(tmp, record, core_lines=None):
    """A kit whose benchmarks/machine_code.json holds ``record`` and, with ``core_lines``, whose
    core source has that many lines."""
    kit = make_kit(tmp)
    (kit / "benchmarks").mkdir()
    (kit / "benchmarks" / "machine_code.json").write_text(json.dumps(record))
    if core_lines is not None:
        (kit / CORE_SOURCE).parent.mkdir(parents=True)
        (kit / CORE_SOURCE).write_text("// line\n" * core_lines)
    return kit


class TestReportBodies(TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def notes_file(self, text="I reviewed the kernel and ran the GPU check myself."):
        path = Path(self.tmp) / "notes.md"
        path.write_text(text)
        return str(path)

    def evidence_variants(self):
        """Reports the bodies must stay short for: the default, and one with everything present."""
        yield stub_report(self.tmp + "/a")[0]
        junit = Path(self.tmp) / "junit.xml"
        junit.write_text('<testsuite tests="10" failures="1" errors="0" skipped="2" time="3.5"/>')
        full = stub_report(self.tmp + "/b", {"show_fix.py": (1, claims_json("show_fix", ["fail"] * 3, 1), "")},
                           junit=str(junit), notes=self.notes_file())[0]
        full.bench = R.BenchResults("benchmarks/results/h200.json", "benchmarks/results/h200.png", {
            "device": "cuda:0", "device_name": "NVIDIA H200", "torch": "2.11.0", "workloads": [GPU_ROW] * 18,
            "summary": {"geomean": 0.9, "worst": 1.4}})
        full.environment = {**ENV, "cuda_available": True, "device_name": "NVIDIA H200"}
        full.machine_code = R.MachineCode("benchmarks/machine_code.json", **MACHINE_CODE)
        full.checkout = R.Checkout("/home/someone/src/pytorch", "v2.11.0+g0123456789ab", "version.txt 2.11.0a0",
                                   "applies: 5 files (" + ", ".join(["aten/src/ATen/native/cuda/x.cu"] * 5) + ")",
                                   True, ["test/test_nn.py: test_grid_sample_dispatch expects a CUDA kernel named "
                                          "'make_records', which this kernel lacks: kept as written, it will fail "
                                          "until adapted"], [])
        yield full

    def test_the_pr_names_each_speed_step_that_follows_the_core(self):
        steps = [p for p in R.UPSTREAM_STACK if p.speed_level]
        self.assertTrue(steps)
        approach = R.render_approach(stub_report(self.tmp + "/a")[0])
        for step in steps:
            self.assertIn(f"`{step.patch}`", approach)
        with mock.patch.object(R, "UPSTREAM_STACK", tuple(p for p in R.UPSTREAM_STACK
                                                          if not p.speed_level)):
            self.assertNotIn("Speed steps", R.render_approach(stub_report(self.tmp + "/b")[0]))

    def test_bodies_stay_within_their_word_limits(self):
        self.assertEqual(R.WORD_LIMITS, LIMITS)
        self.assertEqual(set(R.BODIES), set(LIMITS))
        for report in self.evidence_variants():
            for name, text in bodies(report).items():
                self.assertLessEqual(words_in_view(text), R.WORD_LIMITS[name], name)
                self.assertEqual(R.visible_words(text), words_in_view(text), name)

    def test_word_count_leaves_out_collapsed_details_and_comments(self):
        self.assertEqual(R.visible_words("> one two\n<!-- three -->\n<details>four five</details>\n| six |"), 3)
        self.assertEqual(R.visible_words("<details open><summary>a b</summary>\n\nc\n</details> d"), 1)
        # code counts by its runs of word characters, a fence's language name included
        self.assertEqual(R.visible_words("**Bold.** `x.y(1)` - >\n```sh\nrun it\n```"), 7)

    def test_run_reports_each_body_against_its_limit(self):
        self.assertEqual(R.render_length("ISSUE.md", "a b"), "2 words in view, limit 150")
        self.assertIn("OVER THE LIMIT", R.render_length("ISSUE.md", "word " * 151))

    def test_pr_problem_is_one_paragraph(self):
        problem = section(R.render_pr(stub_report(self.tmp)[0]), "Problem")
        self.assertTrue(problem)
        self.assertNotIn("\n\n", problem)
        self.assertIn("raises when grad_input is requested", problem)
        self.assertIn("`atomicAdd`", problem)

    def test_no_speculation_in_any_body(self):
        for report in self.evidence_variants():
            for name, text in bodies(report).items():
                self.assertIsNone(SPECULATION.search(text), name)
                self.assertIsNone(PLACEHOLDERS.search(text), name)

    def test_196856_is_cited_only_as_its_thread_states_it(self):
        issue, pr, comment = bodies(stub_report(self.tmp)[0]).values()
        self.assertIn("#196856 (open on 2026-12-07) also sorts", in_view(issue))
        for name, text in (("ISSUE.md", issue), ("PR.md", pr)):
            for unsupported in ("GB300", "2.00x", "2046ae1a", "on main"):
                self.assertNotIn(unsupported, text, name)
        # the comment cites its description's benchmarks, never their numbers
        for unsupported in ("2.00x", "1.07x", "2046ae1a", "on main"):
            self.assertNotIn(unsupported, comment)
        self.assertIn("Your description (read 2026-12-07) makes the path opt-in: atomics and cuDNN "
                      "stay the default, the cuDNN backward hands over in deterministic mode, with "
                      "GB300 benchmarks.", agent(comment))
        self.assertIn("The table reads older code (2026-12-05), which took the path for every "
                      "call with grad_input, deterministic or not.", agent(comment))

    def test_pr_links_196856_in_one_sentence_and_leaves_the_side_by_side_to_the_comment(self):
        pr = R.render_pr(stub_report(self.tmp)[0])
        sentences = [x for x in re.split(r"(?<=[.:;])\s+", agent(in_view(pr))) if "196856" in x]
        self.assertEqual(sentences, ["#196856 also sorts;"])
        self.assertIn("#196856 also sorts; a comment there compares both.", section(pr, "Problem"))
        self.assertEqual(side_by_side(pr), {})
        self.assertNotIn("196856", pr[pr.index("<details>"):])

    def test_comment_sets_the_core_beside_196856_row_by_row(self):
        comment = R.render_comment_196856(stub_report(self.tmp)[0])
        rows = side_by_side(comment)
        self.assertEqual(tuple(r for r in rows if r), SIDE_BY_SIDE_ROWS)
        self.assertEqual(rows[""], ("#196856, stored", "this kit's core"))
        for what, (theirs, ours) in rows.items():
            self.assertTrue(ours and theirs, what)
        self.assertEqual(rows["Records per chunk"], ("≤ 2^20", "≤ 2^19"))
        self.assertEqual(rows["Sort key + id"][0], "int64 + int64")
        self.assertIn("int32 where `canUse32BitIndexMath`", rows["Sort key + id"][1])
        self.assertEqual(rows["Half sums across chunks"],
                         ("rounded into grad_input per chunk", "float scratch, rounded once"))
        self.assertIn("filled in deterministic mode", rows["Buffers"][0])
        self.assertIn("caching allocator, unfilled", rows["Buffers"][1])
        self.assertIn("64 MiB", rows["Partials"][0])
        self.assertIn("the existing kernel", rows["grad_grid"][1])
        self.assertTrue(rows["New code"][0].startswith("374 lines; 20 kernels"))
        # design facts only: no speed claim either way
        table = "\n".join(line for line in agent(in_view(comment)).splitlines() if line.startswith("|"))
        self.assertIsNone(re.search(r"(?i)faster|slower|speed|\d+(\.\d+)?x\b|\bms\b|time", table), table)
        self.assertIn("by design (neither was timed).", agent(in_view(comment)))
        # where each column comes from, and that neither was timed, is in the collapsed part
        details = comment[comment.index("<details>"):]
        self.assertIn("read 2026-12-05", details)
        self.assertIn("Neither implementation has been timed against the other.", details)

    def test_comment_size_row_comes_from_the_source_and_the_count(self):
        report = stub_report(self.tmp)[0]
        self.assertIsNone(report.core_lines)
        self.assertEqual(side_by_side(R.render_comment_196856(report))["New code"][1], "-")
        kit = kit_with_machine_code(self.tmp + "/2", {"core": {**MACHINE_CODE, "lines": 7}}, core_lines=7)
        report = R.gather(kit_root=kit, runner=StubRunner(DEFAULT_OUTCOMES), env=dict(ENV))
        self.assertEqual(report.core_lines, 7)
        self.assertEqual(side_by_side(R.render_comment_196856(report))["New code"][1],
                         "7 lines; 192 kernels, 4.20 MiB of `.text`")

    def test_comment_offers_the_tests_as_a_conformance_suite(self):
        text = agent(in_view(R.render_comment_196856(stub_report(self.tmp)[0])))
        offer = re.search(r"\*\*Tests\.\*\* (.*)", text).group(1)
        for part in ("`detgrid patch --tests-only`", "`patches/v2.6.0-tests.patch`",
                     "conformance suite", "`@onlyCUDA`, not yet run on a GPU"):
            self.assertIn(part, offer)

    def test_comment_gives_each_delta_with_its_evidence(self):
        text = agent(in_view(R.render_comment_196856(stub_report(self.tmp)[0])))
        deltas = text[text.index("**Deltas to consider:**"):].split("\n\n")[1].splitlines()
        self.assertEqual(len(deltas), 4, deltas)
        grid_only, half, keys, workspace = deltas
        self.assertIn("`output_mask[0]` false", grid_only)
        self.assertIn("in deterministic mode: the existing kernel, no sort, no alert", grid_only)
        self.assertIn("`test_grid_sample_backward_deterministic_grid_only`", grid_only)
        self.assertIn("rounded once", half)
        self.assertIn("`test_sums_over_several_chunks_match_the_float64_sum`", half)
        self.assertIn("32-bit keys where they fit: 8 bytes per sorted item, not 16", keys)
        self.assertIn("Caching-allocator workspace, bounded and unfilled", workspace)
        self.assertIn("deterministic mode fills `at::empty`", workspace)
        self.assertIn("`test_workspace_stays_within_64_mib`", workspace)

    def test_no_body_cites_the_cpu_segfault_issue(self):
        # #24823 is a CPU-kernel bug; citing it on a CUDA change misleads the reader
        for report in self.evidence_variants():
            for name, text in bodies(report).items():
                self.assertNotIn("24823", text, name)

    def test_installed_docstring_is_read_not_assumed(self):
        issue = R.render_issue(stub_report(self.tmp)[0])
        self.assertRegex(issue, r"The installed torch 9\.9\.9\+test's `use_deterministic_algorithms` docstring "
                         r"lists CUDA grid_sample (under \*throw\*|as deterministic|in neither list) \(read by this report\)")

    def test_issue_carries_what_fails_a_repro_the_expected_behaviour_and_the_proposal(self):
        for report in self.evidence_variants():
            issue = R.render_issue(report)
            agent = in_view(issue[issue.index("### Agent report"):])
            labels = ["**What fails.**", "**Repro.**", "**Expected.**", "**Proposal.**", "**Status.**",
                      "**Question.**"]
            self.assertEqual([agent.index(label) for label in labels], sorted(agent.index(label) for label in labels))
            self.assertNotIn("###", agent[len("### Agent report"):])
            self.assertEqual(agent.count("?"), 1)
            self.assertIn("should this kit's tests join it?", agent)
            self.assertIn("> ```python\n> " + R.REPRO.replace("\n", "\n> ") + "\n> ```", issue)
            self.assertIn("No error; the same grad_input bits on every run.", agent)
            proposal = re.search(r"\*\*Proposal\.\*\* (.*)", agent).group(1)
            for point in ("Sort", "by destination", "no float atomics", "bitwise reproducible",
                          "only grad_grid keep today's kernel"):
                self.assertIn(point, proposal)
            self.assertEqual(proposal.count(". "), 0, "the proposal is one sentence")

    def test_issue_repro_runs_where_the_backward_is_deterministic(self):
        # on CPU the same code must run without error (stock's CPU backward never alerts): the
        # repro is valid code, and on CUDA only the alert stops it
        import torch

        before = (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled())
        self.addCleanup(torch.use_deterministic_algorithms, before[0], warn_only=before[1])
        self.assertEqual(R.REPRO.count('device="cuda"'), 1)
        exec(compile(R.REPRO.replace('device="cuda"', 'device="cpu"'), "REPRO", "exec"), {})

    def test_issue_shows_the_repro_and_collapses_the_evidence(self):
        issue = R.render_issue(stub_report(self.tmp)[0])
        self.assertEqual(issue.count("<details>"), 1)
        details = issue[issue.index("<details>") :]
        self.assertIn("> RuntimeError: " + R.ALERT_TEXT, details)
        self.assertIn("show_fix claim 0", details)
        self.assertIn(".sum().backward()", in_view(issue))
        self.assertNotIn("You can turn off determinism", in_view(issue))

    def test_pr_has_the_template_checklist(self):
        checklist = section(R.render_pr(stub_report(self.tmp)[0]), "Checklist")
        # the template's lint box, and the docs this change edits
        for item in ("`lintrunner -a`", "docs"):
            self.assertRegex(checklist, rf"- \[[ x]\] {re.escape(item)}")
        self.assertIn("- [ ] `lintrunner -a` (not run)", checklist)

    def test_every_body_holds_generated_text_in_a_quote_after_human_notes(self):
        for report in self.evidence_variants():
            for name, text in bodies(report).items():
                human = text.index("### Human notes")
                agent = text.index("### Agent report")
                self.assertLess(human, agent, name)
                quoted = text[agent:].splitlines()[2:]
                self.assertTrue(quoted and all(line.startswith(">") for line in quoted if line), name)
                self.assertIn("> **AI-generated:** an AI assistant wrote everything in this quote", text, name)
                self.assertIn("AI_POLICY.md", text, name)

    def test_bodies_are_drafts_until_the_notes_are_filled(self):
        draft = stub_report(self.tmp)[0]
        self.assertTrue(draft.draft)
        for name, text in bodies(draft).items():
            self.assertTrue(text.splitlines()[1].startswith("**DRAFT, not for"), name)
            self.assertEqual(section(text, "Human notes"), R.NOTES_PLACEHOLDER, name)
        filled = stub_report(self.tmp + "/2", notes=self.notes_file("My own review.\n"))[0]
        self.assertFalse(filled.draft)
        for name, text in bodies(filled).items():
            self.assertNotIn("DRAFT", text, name)
            self.assertIn("### Human notes\n\nMy own review.\n\n### Agent report", text, name)

    def test_notes_of_only_a_comment_leave_a_draft(self):
        report = stub_report(self.tmp, notes=self.notes_file("<!-- nothing yet -->\n\n"))[0]
        self.assertTrue(report.draft)

    def test_test_plan_claims_no_cpu_run_upstream_test(self):
        pr = R.render_pr(stub_report(self.tmp)[0])
        plan = section(pr, "Test plan")
        self.assertIn("Not run (`@onlyCUDA`, no GPU);", plan)
        self.assertIn("python test/test_nn.py -k grid_sample\n", plan)
        self.assertNotRegex(pr, r"(?i)testable on CPU|CPU-only CI")

    def test_test_plan_says_what_the_kit_checks_on_cpu_and_only_what_this_report_ran(self):
        pr = R.render_pr(stub_report(self.tmp)[0])
        plan = section(pr, "Test plan")
        self.assertIn("On CPU, `tests/test_core.py` checks the `.cu`'s host build against the "
                      "existing kernel's arithmetic run serially, and golden digests.", plan)
        # nothing in view claims the patch applied or compiled without a checkout to show it
        self.assertNotRegex(plan, r"(?i)applies|compiles|nvcc")
        self.assertNotIn("The kit's suite", plan)
        self.assertIn("The kit's suite: not run by this report", pr[pr.index("<details>"):])

    def test_test_plan_offers_the_tests_as_a_conformance_suite(self):
        plan = section(R.render_pr(stub_report(self.tmp)[0]), "Test plan")
        self.assertIn("`detgrid patch --tests-only` writes them as a conformance suite.", plan)

    def test_pr_follows_the_fix_issue_template(self):
        pr = R.render_pr(stub_report(self.tmp)[0])
        self.assertLess(pr.index("Fixes #68959"), pr.index("### Human notes"))
        headings = ["Problem", "Approach", "Test plan", "GPU timing", "Memory", "BC-breaking", "Checklist"]
        self.assertEqual(re.findall(r"^> #### (.*)$", pr, re.M), headings)

    def test_bc_statement_names_what_changes_for_users(self):
        bc = section(R.render_pr(stub_report(self.tmp)[0]), "BC-breaking")
        items = bc.splitlines()
        self.assertEqual(items, [
            "- No API change; outside deterministic mode nothing changes.",
            "- `warn_only=True` takes the new path silently; gradients equal the old up to rounding.",
            "- Grid-only calls (the existing kernel) no longer alert.",
            "- Deterministic-mode forwards leave cuDNN, so their bits can change.",
            "- Half/BFloat16 grad_input: rounded once, not per atomic add.",
        ])
        self.assertNotIn("in the forward, nothing changes", bc)

    def test_approach_describes_the_core_in_the_existing_kernels_terms(self):
        report = stub_report(self.tmp)[0]
        approach = section(R.render_pr(report), "Approach")
        for part in (("a new `GridSamplerDeterministic.cu` computes grad_input, and the existing "
                      "kernel grad_grid alone"), "≤ 2^19 records", "a record per tap",
                     "taps and weights from the existing helpers", "`at::cuda::cub` radix-sorts",
                     "`unique_by_key`", "256-record partials (all but a run's first in parallel)",
                     "a thread per (run, channel) adds them in order",
                     ("The same terms as the existing kernel, up to FMA contraction, summed in "
                      "another order"), "`canUse32BitIndexMath`",
                     "keeps `grid_sampler()` off cuDNN in deterministic mode",
                     "`cudnn_grid_sampler_backward` alerts there, #180417"):
            self.assertIn(part, approach)
        # the core stands alone: no levels, no host executor, no "stock", and the sums differ by
        # more than their order
        for text in (approach, in_view(R.render_pr(report))):
            self.assertNotRegex(text, r"(?i)\bstock\b|\blevels?\b|executor|only the order")
        self.assertNotIn("which delegates to it", "".join(bodies(report).values()))
        self.assertIn("nvcc contracts the core's `acc += w * g`", R.render_pr(report))

    def test_memory_names_the_bounded_buffers_and_the_float_scratch(self):
        memory = section(R.render_pr(stub_report(self.tmp)[0]), "Memory")
        self.assertIn("Caching allocator", memory)
        self.assertIn("sort buffers (≤ 64 MiB, counted from the shapes)", memory)
        self.assertIn("a float scratch of grad_input's size", memory)
        # CUB's temporary storage is allocated inside at::cuda::cub: outside the counted bound
        self.assertIn("CUB's temporary storage", memory)
        bound = re.search(r"\(≤ 64 MiB[^)]*\)", memory).group(0)
        self.assertNotIn("CUB", bound)
        self.assertNotRegex(memory, r"(?i)estimat")

    def test_appendix_keeps_repro_claims_patch_files_and_environment_only(self):
        pr = R.render_pr(stub_report(self.tmp)[0])
        appendix = pr[pr.index("<details>"):]
        self.assertIn("show_fix claim 0", appendix)
        self.assertIn("| `b/new.h` (new) | 2 | 0 |", appendix)
        self.assertIn("collect_env left out", appendix)
        # the core calls the existing helpers: nothing about coordinate math of its own
        self.assertNotRegex(pr, r"(?i)coordinate math|does not call|host executor")
        self.assertFalse(hasattr(R, "COORDINATES_DIFFER"))

    def test_claims_not_hashes_in_one_collapsed_appendix(self):
        out = claims_json("show_fix", ["pass"], 0).replace("claim 0", "claim 0 with | a pipe")
        data = json.loads(out)
        data["hashes"] = ["0" * 64] * 30
        pr = R.render_pr(stub_report(self.tmp, {"show_fix.py": (0, json.dumps(data), "")})[0])
        self.assertEqual(pr.count("<details>"), 1)
        appendix = pr[pr.index("<details>") : pr.index("</details>")]
        self.assertIn("> - show_fix claim 0 with \\| a pipe: **pass** (detail 0)", appendix)
        self.assertNotIn("0" * 64, pr)
        self.assertNotIn('"claims"', pr)

    def test_collect_env_only_from_a_gpu_machine_and_only_collapsed(self):
        cpu = stub_report(self.tmp)[0]
        gpu = stub_report(self.tmp + "/2")[0]
        gpu.environment = {**ENV, "cuda_available": True, "device_name": "NVIDIA H200"}
        for text in bodies(cpu).values():
            self.assertNotIn("FAKE collect_env output", text)
            self.assertIn("collect_env left out (no GPU here", text)
        for name, text in bodies(gpu).items():
            details = "".join(re.findall(r"<details>.*?</details>", text, re.S))
            self.assertIn("FAKE collect_env output", details, name)
            self.assertNotIn("FAKE collect_env output", in_view(text), name)

    def test_repro_scripts_are_run_with_json(self):
        _, runner = stub_report(self.tmp)
        ran = [c[1] for c in runner.commands if c[1].startswith("repro")]
        self.assertEqual(ran, [f"repro/{n}" for n in R.REPRO_SCRIPTS])
        self.assertTrue(all(c[-1] == "--json" for c in runner.commands if c[1].startswith("repro")))

    def test_exit_77_rendered_not_checkable_and_exit_1_as_failed(self):
        report, _ = stub_report(self.tmp, {"show_fix.py": (1, claims_json("show_fix", ["fail"], 1), "")})
        pr = R.render_pr(report)
        self.assertIn("`python repro/show_error.py --json` (exit 77, not checkable here)", pr[pr.index("<details>"):])
        self.assertNotIn("show_error.py", in_view(pr))
        self.assertIn("- Repro: `show_fix.py`: exit 1, **FAILED**.", in_view(pr))
        self.assertNotIn("Repro:", in_view(R.render_pr(stub_report(self.tmp + "/3")[0])))
        self.assertEqual([r.name for r in report.failed], ["show_fix.py"])
        status = re.search(r"\*\*Status\.\*\* (.*)", R.render_issue(report)).group(1)
        self.assertIn("Repro scripts failing: `show_fix.py` FAILED", status)
        self.assertNotIn("failing", R.render_issue(stub_report(self.tmp + "/2")[0]))

    def test_script_without_json_output_is_an_error_with_its_stderr(self):
        report, _ = stub_report(self.tmp, {"show_fix.py": (2, "", "Traceback\nImportError: boom\n")})
        pr = R.render_pr(report)
        self.assertIn("exit 2, **ERROR (exit 2, no JSON output)**", in_view(pr))
        self.assertIn("ImportError: boom", in_view(pr))
        self.assertEqual([r.name for r in report.failed], ["show_fix.py"])

    def test_issue_quotes_the_cuda_error_verbatim_when_captured(self):
        first = ("grid_sampler_2d_backward_cuda does not have a deterministic implementation, but you set "
                 "'torch.use_deterministic_algorithms(True)'.")
        message = first + " A captured tail."
        out = json.dumps({"script": "show_error", "device": "cuda", "device_name": "Some GPU",
                          "torch": "9.9.9", "error_message": message,
                          "claims": [{"claim": "raises", "status": "pass", "detail": ""}]})
        issue = R.render_issue(stub_report(self.tmp, {"show_error.py": (0, out, "")})[0])
        self.assertIn("`RuntimeError: " + first + "`", in_view(issue))
        self.assertNotIn("A captured tail", in_view(issue))
        self.assertIn("captured by `python repro/show_error.py` on Some GPU (torch 9.9.9), verbatim", issue)
        self.assertIn("> RuntimeError: " + message, issue)

    def test_without_cuda_the_error_is_cited_from_the_source(self):
        issue = R.render_issue(stub_report(self.tmp)[0])
        self.assertIn("`RuntimeError: " + R.first_sentence(R.ALERT_TEXT) + "`", in_view(issue))
        self.assertIn("not captured on this machine", issue)
        self.assertIn("v2.6.0's `aten/src/ATen/Context.cpp`", issue)
        self.assertIn("> RuntimeError: " + R.ALERT_TEXT, issue)

    def test_without_gpu_results_both_bodies_say_never_run_on_a_gpu(self):
        report = stub_report(self.tmp)[0]
        self.assertIsNone(report.bench)
        issue, pr, _ = bodies(report).values()
        self.assertIn("**Status.** Never run on a GPU.", in_view(issue))
        self.assertEqual(section(pr, "GPU timing"), "Never run on a GPU.")

    def test_newest_gpu_benchmark_results_give_a_summary_and_a_table_in_the_appendix(self):
        report = stub_report(self.tmp)[0]
        results = Path(self.tmp) / "kit" / "benchmarks" / "results"
        results.mkdir(parents=True)
        for name, t in (("old", "2026-01-01"), ("new", "2026-02-01")):
            data = {"device": "cuda:0", "device_name": f"GPU {name}", "torch": "x", "size": "full",
                    "reps": 5, "time_utc": t, "workloads": [GPU_ROW], "summary": {"geomean": 0.5, "worst": 0.5}}
            (results / f"{name}.json").write_text(json.dumps(data))
        (results / "new.png").write_bytes(b"png")
        report.bench = R.newest_bench(Path(self.tmp) / "kit")
        pr = R.render_pr(report)
        self.assertEqual(section(pr, "GPU timing"),
                         "GPU new: deterministic/existing time geomean 0.5, worst 0.5 over 1 "
                         "workloads; 0 incorrect.")
        for name, text in bodies(report).items():
            self.assertNotIn("Never run on a GPU", text, name)
        appendix = pr[pr.index("<details>") :]
        self.assertIn("GPU timing, `benchmarks/results/new.json` (torch x):", appendix)
        self.assertIn("| 1 | zoom | native | 2 | - | - | 1 | 0.5 |", appendix)
        self.assertIn("![new/existing per workload](benchmarks/results/new.png)", appendix)

    def test_gpu_timing_is_the_whole_stacks_with_the_core_beside_it(self):
        report = stub_report(self.tmp)[0]
        timed = [{**GPU_ROW, "row": n, "name": f"w{n}", "ratio": ratio, "same_bits": same,
                  "levels": {"core": {"ms": 4.0 * ratio, "ratio": 2.0 * ratio}},
                  "variants": {**GPU_ROW["variants"], "detgrid": {"median_ms": 2.0 * ratio}}}
                 for n, ratio, same in ((1, 0.5, True), (2, 2.0, True), (3, 1.0, False))]
        grid_only = {**GPU_ROW, "row": 4, "name": "grid_only", "ratio": 1.0}  # no core build
        report.bench = R.BenchResults("benchmarks/results/gpu.json", None, {
            "device": "cuda:0", "device_name": "GPU A", "torch": "x",
            "workloads": [*timed, grid_only],
            "summary": {"geomean": 1.0, "worst": 2.0, "levels": {"core": {"geomean": 2.0}}}})
        pr = R.render_pr(report)
        self.assertEqual(section(pr, "GPU timing"),
                         "GPU A: deterministic/existing time geomean 1 (the core alone: 2), "
                         "worst 2 over 4 workloads; 1 incorrect.")
        appendix = pr[pr.index("<details>") :]
        self.assertIn("| 2 | w2 | native | 2 | 8 | 4 | 4 | 2 | 3 | yes |", appendix)
        self.assertIn("| 3 | w3 | native | 2 | 4 | 2 | 2 | 1 | 3 | NO |", appendix)
        self.assertIn("| 4 | grid_only | native | 2 | - | - | 1 | 1 | 3 | yes |", appendix)

    def test_a_later_cpu_smoke_run_does_not_hide_gpu_results(self):
        results = Path(self.tmp) / "kit" / "benchmarks" / "results"
        results.mkdir(parents=True)
        runs = {"gpu": {"device": "cuda:0", "device_name": "GPU A", "time_utc": "2026-01-01"},
                "cpu": {"device": "cpu", "device_name": "cpu x86_64", "time_utc": "2026-02-01"}}
        for name, data in runs.items():
            (results / f"{name}.json").write_text(json.dumps({**data, "workloads": [GPU_ROW]}))
        self.assertEqual(R.newest_bench(Path(self.tmp) / "kit").path, "benchmarks/results/gpu.json")

    def test_cpu_benchmark_results_are_not_a_performance_claim(self):
        report = stub_report(self.tmp)[0]
        report.bench = R.BenchResults("benchmarks/results/cpu.json", None, {
            "device": "cpu", "device_name": "cpu x86_64", "workloads": [GPU_ROW]})
        for name, text in bodies(report).items():
            if name != "COMMENT_196856.md":  # the comment claims no GPU run of either side
                self.assertIn("Never run on a GPU", text, name)
            self.assertNotIn("| zoom |", text, name)
        pr = R.render_pr(report)
        self.assertTrue(section(pr, "GPU timing").startswith("Never run on a GPU"))
        self.assertNotRegex(pr, r"\[x\] [^\n]*benchmark")

    def test_machine_code_is_cited_only_from_the_kits_count(self):
        self.assertIsNone(stub_report(self.tmp)[0].machine_code)
        self.assertNotIn(".text", R.render_pr(stub_report(self.tmp + "/2")[0]))
        kit = kit_with_machine_code(self.tmp + "/3", {"arch": "sm_90", "kernels": 1, "text_bytes": 2,
                                                       "core": MACHINE_CODE})
        report = R.gather(kit_root=kit, runner=StubRunner(DEFAULT_OUTCOMES), env=dict(ENV))
        pr = R.render_pr(report)
        self.assertIn("The new file, sm_90: 192 kernels, 4.20 MiB of `.text`.", section(pr, "Approach"))
        self.assertIn("Machine code: the core's entry in `benchmarks/machine_code.json`; a kernel "
                      "count includes the CUB kernels built in the unit.", pr[pr.index("<details>") :])

    def test_machine_code_reads_the_core_entry_or_levels_core_and_nothing_else(self):
        cases = [
            ({"core": MACHINE_CODE}, "192 kernels"),
            ({"levels": {"core": {"kernels": 31, "text_bytes": 467072}}, "arch": "sm_90"}, "31 kernels"),
            # the top-level numbers alone are no core's
            ({"arch": "sm_90", "kernels": 126, "text_bytes": 2042880}, None),
            ({"levels": {"pipeline": {"kernels": 5, "text_bytes": 1}}}, None),
        ]
        for record, cited in cases:
            with self.subTest(record=record):
                kit = kit_with_machine_code(tempfile.mkdtemp(dir=self.tmp), record)
                report = R.gather(kit_root=kit, runner=StubRunner(DEFAULT_OUTCOMES), env=dict(ENV))
                approach = section(R.render_pr(report), "Approach")
                if cited is None:
                    self.assertIsNone(report.machine_code)
                    self.assertNotIn("kernels", approach)
                else:
                    self.assertIn(cited, approach)

    def test_a_count_of_another_source_than_the_core_is_not_cited(self):
        # levels.core of an older machine_code.json counted the pipeline's 1,740-line core
        for where in ({"core": {**MACHINE_CODE, "lines": 1740}},
                      {"levels": {"core": {**MACHINE_CODE, "lines": 1740}}}):
            with self.subTest(where=where):
                kit = kit_with_machine_code(tempfile.mkdtemp(dir=self.tmp), where, core_lines=600)
                report = R.gather(kit_root=kit, runner=StubRunner(DEFAULT_OUTCOMES), env=dict(ENV))
                self.assertEqual(report.core_lines, 600)
                self.assertIsNone(report.machine_code)
                for name, text in bodies(report).items():
                    self.assertNotIn("192 kernels", text, name)
        kit = kit_with_machine_code(self.tmp + "/same", {"core": {**MACHINE_CODE, "lines": 600}}, core_lines=600)
        report = R.gather(kit_root=kit, runner=StubRunner(DEFAULT_OUTCOMES), env=dict(ENV))
        self.assertEqual(report.machine_code.kernels, 192)

    def test_unreadable_machine_code_count_fails_in_one_line_before_any_script_runs(self):
        for text in ("{not json", json.dumps([1, 2]), json.dumps({"core": {"arch": "sm_90", "kernels": 1}}),
                     json.dumps({"core": {**MACHINE_CODE, "kernels": "many"}}),
                     json.dumps({"levels": {"core": {"kernels": "many", "text_bytes": 1}}}),
                     json.dumps({"core": [1, 2]})):
            with self.subTest(text=text):
                kit = make_kit(tempfile.mkdtemp(dir=self.tmp))
                (kit / "benchmarks").mkdir()
                (kit / "benchmarks" / "machine_code.json").write_text(text)
                runner = StubRunner(DEFAULT_OUTCOMES)
                with self.assertRaisesRegex(R.ReportError, r"^benchmarks/machine_code.json: ") as caught:
                    R.gather(kit_root=kit, runner=runner, env=dict(ENV))
                self.assertNotIn("\n", str(caught.exception))
                self.assertEqual(runner.commands, [])

    def test_patch_stats_parsed_from_a_format_patch(self):
        stats = R.patch_stats(make_kit(self.tmp) / "patches" / "v9.1.0.patch", Path(self.tmp) / "kit")
        self.assertEqual(stats.path, "patches/v9.1.0.patch")
        self.assertEqual((stats.base_label, stats.commit), ("v9.1.0", "0123456789abcdef0123456789abcdef01234567"))
        self.assertEqual([(f.path, f.added, f.removed, f.new) for f in stats.files],
                         [("a/old.cpp", 2, 1, False), ("b/new.h", 2, 0, True)])
        pr = R.render_pr(stub_report(self.tmp + "/2")[0])
        self.assertIn("`patches/v9.1.0.patch`: 2 files, +4 −1.", in_view(pr))
        self.assertIn("| `b/new.h` (new) | 2 | 0 |", pr)

    def test_patch_stats_agree_with_git_numstat_on_the_committed_patches(self):
        patches = sorted((ROOT / "patches").glob("*.patch"))
        if not patches or shutil.which("git") is None:
            self.skipTest("no committed patch or no git")
        for p in patches:
            out = subprocess.run(["git", "apply", "--numstat", str(p)], capture_output=True,
                                 text=True, check=True).stdout
            expected = [(ln.split("\t")[2], int(ln.split("\t")[0]), int(ln.split("\t")[1]))
                        for ln in out.splitlines()]
            got = [(f.path, f.added, f.removed) for f in R.patch_stats(p).files]
            self.assertEqual(got, expected)

    def test_tests_not_run_is_stated_and_a_junit_summary_is_rendered(self):
        self.assertIn("not run by this report (pass `--junit FILE`", R.render_pr(stub_report(self.tmp)[0]))
        junit = Path(self.tmp) / "junit.xml"
        junit.write_text('<testsuites><testsuite name="pytest" tests="10" failures="1" errors="0" '
                         'skipped="2" time="3.5"></testsuite></testsuites>')
        report = stub_report(self.tmp + "/2", junit=str(junit))[0]
        self.assertIn("10 tests, 7 passed, 1 failed, 0 errors, 2 skipped in 3.5 s", R.render_pr(report))

    def test_checkout_is_checked_in_a_temporary_copy(self):
        tree = Path(self.tmp) / "pytorch"
        shutil.copytree(FIXTURE_MAIN, tree)
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
            subprocess.run(["git", "-C", str(tree), *cmd], check=True, capture_output=True,
                           env={**os.environ, **IDENTITY})
        kit = make_kit(self.tmp)
        os.symlink(ROOT / "aten_kernels", kit / "aten_kernels")
        report = R.gather(pytorch=str(tree), kit_root=kit, runner=StubRunner(DEFAULT_OUTCOMES), env=dict(ENV))
        self.assertTrue(report.checkout.applies, report.checkout.check)
        self.assertEqual(report.checkout.base_label, "v2.12.0+g" + subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout[:12])
        self.assertIn("the cuDNN backward alerts in deterministic mode already (#180417)",
                      " ".join(report.checkout.notes))
        self.assertIn("`detgrid patch --check` on", R.render_pr(report))
        plan = section(R.render_pr(report), "Test plan")
        self.assertIn(f"- `detgrid patch --check` ({report.checkout.base_label}): applies; lint: clean.", plan)
        report.checkout.notes.append("test/test_nn.py: test_x expects a CUDA kernel named 'k', ... will fail until")
        pr = R.render_pr(report)
        self.assertIn("applies; lint: clean. 1 upstream test(s) fail as written (appendix).", in_view(pr))
        self.assertIn("test/test_nn.py: test_x expects a CUDA kernel named 'k'", pr[pr.index("<details>"):])
        self.assertFalse((tree / "aten/src/ATen/native/cuda/GridSamplerDeterministic.cu").exists())
        self.assertEqual(subprocess.run(["git", "-C", str(tree), "status", "--porcelain"],
                                        capture_output=True, text=True).stdout, "")

    def test_write_puts_every_body_in_the_out_dir(self):
        out = Path(self.tmp) / "out"
        paths = R.write(stub_report(self.tmp)[0], out)
        self.assertEqual(sorted(p.name for p in out.iterdir()), ["COMMENT_196856.md", "ISSUE.md", "PR.md"])
        for name, path in paths.items():
            self.assertTrue(path.read_text().startswith(f"<!-- {name}: {R.BODY_PLACES[name][1]}."), name)
        self.assertIn("a comment on #196856", paths["COMMENT_196856.md"].read_text().splitlines()[0])

    def test_report_is_a_cli_subcommand(self):
        args = cli.build_parser().parse_args(["report", "--out", "x", "--junit", "j.xml", "--notes", "n.md"])
        self.assertIs(args.handler, R.run)
        self.assertEqual((args.out, args.junit, args.pytorch, args.notes, args.final), ("x", "j.xml", None, "n.md", False))


class TestBadArguments(TestCase):
    """Every bad argument of `report` and `patch`: a one-line error, a non-zero exit, no traceback,
    and for `report` nothing run (the repro scripts, collect_env) before the error."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp)

    def cli(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        ran = mock.Mock(side_effect=AssertionError("ran a script before checking the arguments"))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                mock.patch.object(R, "run_command", ran), mock.patch.object(R, "run_repro", ran), \
                mock.patch.dict(os.environ, IDENTITY):
            try:
                rc = cli.main([*map(str, argv)])
            except SystemExit as e:
                rc = e.code
        return rc, err.getvalue()

    def test_bad_report_arguments(self):
        a_file = self.tmp / "file"
        a_file.write_text("x")
        bad_xml = self.tmp / "bad.xml"
        bad_xml.write_text("<testsuite tests='1'")
        not_junit = self.tmp / "other.xml"
        not_junit.write_text("<html/>")
        not_utf8 = self.tmp / "notes.md"
        not_utf8.write_bytes(b"\xff\xfe")
        out = self.tmp / "out"
        cases = [
            (["--out", a_file], "is a file"),
            (["--out", self.tmp / "missing" / "deeper"], "not a writable directory"),
            (["--out", out, "--junit", self.tmp / "missing.xml"], "missing.xml"),
            (["--out", out, "--junit", bad_xml], "not junit XML"),
            (["--out", out, "--junit", not_junit], "no <testsuite>"),
            (["--out", out, "--notes", self.tmp / "missing.md"], "missing.md"),
            (["--out", out, "--notes", not_utf8], "notes.md"),
            (["--out", out, "--final"], "the submitter's notes are empty"),
            (["--out", out, "--pytorch", self.tmp / "nowhere"], "nowhere"),
            (["--out", out, "--pytorch", self.tmp], f"{self.tmp} is not a PyTorch checkout"),
        ]
        for argv, why in cases:
            with self.subTest(argv=argv):
                rc, err = self.cli("report", *argv)
                self.assertNotEqual(rc, 0)
                self.assertNotIn("Traceback", err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn(why, err)
                self.assertFalse(out.exists() and any(out.iterdir()))

    def test_bad_patch_arguments(self):
        a_file = self.tmp / "file"
        a_file.write_text("x")
        cases = [
            ([], "--pytorch"),
            (["--pytorch", self.tmp / "nowhere"], "no such directory"),
            (["--pytorch", a_file], "no such directory"),
            (["--pytorch", self.tmp], "is not a PyTorch checkout"),
            (["--pytorch", self.tmp, "--bogus"], "--bogus"),
        ]
        for argv, why in cases:
            with self.subTest(argv=argv):
                rc, err = self.cli("patch", *argv)
                self.assertNotEqual(rc, 0)
                self.assertNotIn("Traceback", err)
                self.assertIn(why, err)


class TestCommittedReport(TestCase):
    def test_committed_bodies_are_within_their_word_limits(self):
        # on any machine: the files a maintainer reads, by the issue's measure
        for name, limit in LIMITS.items():
            text = (ROOT / name).read_text(encoding="utf-8")
            self.assertLessEqual(words_in_view(text), limit, name)
        rows = side_by_side((ROOT / "COMMENT_196856.md").read_text(encoding="utf-8"))
        self.assertEqual(tuple(r for r in rows if r), SIDE_BY_SIDE_ROWS)
        self.assertEqual(side_by_side((ROOT / "PR.md").read_text(encoding="utf-8")), {})

    def test_committed_bodies_match_a_fresh_render(self):
        for name in R.BODIES:
            self.assertTrue((ROOT / name).is_file(), f"{name} missing: run `detgrid report` and commit it")
        committed = {name: (ROOT / name).read_text(encoding="utf-8") for name in R.BODIES}
        here = R.signature(R.environment())
        made_on = re.search(r"on (.*)\. Regenerate", committed["PR.md"].splitlines()[0]).group(1)
        if made_on != here:
            self.skipTest(f"the committed files were made on {made_on}; this is {here}")
        report = R.gather()
        for name, render in R.BODIES.items():
            self.assertEqual(R.mask_volatile(committed[name]), R.mask_volatile(render(report)),
                             f"{name} is stale: run `detgrid report` and commit it")


if __name__ == "__main__":
    run_tests()
