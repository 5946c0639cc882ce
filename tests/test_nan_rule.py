# Owner(s): ["module: nn"]
"""The equality rule between a CUDA result and the host build's
(detgrid.kit.bitwise): bit-equal, or both NaN. Arithmetic NaNs have different
bits on the GPU and on x86, every other value must keep its bits."""

import math
import unittest
from unittest import mock

import torch
from torch.testing._internal.common_utils import (
    TestCase,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import levels
from detgrid.kit import gpucheck
from detgrid.kit.bitwise import same_bits_or_both_nan
from detgrid_testing import (
    ALL_DTYPES,
    HAS_DETGRID_CUDA,
    assert_same_bits_or_both_nan,
)
from detgrid.bench.workloads import DIMS, run_detgrid

# Each dtype's NaN as a GPU makes it, as x86 makes it (the default NaN, or
# the propagated operand's), and one more with another payload and sign.
NANS = {
    torch.float16: (0x7FFF, -0x0200, 0x7E01),            # 0xFE00 as int16
    torch.bfloat16: (0x7FFF, 0x7FC0, -0x003F),           # 0xFFC1 as int16
    torch.float32: (0x7FFFFFFF, -0x00400000, 0x7FC00001),  # 0xFFC00000 as int32
    torch.float64: (0x7FFFFFFFFFFFFFFF, -0x0008000000000000, 0x7FF8000000000001),
}
_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
        torch.float32: torch.int32, torch.float64: torch.int64}


def _from_bits(patterns, dtype):
    return torch.tensor(patterns, dtype=_INT[dtype]).view(dtype)


def _name(dtype):
    return str(dtype).split(".")[1]


class TestSameBitsOrBothNan(TestCase):
    @parametrize("dtype", ALL_DTYPES, name_fn=_name)
    def test_nans_with_different_payloads_and_signs_are_equal(self, dtype):
        nans = _from_bits(NANS[dtype], dtype)
        self.assertTrue(bool(nans.isnan().all()))
        for other in (nans.roll(1), nans.roll(2)):
            self.assertTrue(same_bits_or_both_nan(nans, other))

    @parametrize("dtype", ALL_DTYPES, name_fn=_name)
    def test_nan_and_a_number_differ(self, dtype):
        nan = _from_bits(NANS[dtype][:1], dtype)
        for number in (0.0, 1.0, math.inf, -math.inf):
            value = torch.tensor([number], dtype=dtype)
            self.assertFalse(same_bits_or_both_nan(nan, value), number)
            self.assertFalse(same_bits_or_both_nan(value, nan), number)

    @parametrize("dtype", ALL_DTYPES, name_fn=_name)
    def test_negative_zero_and_positive_zero_differ(self, dtype):
        self.assertFalse(same_bits_or_both_nan(torch.tensor([-0.0], dtype=dtype),
                                               torch.tensor([0.0], dtype=dtype)))

    @parametrize("dtype", ALL_DTYPES, name_fn=_name)
    def test_numbers_one_ulp_apart_differ(self, dtype):
        one = torch.tensor([1.0], dtype=dtype)
        next_up = one + torch.finfo(dtype).eps
        self.assertFalse(same_bits_or_both_nan(one, next_up))
        self.assertTrue(same_bits_or_both_nan(one, one.clone()))

    def test_dtype_shape_and_missing_gradients(self):
        a = torch.zeros(3)
        self.assertFalse(same_bits_or_both_nan(a, a.double()))
        self.assertFalse(same_bits_or_both_nan(a, a.reshape(1, 3)))
        self.assertTrue(same_bits_or_both_nan(None, None))
        self.assertFalse(same_bits_or_both_nan(a, None))

    def test_assertion_names_the_first_difference_but_not_a_nan_payload(self):
        nans = _from_bits(NANS[torch.float32], torch.float32)
        assert_same_bits_or_both_nan(self, nans, nans.roll(1))
        with self.assertRaisesRegex(AssertionError, r"1 of 3 elements differ.*first at \(1,\)"):
            assert_same_bits_or_both_nan(self, torch.tensor([math.nan, -0.0, 2.0]),
                                         torch.tensor([math.nan, 0.0, 2.0]), "grad_input")


class TestGpuCheckFollowsTheRule(TestCase):
    """The GPU check's rows of a core build on the device against its host
    build count by the same rule."""

    def _row(self, device_result):
        host = torch.tensor([math.nan, 1.0])
        results = iter([host, device_result])  # the reference runs first
        case = gpucheck.match_cases("float32", 2)[0]
        with mock.patch.object(gpucheck, "core_grad_input", lambda *a, **k: next(results)):
            return gpucheck.core_row("cpu", levels.TOP, "float32", 2, [case])

    def test_nan_payload_difference_is_equal(self):
        other_nan = _from_bits((0x7FFFFFFF,), torch.float32)
        row = self._row(torch.cat([other_nan, torch.tensor([1.0])]))
        self.assertEqual((row["cases"], row["bitwise_equal"]), (1, 1))

    def test_nan_against_a_number_is_a_mismatch(self):
        row = self._row(torch.tensor([0.0, 1.0]))
        self.assertEqual((row["cases"], row["bitwise_equal"]), (1, 0))
        self.assertEqual(len(row["mismatches"]), 1)


@unittest.skipUnless(HAS_DETGRID_CUDA, "needs a GPU and detgrid's CUDA kernels")
class TestCudaAgainstHostWithNonFiniteGradOutput(TestCase):
    @parametrize("dtype", ("float32", "float64"))
    @parametrize("dims", DIMS, name_fn=lambda dims: f"{dims}d")
    def test_cuda_matches_host_build_but_nan_payloads(self, dims, dtype):
        cases = [c for c in gpucheck.match_cases(dtype, dims)
                 if c.name.endswith("_non_finite_grad_output")]
        self.assertTrue(cases)
        for case in cases:
            host = run_detgrid(case)
            device = run_detgrid(case.to("cuda"))
            for got, expected, what in zip(device, host, ("grad_input", "grad_grid")):
                assert_same_bits_or_both_nan(self, got, expected, f"{case.name} {what}")


instantiate_parametrized_tests(TestSameBitsOrBothNan)
instantiate_parametrized_tests(TestCudaAgainstHostWithNonFiniteGradOutput)

if __name__ == "__main__":
    run_tests()
