"""Golden digests of the core (aten_kernels/aten/, issue 59), run by its
host build, over the inputs of the golden corpus (corpus.py: every case but
5-D bicubic, which the core refuses).

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

CASES = tuple(c for c in corpus.CASES if not (c.dims == 3 and c.mode == "bicubic"))


def compute(case: corpus.Case) -> str:
    """The digest of the core's grad_input for the case."""
    grad_output, inp, grid = corpus.make_inputs(case)
    grad_input = torch.ops.detgrid._core_grad_input(
        grad_output, inp, grid, corpus.MODES[case.mode], corpus.PADDINGS[case.padding],
        case.align_corners)
    return corpus.tensor_digest(grad_input)


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
