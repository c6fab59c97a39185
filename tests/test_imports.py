"""Every product module imports first, alone, in a fresh interpreter: no import-order cycles.

A cycle that works only because some other module happened to be imported first
(``state`` -> ``changelog`` -> ``backend`` -> ``state``) breaks the first user who
imports the modules in another order.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """The folder of a declared package, through ``package-dir``."""
    for prefix, folder in _SETUPTOOLS["package-dir"].items():
        if package == prefix or package.startswith(prefix + "."):
            return ROOT / folder / Path(*package[len(prefix) :].split(".")[1:])
    raise AssertionError(package)


def _product_modules() -> list[str]:
    modules = []
    for package in _SETUPTOOLS["packages"]:
        for path in sorted(_folder(package).glob("*.py")):
            modules.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return modules


def test_every_package_folder_is_declared_and_so_installed():
    declared = {_folder(package) for package in _SETUPTOOLS["packages"]}
    for prefix, folder in _SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            assert "__pycache__" not in init.parts
            assert init.parent in declared, f"{init.parent} ({prefix}) is missing from pyproject's packages"


def test_each_product_module_imports_first_in_a_fresh_interpreter():
    modules = _product_modules()
    assert len(modules) > 100  # the walk found the product, not an empty list

    def imports(module: str) -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        return module, done.stderr.strip().splitlines()[-1] if done.returncode else ""

    with ThreadPoolExecutor(4) as pool:
        failed = {module: error for module, error in pool.map(imports, modules) if error}
    assert not failed, failed
