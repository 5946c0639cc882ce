# Owner(s): ["module: nn"]
"""grad_grid keeps its bits: over a broad seeded set of calls (2-D and 3-D, every mode,
padding, align_corners and dtype; NaN, infinite and huge coordinates; NaN and infinite
values in input and grad_output; strided operands), the grid gradient's digests equal
those that the extension's first grid-gradient pass gave (GridGradientPass.cuh, run by
the executor of the deterministic backward the extension had before the upstream core,
both since deleted), recorded in golden/grid_gradient_digests.json. The kernel that
replaced it (aten_kernels/extension/GridGradient.cu) must give every bit of them, NaN's
sign and payload aside (see digest_of): the same elements are NaN.

Reflection with hostile coordinates has a set of its own, most of its coordinates infinite
or huge: there the flip count, floor(|x| / span), leaves int's range, and the bits are the
GPU's saturating conversion's (INT_MAX, odd), which the recorded pass took and the kernel
takes on the host too.

    python tests/test_grid_gradient_bits.py --regenerate   # only for a change meant to move them
"""

import hashlib
import itertools
import json
import pathlib
import sys

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

from detgrid import ops
from detgrid_testing import ALL_DTYPES

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "grid_gradient_digests.json"
MODES = ("bilinear", "nearest", "bicubic")
PADDINGS = ("zeros", "border", "reflection")
HOSTILE = (float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e10, -1e10, 3e9,
           -3e9, 65504.0, 70000.0, 1.0, -1.0, 0.0)
# Flip counts stay within int's range for these (|x| * size / 2 / span < 2^31), and
# float16's unnormalized coordinates finite (float16 holds 1e8 as Inf).
HOSTILE_REFLECTION = (float("nan"), 1e4, -1e4, 1.0, -1.0, 0.0)
HOSTILE_REFLECTION_WIDE = HOSTILE_REFLECTION + (1e8, -1e8)


def cases():
    """(name, dims, mode, padding, align_corners, dtype, seed) of every case."""
    for seed, (dims, mode, padding, align_corners, dtype) in enumerate(itertools.product(
            (2, 3), MODES, PADDINGS, (False, True), ALL_DTYPES)):
        name = f"{dims}d_{mode}_{padding}_{'align' if align_corners else 'edges'}_" \
               f"{str(dtype).split('.')[1]}"
        yield name, dims, mode, padding, align_corners, dtype, seed


def problem(dims, padding, dtype, seed):
    """(grad_output, input, grid) of one case: coordinates mostly in [-1.3, 1.3],
    a fifth of them hostile; every third case puts NaN and Inf into input and
    grad_output, every other case reads a strided input and grad_output."""
    gen = torch.Generator().manual_seed(1000 + seed)
    in_size, out_size = ((5, 7), (6, 5)) if dims == 2 else ((4, 5, 3), (3, 4, 2))
    inp = torch.randn(2, 3, *in_size, generator=gen, dtype=torch.float64)
    grad_output = torch.randn(2, 3, *out_size, generator=gen, dtype=torch.float64)
    grid = torch.rand(2, *out_size, dims, generator=gen, dtype=torch.float64) * 2.6 - 1.3
    if padding != "reflection":
        hostile = HOSTILE
    else:
        hostile = HOSTILE_REFLECTION if dtype == torch.float16 else HOSTILE_REFLECTION_WIDE
    hostile = torch.tensor(hostile, dtype=torch.float64)
    pick = hostile[torch.randint(0, hostile.numel(), grid.shape, generator=gen)]
    grid = torch.where(torch.rand(grid.shape, generator=gen) < 0.2, pick, grid)
    if seed % 3 == 0:
        for t in (inp, grad_output):
            flat = t.view(-1)
            flat[torch.randint(0, flat.numel(), (2,), generator=gen)] = float("nan")
            flat[torch.randint(0, flat.numel(), (2,), generator=gen)] = float("inf")
    grad_output, inp, grid = (t.to(dtype) for t in (grad_output, inp, grid))
    if seed % 2 == 1:
        inp = inp.transpose(-1, -2).contiguous().transpose(-1, -2)
        grad_output = grad_output.transpose(0, 1).contiguous().transpose(0, 1)
    return grad_output, inp, grid


def reflection_cases():
    """(name, dims, mode, align_corners, dtype) of the hostile reflection set."""
    for dims, mode, align_corners, dtype in itertools.product(
            (2, 3), ("bilinear", "bicubic"), (False, True),
            (torch.float32, torch.float64, torch.float16)):
        name = f"reflection_hostile_{dims}d_{mode}_{'align' if align_corners else 'edges'}_" \
               f"{str(dtype).split('.')[1]}"
        yield name, dims, mode, align_corners, dtype


def reflection_problem(dims, dtype):
    """(grad_output, input, grid) with every coordinate drawn from HOSTILE."""
    gen = torch.Generator().manual_seed(5)
    in_size, out_size = ((5, 7), (6, 5)) if dims == 2 else ((4, 5, 3), (3, 4, 2))
    inp = torch.randn(2, 3, *in_size, generator=gen, dtype=torch.float64).to(dtype)
    grad_output = torch.randn(2, 3, *out_size, generator=gen, dtype=torch.float64).to(dtype)
    hostile = torch.tensor(HOSTILE, dtype=torch.float64)
    grid = hostile[torch.randint(0, hostile.numel(), (2, *out_size, dims), generator=gen)]
    return grad_output, inp, grid.to(dtype)


def reflection_digest(dims, mode, align_corners, dtype):
    return digest_of(ops.grid_gradient(*reflection_problem(dims, dtype), mode, "reflection",
                                       align_corners))


def digest_of(grad_grid):
    """sha256 of the bits, each NaN as the one quiet NaN: which NaN a sum of
    two NaNs keeps is the host's choice (x86 keeps an operand's, in the order
    the compiler gives a commutative add), and the GPU's is always the
    canonical one, so NaN's sign and payload are no part of the bits kept."""
    canonical = grad_grid.masked_fill(grad_grid.isnan(), float("nan")).contiguous()
    return hashlib.sha256(canonical.view(torch.uint8).numpy().tobytes()).hexdigest()


def digest(dims, mode, padding, align_corners, dtype, seed):
    return digest_of(ops.grid_gradient(*problem(dims, padding, dtype, seed), mode, padding,
                                       align_corners))


class TestGridGradientBits(TestCase):
    def test_grid_gradient_keeps_the_recorded_bits(self):
        golden = json.loads(GOLDEN.read_text())
        self.assertEqual(sorted(golden), sorted(
            [name for name, *_ in cases()] + [name for name, *_ in reflection_cases()]))
        for name, *case in cases():
            with self.subTest(case=name):
                self.assertEqual(digest(*case), golden[name])

    def test_reflection_of_hostile_coordinates_keeps_the_recorded_bits(self):
        golden = json.loads(GOLDEN.read_text())
        for name, *case in reflection_cases():
            with self.subTest(case=name):
                self.assertEqual(reflection_digest(*case), golden[name])

    def test_the_cases_hold_hostile_values(self):
        grad_output, inp, grid = problem(3, "zeros", torch.float32, 0)
        self.assertTrue(grid.isnan().any() and grid.isinf().any() and (grid.abs() > 1e9).any())
        self.assertTrue(inp.isnan().any() and grad_output.isinf().any())


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        digests = {name: digest(*case) for name, *case in cases()}
        digests.update({name: reflection_digest(*case) for name, *case in reflection_cases()})
        GOLDEN.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")
    else:
        run_tests()
