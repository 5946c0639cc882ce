"""The torch the kit's verbs run against, or a one-line reason it cannot be used.

`python -m detgrid` puts the current directory first on sys.path. Run from a
PyTorch checkout, `import torch` then finds the checkout's own torch/ package,
which is not a build: it fails to import, or imports without __version__. The
verbs that need torch (verify, bench, report, build) ask here, so that the
user reads what happened instead of a traceback.
"""

from types import ModuleType


class TorchUnusable(Exception):
    """The torch Python finds is not an installed build; the message is one line."""


def load() -> ModuleType:
    """The installed torch; TorchUnusable, naming where Python found it, otherwise."""
    try:
        import torch

        torch.__version__  # noqa: B018 - a checkout's torch/ lacks it
        return torch
    except (ImportError, AttributeError) as e:
        where = _found_at()
        raise TorchUnusable(
            f"the torch Python imports here ({where}) is not an installed build "
            f"({type(e).__name__}: {e}); a PyTorch checkout in the current directory shadows "
            "the installed one: run detgrid from another directory, or as the `detgrid` "
            "command") from None


def _found_at() -> str:
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return "unknown location"
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else (spec.origin if spec else "nowhere")
