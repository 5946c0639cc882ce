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

Device = Union[str, torch.device]
Devices = Union[Device, Iterable[Device], None]


def _device_type(device: object) -> str:
    """"cpu" or "cuda" for one device in any form torch names it. An index
    ("cuda:1") is accepted and means every device of its type: the override
    is registered per dispatch key, which covers all devices of a type."""
    device_type = None
    if isinstance(device, (str, torch.device)):
        try:
            device_type = torch.device(device).type
        except RuntimeError:  # torch.device("bogus")
            pass
    if device_type not in _DEVICES:
        raise ValueError(f"detgrid: device must be one of {_DEVICES}, by name (\"cuda\", "
                         f"\"cuda:0\") or as a torch.device, one or a sequence; got {device!r}")
    return device_type


def _validated(devices: Devices, default: Sequence[str]) -> List[str]:
    """`devices` as a list of device types (a single name or torch.device is
    one device), every one of them checked before the caller changes any
    state: a call that raises leaves the switch as it was."""
    if devices is None:
        wanted = list(default)
    elif isinstance(devices, (str, torch.device)):
        wanted = [devices]
    else:
        try:
            wanted = list(devices)
        except TypeError:  # neither a device nor a sequence of them
            wanted = [devices]
    return list(dict.fromkeys(_device_type(device) for device in wanted))


def _routable(devices: Sequence[str], stacklevel: int) -> List[str]:
    """The devices whose override this build can set. Without CUDA kernels,
    CUDA is dropped with a warning attributed `stacklevel` frames up (the
    user's line that asked for it)."""
    if "cuda" not in devices or ops.has_cuda_kernels():
        return list(devices)
    warnings.warn(
        "detgrid was built without CUDA kernels (no CUDA torch or CUDA compiler at build "
        "time), so grid_sample on CUDA keeps the stock backward. To route it, reinstall "
        "detgrid in the environment of your CUDA torch: pip install --no-build-isolation . "
        "(README, Install); `detgrid --version` tells what this build has.",
        stacklevel=stacklevel + 1,
    )
    return [device for device in devices if device != "cuda"]


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

    A device is "cpu" or "cuda", by name ("cuda", "cuda:0": an index means
    every device of its type) or as a torch.device; one device or a sequence.
    "cpu" exists so that the switch can be exercised without a GPU; stock's
    CPU backward is deterministic already. Without CUDA kernels in this
    build, enabling CUDA only warns: there is nothing to route.
    """
    _switch(_routable(_validated(devices, ("cuda",)), stacklevel=2), True)


def disable(devices: Devices = None) -> None:
    """Restore the stock kernels on `devices` (default: every enabled one)."""
    _switch(_validated(devices, sorted(_enabled)), False)


def is_enabled(device: Device = "cuda") -> bool:
    """Whether grid_sample's backward on `device` (a name or torch.device) is routed."""
    return torch.device(device).type in _enabled


@contextlib.contextmanager
def enabled(devices: Devices = None) -> Iterator[None]:
    """Context manager form of enable(); restores the previous state."""
    wanted = _routable(_validated(devices, ("cuda",)), stacklevel=3)  # past contextlib
    newly = [d for d in wanted if d not in _enabled]
    _switch(newly, True)
    try:
        yield
    finally:
        disable([d for d in newly if d in _enabled])
