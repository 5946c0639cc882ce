"""Nondeterminism made visible: SHA-256 of grad_input over K runs, stock vs deterministic.

A high-collision case (zoom-in grid, ~256 sample points per input cell; --dims 3: a 5-D
input, ~512 per voxel), run K times (default 10). On CUDA: stock (atomicAdd) is expected
to give several distinct hashes, the deterministic path (detgrid.enable() if detgrid has
CUDA kernels, else a patched torch, detected by the stock backward not raising under
deterministic mode) exactly one; plus max |deterministic - stock|.
Without CUDA: stock's CPU kernel is deterministic, so the stock claim is not checkable
here; detgrid's CPU host build (detgrid.ops.grid_sampler_{2,3}d_backward, the CUDA
kernel's math and order) is run instead, if detgrid is installed.
Exit codes: 0 checked claims hold, 1 a claim failed, 77 nothing checkable here.

    python repro/show_nondeterminism.py [--runs K] [--dims 2|3] [--device auto|cpu|cuda] [--json]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (FAIL, NOT_CHECKABLE, PASS, claim, environment,  # noqa: E402
                    detgrid_grad_input, finish, grad_input, grad_input_capturing,
                    import_detgrid, make_case, points_per_cell)
from seeding import check_determinism, seed_everything  # noqa: E402

STOCK = "stock CUDA backward gives several distinct grad_input hashes over K runs"
ONE = "the deterministic path gives one grad_input hash over K runs"
CLOSE = "deterministic grad_input matches stock within 1e-5 * max|stock|"


def deterministic_path(device, case):
    """(name, fn) of the deterministic backward available here, or (reason, None)."""
    detgrid = import_detgrid()
    if device == "cpu":
        if detgrid is None:
            return "detgrid not installed: no CPU host build to run", None
        return "detgrid CPU host build (detgrid.ops)", lambda: detgrid_grad_input(detgrid, *case)
    torch.use_deterministic_algorithms(True)  # detgrid routes, and patched torch dispatches, on it
    if detgrid is not None and detgrid.ops.has_cuda_kernels():
        detgrid.enable()
        return "detgrid extension (detgrid.enable())", lambda: grad_input(*case)
    if grad_input_capturing(*case)[1] is None:
        return "patched torch (in-tree deterministic backward)", lambda: grad_input(*case)
    torch.use_deterministic_algorithms(False)
    return "no deterministic path: detgrid (with CUDA kernels) not installed, torch not patched", None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2-D or 3-D sampling")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    seed_everything(0, deterministic=False)
    case = make_case(device, args.dims)
    stock = check_determinism(lambda: grad_input(*case), args.runs)
    if device == "cuda":
        stock_claim = claim(STOCK, PASS if stock["distinct"] > 1 else FAIL,
                            f"{stock['distinct']} distinct over {args.runs} runs")
    else:
        stock_claim = claim(STOCK, NOT_CHECKABLE, "no CUDA: stock's CPU kernel is deterministic "
                            f"({stock['distinct']} distinct over {args.runs} runs)")
    path, fn = deterministic_path(device, case)
    result = {"script": "show_nondeterminism", **environment(), "device": device, "dims": args.dims,
              "runs": args.runs, "points_per_cell": points_per_cell(args.dims), "stock": stock,
              "deterministic_path": path, "deterministic": None, "max_abs_diff": None}
    claims = [stock_claim]
    if fn is None:
        claims += [claim(ONE, NOT_CHECKABLE, path), claim(CLOSE, NOT_CHECKABLE, path)]
    else:
        det = check_determinism(fn, args.runs)
        value = fn()  # still under deterministic mode
        torch.use_deterministic_algorithms(False)
        reference = grad_input(*case)
        diff = (value - reference).abs().max().item()
        bound = 1e-5 * reference.abs().max().item()
        result.update(deterministic=det, max_abs_diff=diff)
        claims += [claim(ONE, PASS if det["deterministic"] else FAIL,
                         f"{det['distinct']} distinct over {args.runs} runs"),
                   claim(CLOSE, PASS if diff <= bound else FAIL, f"{diff:.3g} <= {bound:.3g}")]
    result["claims"] = claims
    lines = [f"show_nondeterminism: grad_input SHA-256 over {args.runs} runs on {device}, "
             f"~{points_per_cell(args.dims)} points per input cell"
             + (" (3-D: 5-D input)" if args.dims == 3 else "")]
    for name, data in (("stock", stock), (path, result["deterministic"])):
        if data:
            lines += [f"  {name}: {data['distinct']} distinct"] + [f"    {h}" for h in data["hashes"]]
    if result["max_abs_diff"] is not None:
        lines.append(f"  max |deterministic - stock| = {result['max_abs_diff']:.3g}")
    return finish(result, args.json, lines)


if __name__ == "__main__":
    sys.exit(main())
