"""A pytest plugin recording which tests run each line of the mutated files (``-p mutation.coverage_map``).

The mutation runner runs every target command once with this plugin; a mutant is then
tested only by the tests that run its line (:mod:`mutation.selection`): a test that never
runs a line behaves the same with any mutant of it. Lines run outside any test (imports,
class bodies, session fixtures) are recorded under :data:`OUTSIDE_TESTS`; tests that start a
subprocess are listed apart, since what their children run is not traced here.

Environment: :data:`MAP_ENV` names the JSON file to write, :data:`SOURCES_ENV` the files
to trace (``os.pathsep``-separated absolute paths). Paths in the map (files and tests)
are relative to the directory pytest runs from.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import coverage
import pytest

MAP_ENV = "DSTL_MUTATION_MAP"
SOURCES_ENV = "DSTL_MUTATION_SOURCES"
#: the context of lines run outside any test's setup, call or teardown
OUTSIDE_TESTS = ""

_sources = [os.path.realpath(path) for path in os.environ.get(SOURCES_ENV, "").split(os.pathsep) if path]
# Started on import, before the plugins that import the traced code (``-p`` order).
_coverage = coverage.Coverage(data_file=None, include=_sources, config_file=False) if _sources else None
_current: str | None = None
_spawning: set[str] = set()
if _coverage is not None:
    _coverage.start()
    _popen_init = subprocess.Popen.__init__

    def _noting_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        if _current is not None:
            _spawning.add(_current)
        _popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = _noting_init  # type: ignore[method-assign]


def argument_of(item: pytest.Item) -> str:
    """The item as a command-line argument from the invocation directory (node ids are rootdir-relative)."""
    _, _, rest = item.nodeid.partition("::")
    return f"{os.path.relpath(item.path, item.config.invocation_params.dir)}::{rest}"


def _switch(context: str | None) -> None:
    global _current
    _current = context
    if _coverage is not None:
        _coverage.switch_context(OUTSIDE_TESTS if context is None else context)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Lines run in the test's setup, call and teardown count as the test's."""
    _switch(argument_of(item))
    yield
    _switch(None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the map: file -> line -> the tests (or :data:`OUTSIDE_TESTS`) that ran it."""
    if _coverage is None:
        return
    _coverage.stop()
    data = _coverage.get_data()
    lines: dict[str, dict[int, list[str]]] = {}
    for measured in data.measured_files():
        by_line = data.contexts_by_lineno(measured)
        # relative to the invocation directory: the map serves every scratch copy alike
        lines[
            os.path.relpath(
                os.path.realpath(measured), os.path.realpath(session.config.invocation_params.dir)
            )
        ] = {line: sorted(set(found)) for line, found in by_line.items()}
    document = {"lines": lines, "spawning": sorted(_spawning)}
    Path(os.environ[MAP_ENV]).write_text(json.dumps(document))


def build(
    source: Path, env: dict[str, str], commands: tuple[str, ...], paths: tuple[str, ...], into: Path
) -> list[Path]:
    """Run each pytest command (``-m pytest ...``) once from ``source`` with this plugin; one map each."""
    maps = []
    for index, command in enumerate(commands):
        head, pytest_args = command.split("-m pytest", 1)
        arguments = [*shlex.split(head), "-m", "pytest", "-p", __name__, *shlex.split(pytest_args)]
        out = into / f"test-map-{index}.json"
        traced = os.pathsep.join(str(source / path) for path in paths)
        subprocess.run(
            [sys.executable, *arguments],
            cwd=source,
            env={**env, MAP_ENV: str(out), SOURCES_ENV: traced},
            check=True,
            capture_output=True,
            timeout=1800,
        )
        maps.append(out)
    return maps
