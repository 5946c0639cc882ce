"""The seeds' recipe: everything PyTorch's reproducibility notes ask for, in one helper,
and a check that a training step really repeats its bits.

    import torch
    import torch.nn.functional as F

    import detgrid

    detgrid.seed_everything(0)  # before any CUDA work; deterministic algorithms on
    detgrid.enable("cpu")       # "cuda" on a GPU machine (the default)
    loader_kwargs = detgrid.dataloader_kwargs(0)  # DataLoader(ds, num_workers=2, **loader_kwargs)
    x = torch.randn(4, 3, 16, 16)
    grid = torch.rand(4, 12, 12, 2) * 2 - 1

    def train_step():
        torch.manual_seed(0)  # the same model and draws on every call
        model = torch.nn.Conv2d(3, 8, 3, padding=1)
        loss = F.grid_sample(model(x), grid, align_corners=False).square().mean()
        loss.backward()
        return [loss] + [p.grad for p in model.parameters()]

    result = detgrid.check_determinism(train_step, runs=5)
    assert result["deterministic"], result["hashes"]

Needs torch only (numpy is seeded when it is installed), so that repro/
can load this file without the compiled extension.
"""

import hashlib
import os
import random

import torch

# cuBLAS needs a fixed workspace for deterministic results (CUDA >= 10.2); it
# is read when cuBLAS is first used, so set it before any CUDA work.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def seed_everything(seed=0, deterministic=True, warn_only=False):
    """Seed python, numpy (if installed), torch and every CUDA device; make cuDNN
    deterministic; optionally turn on torch.use_deterministic_algorithms.
    Returns the settings applied, for the record."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
        numpy_seeded = True
    except ImportError:
        numpy_seeded = False
    torch.manual_seed(seed)           # CPU and, lazily, every CUDA device
    torch.cuda.manual_seed_all(seed)  # explicit; a no-op without CUDA
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
    return {
        "seed": seed, "numpy_seeded": numpy_seeded,
        "CUBLAS_WORKSPACE_CONFIG": os.environ["CUBLAS_WORKSPACE_CONFIG"],
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
    }


def worker_init_fn(worker_id):
    """DataLoader worker seeding: torch seeds each worker from the loader's
    generator (base_seed + worker_id); derive python's and numpy's from it."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass


def dataloader_kwargs(seed=0):
    """generator + worker_init_fn for torch.utils.data.DataLoader(..., **kwargs)."""
    return {"generator": torch.Generator().manual_seed(seed), "worker_init_fn": worker_init_fn}


def sha256(*tensors):
    """SHA-256 over dtype, shape and raw bytes of the tensors, in order (no numpy needed)."""
    digest = hashlib.sha256()
    for t in tensors:
        data = t.detach().cpu().contiguous()
        digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
        digest.update(bytes(data.reshape(-1).view(torch.uint8).clone().untyped_storage()))
    return digest.hexdigest()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return (value,)
    return tuple(t for t in value if t is not None)


def check_determinism(fn, runs=10):
    """Call fn() `runs` times and compare the bitwise SHA-256 of what it returns
    (a tensor or a sequence of tensors, e.g. a training step's loss and its
    parameters' gradients; None entries are skipped). Deterministic iff all
    hashes agree. Returns {"runs", "hashes", "distinct", "deterministic"}."""
    if runs < 2:
        raise ValueError("check_determinism needs at least 2 runs to compare")
    hashes = [sha256(*_tensors(fn())) for _ in range(runs)]
    distinct = len(set(hashes))
    return {"runs": runs, "hashes": hashes, "distinct": distinct, "deterministic": distinct == 1}
