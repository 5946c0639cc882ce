"""The fix: under deterministic mode, no error, no warning, one grad_input hash.

On CUDA the fix is detgrid.enable() when detgrid is installed with CUDA kernels,
else this torch itself (a patched torch needs nothing; a stock one raises, and
the claims fail with the error captured). Without CUDA the CUDA claims are not
checkable; if detgrid is installed, detgrid.enable("cpu") routes the CPU
backward to detgrid's host build, and that is checked instead (no error, no
warning, one hash, the same bits as detgrid.ops). --dims 3 runs the 3-D case (5-D
input, grid_sampler_3d_backward) instead of the 2-D one.
Exit codes: 0 checked claims hold, 1 a claim failed, 77 nothing checkable here.

    python repro/show_fix.py [--runs K] [--dims 2|3] [--json]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ALERTS, FAIL, NOT_CHECKABLE, PASS, claim, environment,  # noqa: E402
                    detgrid_grad_input, finish, grad_input_capturing, import_detgrid, make_case)
from seeding import seed_everything, sha256  # noqa: E402


def choose_fix(device, detgrid):
    if detgrid is not None and (device == "cpu" or detgrid.ops.has_cuda_kernels()):
        detgrid.enable(device)
        return f"detgrid.enable({device!r})"
    if device == "cpu":
        return None
    return "this torch as is (fixed only if patched)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2-D or 3-D sampling")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    detgrid = import_detgrid()
    fix = choose_fix(device, detgrid)
    kernel = ALERTS[args.dims].split()[0]
    result = {"script": "show_fix", **environment(), "device": device, "dims": args.dims,
              "runs": args.runs, "fix": fix}
    where = "on CUDA" if device == "cuda" else "on CPU via detgrid.enable('cpu')"
    texts = [f"deterministic mode: F.grid_sample backward {where} raises no error",
             f"warn_only=True: no {kernel} warning {where}",
             f"one grad_input hash over K runs {where}"]
    if fix is None:
        why = "no CUDA and detgrid not installed: nothing to show here"
        result["claims"] = [claim(t, NOT_CHECKABLE, why) for t in texts]
        return finish(result, args.json, ["show_fix: " + why])
    case = make_case(device, args.dims)
    seed_everything(0, deterministic=True, warn_only=False)
    _, error, _ = grad_input_capturing(*case)
    torch.use_deterministic_algorithms(True, warn_only=True)
    runs = [grad_input_capturing(*case) for _ in range(args.runs)]
    warned = sorted({w for _, _, ws in runs for w in ws})
    hashes = [sha256(g) if g is not None else None for g, _, _ in runs]
    result.update(error_message=error, warning_messages=warned, hashes=hashes,
                  distinct=len(set(hashes)))
    claims = [claim(texts[0], FAIL if error else PASS, error or ""),
              claim(texts[1], FAIL if any(kernel in w for w in warned) else PASS,
                    "; ".join(warned)),
              claim(texts[2], PASS if len(set(hashes)) == 1 and None not in hashes else FAIL,
                    f"{len(set(hashes))} distinct")]
    if device == "cpu":
        ops_grad_input = detgrid_grad_input(detgrid, *case)
        routed = sha256(ops_grad_input) == hashes[0]
        result["detgrid_ops_hash"] = sha256(ops_grad_input)
        claims += [claim("the CPU backward ran detgrid's host build (same hash as detgrid.ops)",
                         PASS if routed else FAIL),
                   claim("the same on CUDA", NOT_CHECKABLE, "no CUDA device")]
    result["claims"] = claims
    lines = [f"show_fix: {fix}, deterministic mode, {args.runs} runs on {device}"
             + (" (3-D: 5-D input)" if args.dims == 3 else ""),
             f"  error: {error}", f"  warnings: {warned}",
             f"  {len(set(hashes))} distinct grad_input hash(es): {hashes[0]}"]
    return finish(result, args.json, lines)


if __name__ == "__main__":
    sys.exit(main())
