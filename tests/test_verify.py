# Owner(s): ["module: nn"]
"""`detgrid verify`, the kit's main job: both embedded cases pass, and the
verdict fails when any of its claims fails."""

import dataclasses

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid.kit import verify
from detgrid_testing import DetgridTestCase


class TestVerify(DetgridTestCase):
    def test_verify_runs_a_2d_and_a_3d_high_collision_case(self):
        results = verify.verify(device="cpu", runs=2, dtype=torch.float64)
        self.assertEqual([r.case.split(" ")[0] for r in results],
                         ["grid_sampler_2d", "grid_sampler_3d"])
        for result in results:
            self.assertTrue(result.ok, verify.format_result(result))
            self.assertEqual(result.distinct_deterministic, 1)
        self.assertGreaterEqual(verify.CASES[1].samples_per_cell, 64)

    @parametrize("dtype", (torch.float16, torch.bfloat16), name_fn=lambda d: str(d)[6:])
    def test_reduced_precision_agrees_with_stock_in_float64(self, dtype):
        results = verify.verify(device="cpu", runs=2, dtype=dtype)
        for result in results:
            self.assertTrue(result.ok, verify.format_result(result))
            self.assertIn("stock in float64", verify.format_result(result))
            self.assertLessEqual(result.max_rel_diff_vs_stock, verify.TOLERANCES[str(dtype)])

    def test_one_run_is_refused(self):
        with self.assertRaisesRegex(ValueError, "at least 2 runs"):
            verify.verify_case(verify.CASES[0], device="cpu", runs=1)

    def test_verdict_fails_on_differing_hashes_or_large_error(self):
        result = verify.verify_case(verify.CASES[0], device="cpu", runs=2,
                                    dtype=torch.float64)
        self.assertTrue(result.ok)
        two_hashes = dataclasses.replace(
            result, deterministic_hashes=["a" * 64, "b" * 64])
        self.assertFalse(two_hashes.ok)
        self.assertIn("FAILED", verify.format_result(two_hashes))
        far_from_stock = dataclasses.replace(result, max_rel_diff_vs_stock=1e-6)
        self.assertFalse(far_from_stock.ok)
        not_equal_to_host_build = dataclasses.replace(result, equals_host_build=False)
        self.assertFalse(not_equal_to_host_build.ok)


instantiate_parametrized_tests(TestVerify)

if __name__ == "__main__":
    run_tests()
