"""detgrid: a deterministic backward for torch.nn.functional.grid_sample.

    import detgrid
    detgrid.enable()            # or: with detgrid.enabled(): ...
    torch.use_deterministic_algorithms(True)
    F.grid_sample(x, grid).sum().backward()   # no error, bitwise reproducible

`detgrid.ops.grid_sampler_2d_backward` is the backward itself, with the
contract of `torch.ops.aten.grid_sampler_2d_backward` (CPU tensors run the
host executor, CUDA tensors the kernel). `seed_everything`,
`dataloader_kwargs` and `check_determinism` are the seeds' recipe
(detgrid.seeding): the rest of what a reproducible training run needs.
"""

from detgrid import ops
from detgrid.seeding import check_determinism, dataloader_kwargs, seed_everything
from detgrid.switch import disable, enable, enabled, is_enabled

__all__ = ["ops", "enable", "disable", "enabled", "is_enabled",
           "seed_everything", "dataloader_kwargs", "check_determinism"]
__version__ = "0.1.0"
