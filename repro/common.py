"""Shared by the repro scripts: the high-collision case (2-D or 3-D), claims and exit codes.

Exit codes (every script): 0 = every claim that could be checked here held and at least one was
checked; 1 = a claim failed; 77 = nothing could be checked here (e.g. no CUDA and no detgrid; the
automake/ctest SKIP code). A claim is "pass", "fail" or "not checkable here" (with the reason).
"""

import json
import warnings

import torch
import torch.nn.functional as F

EXIT_OK, EXIT_FAILED, EXIT_NOT_CHECKABLE = 0, 1, 77
PASS, FAIL, NOT_CHECKABLE = "pass", "fail", "not checkable here"
ALERTS = {d: f"grid_sampler_{d}d_backward_cuda does not have a deterministic implementation"
          for d in (2, 3)}  # stock's deterministic-mode alert of each CUDA kernel, by dims
ALERT = ALERTS[2]
MODE, PADDING, ALIGN = "bilinear", "zeros", False  # the native kernel (cuDNN needs align_corners)
# zoom-in cases by dims (2: 4-D input, 3: 5-D input): (size, out, zoom, batch, channels), with
# (out / (zoom * size))^dims sample points per input cell: 256 in 2-D, 512 in 3-D
CASES = {2: (32, 128, 0.25, 2, 8), 3: (8, 16, 0.25, 2, 4)}


def import_detgrid():
    """detgrid if installed (optional), else None."""
    try:
        import detgrid
        return detgrid
    except ImportError:
        return None


def make_case(device, dims=2, seed=0):
    """The zoom-in case CASES[dims], where atomicAdd order varies most: (x, grid, grad_out)."""
    size, out, zoom, batch, channels = CASES[dims]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, *[size] * dims, generator=g)
    theta = torch.cat([zoom * torch.eye(dims), torch.zeros(dims, 1)], 1).expand(batch, -1, -1)
    grid = F.affine_grid(theta, (batch, channels, *[out] * dims), align_corners=ALIGN)
    grid = grid + 0.01 * torch.randn(grid.shape, generator=g)
    grad_out = torch.randn(batch, channels, *[out] * dims, generator=g)
    return x.to(device), grid.to(device), grad_out.to(device)


def points_per_cell(dims=2):
    return round((CASES[dims][1] / (CASES[dims][2] * CASES[dims][0])) ** dims)


def detgrid_grad_input(detgrid, x, grid, grad_out):
    """grad_input of detgrid.ops.grid_sampler_{2,3}d_backward (by x's rank): bilinear, zeros."""
    op = getattr(detgrid.ops, f"grid_sampler_{x.dim() - 2}d_backward")
    return op(grad_out, x, grid, 0, 0, ALIGN, (True, True))[0]


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
    return EXIT_FAILED if FAIL in statuses else EXIT_OK if PASS in statuses else EXIT_NOT_CHECKABLE


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
