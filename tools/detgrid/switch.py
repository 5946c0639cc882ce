"""detgrid.enable(): route stock grid_sample backward kernels to detgrid.

While enabled, aten::grid_sampler_2d_backward, aten::grid_sampler_3d_backward
and aten::cudnn_grid_sampler_backward on CUDA run the deterministic backward
whenever torch.are_deterministic_algorithms_enabled(), and the stock kernels
otherwise. The switch is the only global state of the package.
"""

import contextlib
import warnings
from typing import Iterable, Iterator, List, Sequence, Union

import torch

from detgrid import ops

_DEVICES = ("cpu", "cuda")
_enabled: set = set()


Devices = Union[str, Iterable[str], None]


def _validated(devices: Devices, default: Sequence[str]) -> List[str]:
    """`devices` as a list (a single string is one device), every one of them
    checked before the caller changes any state: a call that raises leaves
    the switch as it was."""
    if devices is None:
        wanted = list(default)
    elif isinstance(devices, str):
        wanted = [devices]
    else:
        wanted = list(devices)
    for device in wanted:
        if device not in _DEVICES:
            raise ValueError(f"detgrid: device must be one of {_DEVICES}, got {device!r}")
    return wanted


def _set_override(device: str, on: bool) -> None:
    torch.ops.detgrid._set_aten_override(device, on)
    (_enabled.add if on else _enabled.discard)(device)


def _switch(devices: Sequence[str], on: bool) -> None:
    """Turns the override of every device on (off), or of none: if one fails,
    those already switched by this call are switched back."""
    switched: List[str] = []
    try:
        for device in devices:
            if (device in _enabled) != on:
                _set_override(device, on)
                switched.append(device)
    except BaseException:
        for device in reversed(switched):
            _set_override(device, not on)
        raise


def enable(devices: Devices = None) -> None:
    """Route grid_sample's backward on `devices` (default: CUDA) to detgrid.

    "cpu" exists so that the switch can be exercised without a GPU; stock's
    CPU backward is deterministic already. Without CUDA kernels in this
    build, enabling CUDA only warns: there is nothing to route.
    """
    routed = []
    for device in _validated(devices, ("cuda",)):
        if device == "cuda" and not ops.has_cuda_kernels():
            warnings.warn(
                "detgrid was built without CUDA kernels (no CUDA torch or nvcc at "
                "build time); grid_sample on CUDA keeps the stock backward",
                stacklevel=2,
            )
            continue
        routed.append(device)
    _switch(routed, True)


def disable(devices: Devices = None) -> None:
    """Restore the stock kernels on `devices` (default: every enabled one)."""
    _switch(_validated(devices, sorted(_enabled)), False)


def is_enabled(device: str = "cuda") -> bool:
    return device in _enabled


@contextlib.contextmanager
def enabled(devices: Devices = None) -> Iterator[None]:
    """Context manager form of enable(); restores the previous state."""
    wanted = _validated(devices, ("cuda",))
    newly = [d for d in wanted if d not in _enabled]
    enable(newly)
    try:
        yield
    finally:
        disable([d for d in newly if d in _enabled])
