"""The failure on stock PyTorch, captured verbatim.

Under torch.use_deterministic_algorithms(True), stock F.grid_sample(...).backward()
on CUDA raises RuntimeError "grid_sampler_2d_backward_cuda does not have a
deterministic implementation, ..." (grid_sampler_3d_backward_cuda with --dims 3, a
5-D input); with warn_only=True it emits that UserWarning. Both messages are
captured verbatim. detgrid is never imported here: this is stock.

Without CUDA the claims cannot be checked: the script says so, records what the
CPU kernel does instead (it is deterministic, so nothing is raised), and exits 77.
Exit codes: 0 claims hold, 1 a claim failed (e.g. a patched torch that no longer
raises), 77 not checkable here (no CUDA).

    python repro/show_error.py [--dims 2|3] [--json]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ALERTS, FAIL, NOT_CHECKABLE, PASS, claim, environment,  # noqa: E402
                    finish, grad_input_capturing, make_case)
from seeding import seed_everything  # noqa: E402

RAISES = "deterministic mode: stock backward on CUDA raises the {} RuntimeError"
WARNS = "warn_only=True: stock backward on CUDA emits the {} UserWarning"


def run_under(device, warn_only, dims):
    seed_everything(0, deterministic=True, warn_only=warn_only)
    try:
        return grad_input_capturing(*make_case(device, dims))
    finally:
        torch.use_deterministic_algorithms(False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2-D or 3-D sampling")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    alert, kernel = ALERTS[args.dims], ALERTS[args.dims].split()[0]
    raises, warns = RAISES.format(kernel), WARNS.format(kernel)
    result = {"script": "show_error", **environment(), "dims": args.dims, "alert": alert}
    if not torch.cuda.is_available():
        _, cpu_error, cpu_warnings = run_under("cpu", False, args.dims)
        why = "no CUDA device: the claim is about the CUDA kernel; nothing was faked"
        result.update(device="cpu", error_message=None, warning_messages=[], cpu_observation={
            "note": "stock CPU backward under deterministic mode (deterministic kernel, no alert)",
            "error_message": cpu_error, "warning_messages": cpu_warnings})
        result["claims"] = [claim(raises, NOT_CHECKABLE, why), claim(warns, NOT_CHECKABLE, why)]
        lines = ["show_error: no CUDA here, so the CUDA error cannot be shown"
                 + (f" ({kernel}, 5-D input)." if args.dims == 3 else "."),
                 f"  on CPU under deterministic mode: error={cpu_error!r}, warnings={cpu_warnings}"]
        return finish(result, args.json, lines)

    _, error, _ = run_under("cuda", False, args.dims)
    grad, _, warned = run_under("cuda", True, args.dims)
    alerts = [w for w in warned if alert in w]
    result.update(device="cuda", error_message=error, warning_messages=warned)
    result["claims"] = [
        claim(raises, PASS if error and alert in error else FAIL,
              "raised" if error else "no error: is this torch patched, or detgrid enabled?"),
        claim(warns, PASS if alerts and grad is not None else FAIL,
              f"{len(alerts)} matching UserWarning(s)"),
    ]
    lines = ["show_error: stock F.grid_sample backward on CUDA, deterministic mode"
             + (" (3-D: 5-D input)" if args.dims == 3 else ""),
             f"  RuntimeError (verbatim): {error}",
             "  warn_only=True warnings (verbatim):"] + [f"    {w}" for w in warned]
    return finish(result, args.json, lines)


if __name__ == "__main__":
    sys.exit(main())
