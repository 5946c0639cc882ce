"""Whether detgrid runs from the kit's source tree, for the verbs that need it.

`pip install .` installs the runtime package (ops, the switch, the
extension), detgrid.kit with the CLI and detgrid.bench, but not the source
tree around them: repro/, patches/, aten_kernels/, setup.py. The verbs
that read or write those (report, patch, build --mode extension) say so in
one line instead of failing somewhere inside, or writing ISSUE.md next to
site-packages.
"""

import os
from typing import Optional, Sequence

KIT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# What each verb reads from the tree.
NEEDS = {
    "report": ("repro", "patches"),
    "patch": ("aten_kernels",),
    "build --mode extension": ("setup.py", "aten_kernels"),
}


def missing(parts: Sequence[str], root: str) -> list:
    return [part for part in parts if not os.path.exists(os.path.join(root, part))]


def needs_source_tree(verb: str, root: Optional[str] = None) -> Optional[str]:
    """None when `verb` can run here; else one line (to follow "detgrid VERB: ") that
    says why not and what to do."""
    root = root or KIT_ROOT
    absent = missing(NEEDS[verb], root)
    if not absent:
        return None
    return (f"needs the kit's source tree ({', '.join(NEEDS[verb])}), and this detgrid is an "
            f"installed copy in {root} without {', '.join(absent)}: run `detgrid {verb}` from a "
            "clone of the kit (bash tools/setup.sh there, then .venv/bin/detgrid ...)")
