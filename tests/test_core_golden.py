# Owner(s): ["module: nn"]
"""The core's grad_input bits on the golden corpus's inputs
(tests/golden/core.py): written once from the code as it was, and
recomputed here. The host build's launch shape and thread order never move
them (tests/test_core.py), so neither may a speed step."""

import detgrid.ops  # noqa: F401  (registers torch.ops.detgrid)
import torch
from golden import core
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

GOLDEN = core.load()


class TestCoreGolden(TestCase):
    def setUp(self):
        super().setUp()
        if not torch.ops.detgrid._core_host_contracts():
            self.skipTest("the digests are those of a host build with FMA contraction, "
                          "as nvcc contracts; this CPU has no FMA")

    @parametrize("name", sorted(GOLDEN))
    def test_core_bits_equal_golden_digest(self, name):
        case = next(c for c in core.CASES if c.name == name)
        self.assertEqual(core.compute(case), GOLDEN[name], f"{name}: {case.description}")

    def test_table_has_exactly_the_cases(self):
        self.assertEqual(sorted(GOLDEN), sorted(c.name for c in core.CASES))


instantiate_parametrized_tests(TestCoreGolden)

if __name__ == "__main__":
    run_tests()
