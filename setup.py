"""The package list, computed so that a new subpackage cannot be forgotten.

Every piece of metadata lives in `pyproject.toml`; this file only supplies `packages`. The
repository's top-level folders are mapped onto `compactd.*` by `[tool.setuptools.package-dir]`
(DESIGN §1: nothing called `context` lands in site-packages), and every folder below one of them
that holds an `__init__.py`, reached through folders that do, is a package. A list written by
hand kept working in an editable install and silently lost what it forgot from a built wheel.
"""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

from setuptools import setup
from setuptools.warnings import InformationOnly

ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    """Every package under the folders `package-dir` maps (`tests/packaging` checks the wheel)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    found: set[str] = set()
    for name, folder in package_dir.items():
        found.update(_walk(name, ROOT / folder))
    return sorted(found)


def _walk(name: str, folder: Path) -> list[str]:
    """`name` and its subpackages, if `folder` is a regular package (so not node_modules)."""
    if not (folder / "__init__.py").is_file():
        return []
    found = [name]
    for child in sorted(folder.iterdir()):
        if child.is_dir() and child.name.isidentifier():
            found.extend(_walk(f"{name}.{child.name}", child))
    return found


# `pip install -e .` maps `compactd.context` → context/ with a meta-path finder, and setuptools
# always tells that finder's users to beware of working-directory folders named like the
# package. Ours (compactd/) is the package's own source, so the notice can only mislead; every
# other setuptools warning still shows (tests/packaging fails on any).
warnings.filterwarnings(
    "ignore",
    message=r"Editable installation\.\s+!!\s+\*+\s+Please be careful with folders",
    category=InformationOnly,
)

setup(packages=packages())
