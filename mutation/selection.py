"""Which tests each mutant runs: only those that run its line (mutmut's ``pre_mutation`` hook).

Before each mutant, :func:`pre_mutation` writes one file per target command into the
directory :data:`SELECTION_ENV` names: the tests to run (one command-line argument a
line, for pytest's ``@file``), or :data:`NO_TEST` when no test of that command runs the
line, so that command cannot kill the mutant. A test "runs the line" when it runs any line
of the statement holding it. A statement run outside any test (an import, a class body)
runs the whole command, as does a file the command did not trace from its import. The
tests that start subprocesses are always added: their children are not traced.
"""

from __future__ import annotations

import ast
import json
import os
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mutation.coverage_map import OUTSIDE_TESTS

SELECTION_ENV = "DSTL_MUTATION_SELECTION"
MAPS_ENV = "DSTL_MUTATION_MAPS"  # os.pathsep-separated, one map per command, in order
#: a selection file's content when no test of the command runs the mutated line
NO_TEST = "-"


@cache
def _maps() -> list[dict[str, Any]]:
    return [json.loads(Path(path).read_text()) for path in os.environ[MAPS_ENV].split(os.pathsep)]


@dataclass(frozen=True)
class Statement:
    """The statement holding a mutated line (its header lines) and where it runs.

    ``at_import``: it runs when its module loads; ``body``: the lines of the function body
    around it (``None`` at import).
    """

    first: int
    last: int
    at_import: bool
    body: tuple[int, int] | None = None


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def statement_of(source: str, line: int) -> Statement:
    """The innermost statement holding ``line`` (of a compound statement, its header).

    Python reports one statement's execution on any of its lines (3.11 traces positions), so a
    test ran a mutated line when it ran any line of that line's statement. A statement outside
    any function body (a module or class body, a ``def`` line with its decorators and defaults)
    runs when the module loads, in whichever test loads it first.
    """
    found = Statement(line, line, at_import=True)

    def visit(node: ast.AST, body: tuple[int, int] | None) -> None:
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt | ast.excepthandler) or child.end_lineno is None:
                if isinstance(child, ast.match_case):
                    visit(child, body)  # holds statements, is none
                continue
            first = min([child.lineno, *(d.lineno for d in getattr(child, "decorator_list", []))])
            if not first <= line <= child.end_lineno:
                continue
            statements = getattr(child, "body", None)
            header_ends = (
                statements[0].lineno - 1 if isinstance(statements, list) and statements else child.end_lineno
            )
            found = Statement(first, max(first, header_ends), at_import=body is None, body=body)
            if isinstance(child, _FUNCTIONS):
                body = (child.body[0].lineno, child.end_lineno)
            visit(child, body)  # statements nest

    visit(_tree(source), body=None)
    return found


@cache
def _tree(source: str) -> ast.Module:
    return ast.parse(source)  # once per file: every mutant of it asks


@cache
def code_lines(source: str) -> frozenset[int]:
    """The lines that hold an instruction once compiled (``try:``, ``else:``, a folded constant may not)."""
    lines: set[int] = set()
    pending = [compile(source, "<mutated>", "exec")]
    while pending:
        code = pending.pop()
        lines.update(number for _, _, number in code.co_lines() if number is not None)
        pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return frozenset(lines)


def chosen_tests(
    test_map: dict[str, Any], path: str, statement: Statement, compiled: frozenset[int]
) -> list[str] | None:
    """The tests of one command to run against a mutant of ``statement`` in ``path``.

    ``None``: the whole command; ``[]``: none of its tests runs the statement. A statement with
    no instruction of its own (``compiled`` lines) is run by the tests that run its function.
    """
    by_line = test_map["lines"].get(path)
    if by_line is None or statement.at_import:
        return None  # never traced, or run by whichever test imports it first
    first, last = statement.first, statement.last
    if statement.body is not None and not any(number in compiled for number in range(first, last + 1)):
        first, last = statement.body
    contexts = {c for number in range(first, last + 1) for c in by_line.get(str(number), ())}
    if OUTSIDE_TESTS in contexts:
        return None
    return sorted(contexts | set(test_map["spawning"])) if contexts else []


@cache
def _source(path: Path) -> str:
    return path.read_text()


#: In the selection directory: the mutant under test, the command that killed it (the runner
#: script writes it), and one line per mutant tested so far: file, line, index, killer.
CURRENT, KILLER, KILLERS = "current", "killer", "killers.tsv"


def record_killer(into: Path) -> None:
    """Add the last mutant tested and the command that killed it (if any) to :data:`KILLERS`."""
    current, killer = into / CURRENT, into / KILLER
    if current.exists():
        found = killer.read_text().strip() if killer.exists() else ""
        with (into / KILLERS).open("a") as out:
            out.write(f"{current.read_text()}\t{found}\n")
        current.unlink()
    killer.unlink(missing_ok=True)


def killers(into: Path) -> dict[tuple[str, int, int], int]:
    """``(file, line (1-based), mutmut index) -> index of the command that killed it``."""
    found = {}
    table = into / KILLERS
    for row in table.read_text().splitlines() if table.exists() else []:
        file, line, index, killer = row.split("\t")
        if killer:
            found[(file, int(line), int(index))] = int(killer)
    return found


def pre_mutation(context: Any) -> None:
    """Write, as mutmut's hook, each command's selection for the mutant about to be tested."""
    into = Path(os.environ[SELECTION_ENV])
    record_killer(into)
    mutant = context.mutation_id
    (into / CURRENT).write_text(f"{context.filename}\t{mutant.line_number + 1}\t{mutant.index}")
    path = Path(context.filename)  # relative to the scratch copy, as in the maps
    # called before mutmut writes the mutant: the file is still the original
    source = _source(path)
    statement = statement_of(source, context.current_line_index + 1)  # mutmut counts from 0
    compiled = code_lines(source)
    for index, test_map in enumerate(_maps()):
        chosen = chosen_tests(test_map, str(path), statement, compiled)
        target = into / str(index)
        if chosen is None:
            target.unlink(missing_ok=True)
        else:
            target.write_text("\n".join(chosen) + "\n" if chosen else NO_TEST)
