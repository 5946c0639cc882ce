"""Golden digests of the core (aten_kernels/aten/, issue 59), run by its
host build, over the inputs of the golden corpus (corpus.py: every case,
5-D bicubic included). Every build of the core's file that
level= runs (detgrid.levels.CORE_BUILDS: the core and its speed levels)
must give these digests.

core_digests.json, next to this file, holds the SHA-256 of grad_input
for each case; tests/test_core_golden.py recomputes them. They are the
bits of a host build that contracts a * b + c into FMAs as nvcc does (where
the CPU has none, the test skips). A speed step on the core must leave
every digest as it is.

Usage (in tests/):
  python -m golden.core           rewrite core_digests.json
  python -m golden.core --check   recompute and compare, write nothing
"""

import argparse
import json
import os
import sys

import detgrid.ops  # noqa: F401  (registers torch.ops.detgrid)
import torch

from golden import corpus

DIGESTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "core_digests.json")

CASES = corpus.CASES


def grad_input(case: corpus.Case, level: str = "core", block_size: int = 0,
               grid_size: int = 0, shuffle_seed: int = 0) -> torch.Tensor:
    """grad_input for the case by the host build of the core's build ``level``
    (detgrid.levels.CORE_BUILDS), with its launches shaped by block_size, grid_size
    and shuffle_seed (0: their own)."""
    grad_output, inp, grid = corpus.make_inputs(case)
    return torch.ops.detgrid._core_grad_input(
        grad_output, inp, grid, corpus.MODES[case.mode], corpus.PADDINGS[case.padding],
        case.align_corners, block_size, grid_size, shuffle_seed, level=level)


def compute(case: corpus.Case, level: str = "core", *launch: int) -> str:
    """The digest of grad_input(case, level, *launch): each build must give the core's."""
    return corpus.tensor_digest(grad_input(case, level, *launch))


_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32,
           torch.float16: torch.int16, torch.bfloat16: torch.int16}


def differ_only_in_nan_signs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b have the same dtype, shape, NaNs and bits but for the sign bit
    of some NaNs. The host build's x86 arithmetic gives a NaN result the sign of the
    NaN operand the instruction names first (a NaN it makes, as from inf * 0, is
    negative), and the compiler may swap the operands of a commutative add or
    multiply: which of two NaNs of opposite signs a sum keeps is the host code's
    choice, not the order of the sum's terms."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous(), b.contiguous()
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    int_dtype = _INT_OF[a.dtype]
    a_bits, b_bits = a.view(int_dtype), b.view(int_dtype)
    same = a_bits == b_bits
    sign_only = (a_bits ^ b_bits) == torch.iinfo(int_dtype).min  # the sign bit alone
    return bool(torch.all(torch.where(a.isnan(), same | sign_only, same)))


def table() -> dict:
    return {case.name: compute(case) for case in CASES}


def load(path: str = DIGESTS_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="recompute and compare with core_digests.json")
    args = parser.parse_args(argv)
    entries = table()
    if not args.check:
        with open(DIGESTS_PATH, "w") as f:
            f.write(corpus.dumps(entries))
        print(f"wrote {len(entries)} cases to {DIGESTS_PATH}")
        return 0
    golden = load()
    differ = sorted(n for n in set(golden) | set(entries) if golden.get(n) != entries.get(n))
    for name in differ:
        print(f"DIFFERS {name}")
    print(f"{len(entries) - len(differ)} of {len(entries)} cases match")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
