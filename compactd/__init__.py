"""compactd — a local sidecar daemon that owns LLM agent conversations and their context windows.

The repository's top-level folders are this package's subpackages: `compactd.context` (the pure
engine), `compactd.protocol` (wire types), `compactd.daemon` (the JSON-RPC server) and
`compactd.clients` (the Python client and CLI). Here: what every layer may ask of the
installation itself — its version, and how to add an optional package to it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

__version__ = "0.1.0"


def install_advice(*requirements: str) -> str:
    """The command that adds `requirements` to the environment compactd runs in, as it was
    installed: `pipx inject compactd …` under pipx (its venv holds `pipx_metadata.json`), else
    this interpreter's own pip — never a bare `pip`, which may be another Python's, nor
    `pip install 'compactd[…]'`, which no package index has."""
    wanted = " ".join(shlex.quote(r) for r in requirements)
    if (Path(sys.prefix) / "pipx_metadata.json").is_file():
        return f"pipx inject compactd {wanted}"
    return f"{shlex.quote(sys.executable)} -m pip install {wanted}"
