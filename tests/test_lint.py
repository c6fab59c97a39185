"""The tree is ruff clean and type-checks (the same checks as `make lint`)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_types_check():
    """mypy finds no error in the product packages (``python -m lint.typecheck``, as ``make lint`` runs)."""
    result = subprocess.run(
        [sys.executable, "-m", "lint.typecheck"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
