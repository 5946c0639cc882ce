"""The seeds' recipe the scripts use: detgrid's own, tools/detgrid/seeding.py, loaded by path.

It needs torch only, so the scripts run where detgrid is not installed (a patched torch), and
loading it never loads detgrid's extension (show_error.py shows stock alone). Users import it
from the package: `from detgrid import seed_everything, dataloader_kwargs, check_determinism`.
"""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tools", "detgrid",
                     "seeding.py")
_spec = importlib.util.spec_from_file_location("detgrid_seeding", _PATH)
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)

seed_everything = recipe.seed_everything
dataloader_kwargs = recipe.dataloader_kwargs
check_determinism = recipe.check_determinism
sha256 = recipe.sha256
