"""Type-check the product packages with mypy, as the installed ``dstl`` namespace.

``python -m lint.typecheck`` (``make lint`` runs it, and a test in CI): exit 0 when
mypy finds no error. Settings are ``[tool.mypy]`` in ``pyproject.toml``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from .package_tree import ROOT, link_packages


def main() -> int:
    """Run mypy over every ``dstl.*`` package; returns its exit code."""
    with tempfile.TemporaryDirectory(prefix="dstl-typecheck-") as scratch:
        tree = link_packages(Path(scratch) / "tree")
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(Path(scratch) / "cache"),
            "-p",
            "dstl",
        ]
        return subprocess.run(command, cwd=tree, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
