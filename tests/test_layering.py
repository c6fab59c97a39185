"""Packages import only downward: the SPI nothing above it, storages never the backend."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: folder -> the dstl packages its runtime imports may not reach
FORBIDDEN = {
    "spi": ("dstl.backend", "dstl.conformance", "dstl.local", "dstl.dfs", "dstl.kafka"),
    "dstl_local": ("dstl.backend",),
    "dstl_dfs": ("dstl.backend",),
    "dstl_kafka": ("dstl.backend",),
    "conformance_tests": ("dstl.backend",),
}


#: a storage's conformance backdoor is loaded by the conformance runner only (its plugin imports it lazily)
EXEMPT = {"spi/memory/_private/conformance.py"}


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    """Absolute ``dstl.*`` imports outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def test_no_package_imports_a_layer_above_it():
    checked = 0
    violations = []
    for folder, forbidden in FORBIDDEN.items():
        for path in (ROOT / folder).rglob("*.py"):
            if str(path.relative_to(ROOT)) in EXEMPT:
                continue
            checked += 1
            for line, module in _runtime_imports(path):
                if module.startswith(forbidden):
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert checked > 50
    assert not violations, violations


def test_the_kit_names_moved_from_the_spi_still_import_with_a_warning():
    import pytest

    import dstl.spi
    from dstl.spi import kit

    with pytest.warns(DeprecationWarning, match=r"dstl\.spi\.kit"):
        assert dstl.spi.ChangeSetWriter is kit.ChangeSetWriter
    assert "ChangeSetWriter" not in dstl.spi.__all__
    with pytest.raises(AttributeError):
        _ = dstl.spi.NoSuchName


#: A module longer than this does more than one job: split it by job (issue 31).
MAX_MODULE_LINES = 500


def test_no_product_module_is_over_the_line_budget():
    folders = (*FORBIDDEN, "backend")
    long = {
        str(path.relative_to(ROOT)): lines
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these by job: {long}"
