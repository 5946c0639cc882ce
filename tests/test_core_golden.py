# Owner(s): ["module: nn"]
"""The core's grad_input bits on the golden corpus's inputs
(tests/golden/core.py): written once from the code as it was, and
recomputed here. The host build's launch shape and thread order never move
them (tests/test_core.py), so neither may a speed step: every build of the
core's file that level= runs (detgrid.levels.CORE_BUILDS, the core and each
prefix of the stack ending with a speed level) gives the core's digests,
under its own launches and under other block sizes and shuffled orders."""

import detgrid.ops  # noqa: F401  (registers torch.ops.detgrid)
import torch
from detgrid import levels
from golden import core, corpus
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

GOLDEN = core.load()
CASES = {c.name: c for c in core.CASES}
# (block_size, grid_size, shuffle_seed) of the host build's launches: small
# blocks and grids (each thread loops over many items), one thread a block,
# and shuffled block and thread orders.
OTHER_LAUNCHES = ((32, 3, 7), (1, 5, 2), (64, 0, 11), (512, 1, 0))

# (level, case) where the level's host build gives the core's grad_input but
# for the sign of some NaNs (golden.core.differ_only_in_nan_signs): which of
# two NaNs of opposite signs a sum keeps is the x86 host code's operand
# order, which the compiler picks, not the order of the terms. Listed, not
# skipped: such a case fails if it differs in any other bit, and fails when
# it gives the golden digest again (drop it from here then).
NAN_SIGNS_DIFFER = {
    # bicubic: NaN coordinates make +NaN weights, inf * 0 in the cubic
    # coefficients -NaN ones; 12 of its 54 NaN elements change sign.
    ("grouped-channels", "nonfinite_2d_bicubic_reflection_float64_sparse"),
}


class TestCoreGolden(TestCase):
    def setUp(self):
        super().setUp()
        if not torch.ops.detgrid._core_host_contracts():
            self.skipTest("the digests are those of a host build with FMA contraction, "
                          "as nvcc contracts; this CPU has no FMA")

    def golden_or_nan_signs(self, name, level, launch=()):
        """None where the build gives the golden digest (or, for NAN_SIGNS_DIFFER, the
        core's bits but for NaN signs), else what is wrong."""
        case = CASES[name]
        result = core.grad_input(case, level, *launch)
        digest = corpus.tensor_digest(result)
        if (level, name) not in NAN_SIGNS_DIFFER:
            return None if digest == GOLDEN[name] else f"{level}: {name} {launch}: digest"
        if digest == GOLDEN[name]:
            return f"{level}: {name} gives the golden digest now: drop it from NAN_SIGNS_DIFFER"
        if not core.differ_only_in_nan_signs(result, core.grad_input(case, "core")):
            return f"{level}: {name} {launch}: differs from the core beyond NaN signs"
        return None

    @parametrize("level", levels.CORE_BUILDS)
    @parametrize("name", sorted(GOLDEN))
    def test_core_bits_equal_golden_digest(self, name, level):
        case = CASES[name]
        self.assertIsNone(self.golden_or_nan_signs(name, level), case.description)

    @parametrize("level", levels.CORE_BUILDS)
    def test_other_launch_shapes_give_the_golden_digests(self, level):
        # Every case under every other launch shape.
        wrong = [self.golden_or_nan_signs(name, level, launch)
                 for name in sorted(GOLDEN) for launch in OTHER_LAUNCHES]
        self.assertEqual([w for w in wrong if w is not None], [], level)

    def test_nan_signs_differ_names_real_builds_and_cases(self):
        for level, name in NAN_SIGNS_DIFFER:
            self.assertIn(level, levels.CORE_BUILDS[1:])  # never the core itself
            self.assertIn(name, GOLDEN)

    def test_table_has_exactly_the_cases(self):
        self.assertEqual(sorted(GOLDEN), sorted(c.name for c in core.CASES))

    def test_the_builds_are_the_stacks(self):
        self.assertEqual(tuple(torch.ops.detgrid._core_builds()), levels.CORE_BUILDS)


instantiate_parametrized_tests(TestCoreGolden)

if __name__ == "__main__":
    run_tests()
