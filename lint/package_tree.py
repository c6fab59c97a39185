"""A ``dstl`` package of symlinks to the work tree's folders, as ``pyproject.toml``'s package-dir maps them.

Tools that read the source as the installed ``dstl`` namespace (the type checker,
the mutation runner's scratch copy) import it through such a tree: the folder
names (``spi``, ``dstl_local``...) are not the import names (``dstl.spi``...).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """Import name -> folder, from ``pyproject.toml`` (the one place that maps them)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return dict(config["tool"]["setuptools"]["package-dir"])


def link_packages(into: Path, source: Path = ROOT, root: Path = ROOT) -> Path:
    """Make ``into/dstl/...`` symlinks to the folders under ``source``; returns ``into``."""
    for package, folder in package_dirs(root).items():
        link = into.joinpath(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source / folder, target_is_directory=True)
    return into
