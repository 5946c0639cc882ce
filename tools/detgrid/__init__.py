"""detgrid: a deterministic backward for torch.nn.functional.grid_sample.

    import detgrid
    detgrid.enable()            # or: with detgrid.enabled(): ...
    torch.use_deterministic_algorithms(True)
    F.grid_sample(x, grid).sum().backward()   # no error, bitwise reproducible

`detgrid.ops.grid_sampler_2d_backward` is the backward itself, with the
contract of `torch.ops.aten.grid_sampler_2d_backward` (CPU tensors run the
host executor, CUDA tensors the kernel).
"""

from detgrid import ops
from detgrid.switch import disable, enable, enabled, is_enabled

__all__ = ["ops", "enable", "disable", "enabled", "is_enabled"]
__version__ = "0.1.0"
