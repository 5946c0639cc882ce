"""The seeds' recipe: everything PyTorch's reproducibility notes ask for, in one helper.

    from seeding import seed_everything, dataloader_kwargs, check_determinism
    seed_everything(0)                                    # before any CUDA work
    loader = DataLoader(ds, num_workers=2, **dataloader_kwargs(0))
    result = check_determinism(lambda: model(x).sum(), runs=10)   # result["deterministic"]

Needs torch only; numpy is seeded when it is installed.
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
    (a tensor or a sequence of tensors). Deterministic iff all hashes agree."""
    if runs < 2:
        raise ValueError("check_determinism needs at least 2 runs to compare")
    hashes = [sha256(*_tensors(fn())) for _ in range(runs)]
    distinct = len(set(hashes))
    return {"runs": runs, "hashes": hashes, "distinct": distinct, "deterministic": distinct == 1}
