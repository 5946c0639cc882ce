"""apt with a private state directory, for the kit's Debian downloads.

upstream_tree fetches Debian's pytorch source package and intree_compile
Debian's nvcc; both run apt-get against a state directory of their own, so
that the system's apt configuration is neither read nor written and no root
is needed.
"""

import os
from pathlib import Path
from typing import List

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def private_options(state: Path) -> List[str]:
    """apt-get/apt-cache options that read sources.list and preferences.d in
    `state` and keep lists, cache and (no) dpkg status there too."""
    user = "root" if os.geteuid() == 0 else (os.environ.get("USER") or "nobody")
    return [
        "-o", f"Dir::Etc::SourceList={state / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=-",
        "-o", f"Dir::Etc::PreferencesParts={state / 'preferences.d'}",
        "-o", "Dir::Etc::Preferences=/dev/null",
        "-o", f"Dir::State::Lists={state / 'lists'}",
        "-o", "Dir::State::status=/dev/null",
        "-o", f"Dir::Cache={state / 'cache'}",
        "-o", "APT::Architecture=amd64",
        "-o", "APT::Architectures=amd64",
        "-o", "Acquire::Languages=none",
        "-o", f"APT::Sandbox::User={user}",
        "-o", "Debug::NoLocking=1",
    ]
