"""The built wheel holds every package and data file, and building it prints no setuptools warning.

An editable install imports straight from the source folders, so a package or data file that the
build configuration misses still works there and silently vanishes from the wheel: only building
the wheel shows it. The build runs offline (`--no-index --no-build-isolation`, with the
setuptools of the `test` extra) on a copy of the working tree, so untracked new folders count
and the repository gets no build/ or egg-info.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Source folder → where it lands in the wheel (DESIGN §1: all under one `compactd` namespace),
# read from the build configuration; `test_every_top_level_package_is_built` checks that the
# configuration names every top-level package of the tree.
PACKAGE_FOLDERS = {
    folder: package.replace(".", "/")
    for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"].items()
}
NOT_PYTHON = {"clients/node", "clients/vscode"}
DATA_FILES = {
    "context/data/cl100k_base.tiktoken",
    "context/data/README.md",
    "protocol/schema.json",
    "compactd/py.typed",
}
DATA_GLOBS = ["context/summarizer/prompts/*.md"]  # may not exist yet
NOT_COPIED = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    "build",
    "dist",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    ".run",
}
# A setuptools/distutils warning in the (indented) backend output. pip's own top-level
# `WARNING:` lines are about the environment, not the build configuration.
WARNING = re.compile(
    r"\w+Warning\b|InformationOnly|is absent from the `packages`|as data is deprecated"
    r"|deprecat|^\s+warning:|^\s*!!\s*$",
    re.IGNORECASE | re.MULTILINE,
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], str]:
    """The wheel's file names and the build's whole output."""
    base = tmp_path_factory.mktemp("wheel")
    source, out = base / "src", base / "out"
    shutil.copytree(
        ROOT,
        source,
        ignore=lambda _dir, names: [
            name for name in names if name in NOT_COPIED or name.endswith(".egg-info")
        ],
    )
    # distutils reports "byte-compiling is disabled" as a warning when this is set; a normal
    # build environment does not set it, and the wheel holds no bytecode either way.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    offline = ["--no-deps", "--no-index", "--no-build-isolation"]
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", *offline, "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    (built,) = out.glob("compactd-*.whl")
    with zipfile.ZipFile(built) as archive:
        return set(archive.namelist()), output


def _python_folders() -> dict[Path, str]:
    """Every source folder holding `.py` files → the package folder it must become."""
    found = {}
    for folder, target in PACKAGE_FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.parent.relative_to(ROOT)
            if any(part in NOT_COPIED for part in relative.parts):
                continue
            if any(relative.is_relative_to(excluded) for excluded in NOT_PYTHON):
                continue
            inner = path.parent.relative_to(ROOT / folder)
            found[relative] = "/".join([target, *inner.parts])
    return found


def _in_wheel(source: str) -> str:
    folder, _, rest = source.partition("/")
    return f"{PACKAGE_FOLDERS[folder]}/{rest}"


def test_every_python_folder_is_a_package_with_all_its_modules(
    wheel: tuple[set[str], str],
) -> None:
    names, _output = wheel
    folders = _python_folders()
    assert Path("context/importers") in folders  # the walk sees the tree
    assert {Path("context/stores"), Path("context/replay"), Path("service/providers")} <= set(
        folders
    )
    missing = []
    for folder, target in folders.items():
        if f"{target}/__init__.py" not in names:
            missing.append(f"{target}/__init__.py (does {folder} lack an __init__.py?)")
        for module in sorted((ROOT / folder).glob("*.py")):
            if f"{target}/{module.name}" not in names:
                missing.append(f"{target}/{module.name}")
    assert missing == []


def test_every_top_level_package_is_built() -> None:
    """A front or layer added beside the others (a folder with an `__init__.py`) is in
    `package-dir`, so it cannot be left out of the wheel."""
    tree = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in ("tests", "bench")
    }
    assert tree == set(PACKAGE_FOLDERS), tree ^ set(PACKAGE_FOLDERS)


def test_the_data_files_are_shipped(wheel: tuple[set[str], str]) -> None:
    names, _output = wheel
    expected = set(DATA_FILES)
    for pattern in DATA_GLOBS:
        expected.update(str(path.relative_to(ROOT)) for path in ROOT.glob(pattern))
    assert {_in_wheel(source) for source in expected} - names == set()


def test_nothing_but_the_package_and_its_metadata(wheel: tuple[set[str], str]) -> None:
    names, _output = wheel
    top = {name.split("/")[0] for name in names}
    dist_info = {entry for entry in top if entry.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == {"compactd"}
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_the_build_prints_no_setuptools_warning(wheel: tuple[set[str], str]) -> None:
    _names, output = wheel
    assert "running bdist_wheel" in output  # -v shows the backend's own output
    assert [line for line in output.splitlines() if WARNING.search(line)] == []


def test_the_license_ships_and_the_readme_stands_alone(wheel: tuple[set[str], str]) -> None:
    """The metadata says MIT, so the text goes with it; the README (the package's long
    description) points at no file outside the repository."""
    names, _output = wheel
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), sorted(names)
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "../" not in readme and "DESIGN.md" not in readme and "notes/" not in readme
    for path in re.findall(r"`((?:docs|protocol|context|clients|tests)/[\w/-]+\.\w+)`", readme):
        assert (ROOT / path.rstrip("/")).exists(), f"the README names {path}, which is missing"
