"""``dstl conformance``: run the suite in-process and print a per-category summary."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from dstl.spi import get_registry, refresh_plugins
from dstl.spi.plugins import PLUGINS_ENV

from .pytest_plugin import NOT_SUPPORTED, SUITE_DIR

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


@dataclass
class CategoryCounts:
    """Outcome counts of one category (a suite module)."""

    passed: int = 0
    failed: int = 0
    not_supported: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)


class SummaryCollector:
    """pytest plugin object that counts outcomes by category."""

    def __init__(self) -> None:
        self.categories: dict[str, CategoryCounts] = defaultdict(CategoryCounts)

    @staticmethod
    def category(nodeid: str) -> str:
        """``durability`` for ``.../test_durability.py::test_x``."""
        module = Path(nodeid.split("::", 1)[0]).stem
        return module.removeprefix("test_")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count one phase's outcome."""
        counts = self.categories[self.category(report.nodeid)]
        if report.failed:
            counts.failed += 1
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else report.longreprtext.strip()[-200:]
            first_line = message.strip().splitlines()[0] if message.strip() else "?"
            counts.failures.append(f"{report.nodeid} ({report.when}): {first_line[:300]}")
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            if NOT_SUPPORTED in reason:
                counts.not_supported += 1
                counts.unsupported.add(reason.split("capability ")[-1])
            else:
                counts.skipped += 1
        elif report.passed and report.when == "call":
            counts.passed += 1


def _summary_table(identifier: str, collector: SummaryCollector) -> Table:
    table = Table(title=f"dstl conformance: storage {identifier!r}")
    for column in ("category", "passed", "failed", "not supported", "capability missing"):
        table.add_column(
            column, justify="right" if column in ("passed", "failed", "not supported") else "left"
        )
    for name in sorted(collector.categories):
        c = collector.categories[name]
        failed = f"[red]{c.failed}[/red]" if c.failed else "0"
        table.add_row(
            name, str(c.passed), failed, str(c.not_supported), ", ".join(sorted(c.unsupported)) or "-"
        )
    return table


def run_conformance(
    identifier: str,
    config: Mapping[str, str] | None = None,
    *,
    junitxml: str | None = None,
    keyword: str | None = None,
    plugins: Sequence[str] = (),
    exitfirst: bool = False,
    verbose: bool = False,
    console: Console | None = None,
) -> int:
    """Run the suite against ``identifier``; returns 0 when every applicable test passed."""
    console = console or Console()
    if plugins:
        existing = [p for p in os.environ.get(PLUGINS_ENV, "").split(",") if p]
        os.environ[PLUGINS_ENV] = ",".join(dict.fromkeys([*existing, *plugins]))
        refresh_plugins()
    registry = get_registry()
    registry.get(identifier)  # UnknownStorageError names the installed ones
    for name, error in registry.broken.items():
        console.print(f"[yellow]warning:[/yellow] plugin {name!r} failed to load: {error}")
    args = [
        str(SUITE_DIR),
        "-p",
        "dstl.conformance",
        "-p",
        "no:cacheprovider",
        f"--rootdir={SUITE_DIR}",
        f"-c={SUITE_DIR / 'pytest.ini'}",
        f"--dstl-storage={identifier}",
        *(f"--dstl-config={k}={v}" for k, v in (config or {}).items()),
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--tb=short",
        "-v" if verbose else "-q",
    ]
    if junitxml:
        args.append(f"--junitxml={junitxml}")
    if keyword:
        args += ["-k", keyword]
    if exitfirst:
        args.append("-x")
    collector = SummaryCollector()
    code = pytest.main(args, plugins=[collector])
    console.print(_summary_table(identifier, collector))
    failures = [f for c in collector.categories.values() for f in c.failures]
    for failure in failures:
        console.print(f"[red]FAILED[/red] {failure}", soft_wrap=True, markup=True)
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        console.print("[red]no conformance test ran[/red] (check -k)")
        return EXIT_FAILED
    if code == pytest.ExitCode.USAGE_ERROR:
        return EXIT_USAGE
    if code != pytest.ExitCode.OK:
        console.print(f"[red]storage {identifier!r} does not conform[/red]: {len(failures)} failure(s)")
        return EXIT_FAILED
    console.print(f"[green]storage {identifier!r} conforms[/green]")
    return EXIT_OK
