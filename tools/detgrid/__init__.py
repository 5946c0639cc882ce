"""detgrid: a deterministic backward for torch.nn.functional.grid_sample.

    import detgrid
    detgrid.enable()            # or: with detgrid.enabled(): ...
    torch.use_deterministic_algorithms(True)
    F.grid_sample(x, grid).sum().backward()   # no error, bitwise reproducible

`detgrid.ops.grid_sampler_2d_backward` is the backward itself, with the
contract of `torch.ops.aten.grid_sampler_2d_backward` (CPU tensors run the
host build of the CUDA source, CUDA tensors the kernel). `seed_everything`,
`dataloader_kwargs` and `check_determinism` are the seeds' recipe
(detgrid.seeding): the rest of what a reproducible training run needs.

`import detgrid` loads the runtime (torch, the build guard, the extension) at
once, so that a build made for another torch is refused at import. The one
exception is `python -m detgrid`, the kit's command line: Python imports this
package before its __main__, with the current directory first on sys.path,
and contributors run it from a PyTorch checkout whose uninstalled torch/ would
be imported instead of theirs. Its verbs patch and report need no torch to
start, so there the runtime is loaded on first use (__getattr__ below).
"""

import importlib
import sys

__all__ = ["ops", "enable", "disable", "enabled", "is_enabled",
           "seed_everything", "dataloader_kwargs", "check_determinism"]
__version__ = "0.1.0"

# The runtime's public names and the module each comes from.
_RUNTIME = {"ops": "detgrid.ops", "enable": "detgrid.switch", "disable": "detgrid.switch",
            "enabled": "detgrid.switch", "is_enabled": "detgrid.switch",
            "seed_everything": "detgrid.seeding", "dataloader_kwargs": "detgrid.seeding",
            "check_determinism": "detgrid.seeding"}


def __getattr__(name):
    """The runtime's names, loaded on first use where the import below did not run."""
    if name not in _RUNTIME:
        raise AttributeError(f"module 'detgrid' has no attribute {name!r}")
    module = importlib.import_module(_RUNTIME[name])
    return module if name == "ops" else getattr(module, name)


# While `python -m` locates the module to run (importing its packages, this
# one included), sys.argv[0] is "-m" (Python's command-line docs, option -m).
if getattr(sys, "argv", [])[:1] != ["-m"]:
    from detgrid import ops
    from detgrid.seeding import check_determinism, dataloader_kwargs, seed_everything
    from detgrid.switch import disable, enable, enabled, is_enabled
