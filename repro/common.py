"""Shared by the repro scripts: the high-collision case, claims and exit codes.

Exit codes (every script): 0 = every claim that could be checked here held and
at least one was checked; 1 = a claim failed; 77 = nothing could be checked on
this machine (e.g. no CUDA and no detgrid), the automake/ctest SKIP convention.
A claim is "pass", "fail" or "not checkable here" (with the reason), never guessed.
"""

import json
import warnings

import torch
import torch.nn.functional as F

EXIT_OK, EXIT_FAILED, EXIT_NOT_CHECKABLE = 0, 1, 77
PASS, FAIL, NOT_CHECKABLE = "pass", "fail", "not checkable here"
ALERT = "grid_sampler_2d_backward_cuda does not have a deterministic implementation"
# bilinear, zeros, align_corners=False: the native kernel (cuDNN needs align_corners=True)
MODE, PADDING, ALIGN = "bilinear", "zeros", False


def import_detgrid():
    """detgrid if installed (optional), else None."""
    try:
        import detgrid
        return detgrid
    except ImportError:
        return None


def make_case(device, size=32, out=128, zoom=0.25, batch=2, channels=8, seed=0):
    """A zoom-in grid: about (out / (zoom * size))^2 sample points per input cell
    (256 by default), the case where atomicAdd order varies most."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, size, size, generator=g)
    theta = torch.tensor([[zoom, 0.0, 0.0], [0.0, zoom, 0.0]]).expand(batch, 2, 3)
    grid = F.affine_grid(theta, (batch, channels, out, out), align_corners=ALIGN)
    grid = grid + 0.01 * torch.randn(grid.shape, generator=g)
    grad_out = torch.randn(batch, channels, out, out, generator=g)
    return x.to(device), grid.to(device), grad_out.to(device)


def points_per_cell(size=32, out=128, zoom=0.25):
    return round((out / (zoom * size)) ** 2)


def grad_input(x, grid, grad_out):
    """Stock autograd: F.grid_sample(x, grid).backward(grad_out) -> x.grad."""
    x = x.detach().requires_grad_(True)
    F.grid_sample(x, grid, mode=MODE, padding_mode=PADDING, align_corners=ALIGN).backward(grad_out)
    return x.grad


def grad_input_capturing(x, grid, grad_out):
    """grad_input() with every warning recorded: (grad or None, error text or None, [warnings])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            grad, error = grad_input(x, grid, grad_out), None
        except RuntimeError as e:
            grad, error = None, str(e)
    return grad, error, [f"{w.category.__name__}: {w.message}" for w in caught]


def claim(text, status, detail=""):
    return {"claim": text, "status": status, "detail": detail}


def exit_code(claims):
    statuses = [c["status"] for c in claims]
    if FAIL in statuses:
        return EXIT_FAILED
    return EXIT_OK if PASS in statuses else EXIT_NOT_CHECKABLE


def finish(result, as_json, lines):
    """Print (JSON or text) and return the exit code the claims call for."""
    result["exit_code"] = exit_code(result["claims"])
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(lines))
        for c in result["claims"]:
            print(f"  [{c['status']}] {c['claim']}" + (f" -- {c['detail']}" if c["detail"] else ""))
        print(f"exit {result['exit_code']}")
    return result["exit_code"]


def environment():
    return {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
            "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
