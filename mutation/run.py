"""Mutation testing of the conformance suite (mutmut 2), as ``make mutation`` runs it.

.. code-block:: bash

    python -m mutation.run                 # every target below
    python -m mutation.run suite           # the SPI base classes + memory, against the suite
    python -m mutation.run local --keep /tmp/mutation   # keep the scratch copy to inspect

Each target names the files to mutate and the tests that must catch every mutant.
mutmut changes one file of a scratch copy of the repository at a time and runs the
tests; the copy is imported through a ``dstl`` package of symlinks made from
``pyproject.toml``'s package-dir, so the editable install and the work tree are
never touched. Surviving mutants that cannot be killed are explained in
``mutation/explained.toml``; the score is killed / (mutants - explained).
Reports go to ``mutation/results/<target>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from lint.package_tree import link_packages
from mutation import coverage_map, selection
from mutation.selection import KILLER, NO_TEST

ROOT = Path(__file__).resolve().parent.parent
MUTMUT_STATUSES = {
    "ok_killed": "killed",
    "ok_suspicious": "killed",  # killed, slowly
    "bad_timeout": "timeout",  # the tests hung: detected, as a hang fails a real run
    "bad_survived": "survived",
    "skipped": "skipped",
    "untested": "untested",
}
#: the suite on one storage, fixed hypothesis seed (a mutant is killed or not, every run); a
#: mutant that hangs a persist fails the suite's 5 s bound, one that hangs elsewhere its test's
#: 30 s bound (no test takes 5 s), long before mutmut's own timeout (10x the whole suite's time)
_SUITE = (
    "-m pytest -p dstl.conformance --dstl-storage={storage} --dstl-timeout=5 -x -q -p no:cacheprovider"
    " --hypothesis-seed=0 --timeout=30"
)


@dataclass(frozen=True)
class Target:
    """Files to mutate and the test commands (run in order, from the scratch copy) that must fail."""

    name: str
    paths: tuple[str, ...]
    commands: tuple[str, ...]
    #: the least textbook score (killed over mutants that are not equivalent) the target must reach
    threshold: float
    #: how many of the first commands run the conformance suite (the rest: the code's own tests)
    suite_commands: int = 1


TARGETS = {
    "suite": Target(
        "suite",
        (
            "spi/memory/_private/storage.py",
            "spi/kit/changeset_storage.py",
            "spi/kit/changeset_writer.py",
            "spi/kit/changeset_reader.py",
            "spi/kit/changeset_format.py",
        ),
        # memory first (fast); what survives it runs on local, which reaches the format's
        # framing helpers (framed_size, iter_change_sets) that memory does not use; then the
        # SPI's own tests (the kit's messages, codecs only tools use)
        (
            _SUITE.format(storage="memory"),
            _SUITE.format(storage="local"),
            "-m pytest -x -q -p no:cacheprovider --timeout=30 tests/spi",
        ),
        0.90,
        suite_commands=2,
    ),
    "local": Target(
        "local",
        tuple(
            f"dstl_local/_private/{name}"
            for name in (
                "discards.py",
                "fencing.py",
                "frames.py",
                "group_commit.py",
                "holes.py",
                "reader.py",
                "segments.py",
                "storage.py",
                "writer.py",
            )
        ),
        (
            _SUITE.format(storage="local"),
            # its own tests, but the 16 s random-SIGKILL soak (the suite's kill test stays)
            "-m pytest -x -q -p no:cacheprovider --timeout=30 tests/dstl_local"
            " -k 'not sigkill_at_random_points'",
        ),
        0.85,
        suite_commands=1,
    ),
}


@dataclass(frozen=True)
class Mutant:
    """One mutant and what became of it."""

    file: str
    line_number: int
    line: str
    index: int
    status: str
    mutated: str
    explanation: str | None = None
    #: the index of the target's command that killed it (None: survived, or killed by a timeout)
    killed_by: int | None = None


def scratch_copy(into: Path, commit: str | None = None) -> Path:
    """The work tree's files (tracked and new, not ignored), or ``commit``'s, under ``into/src``.

    A ``dstl`` package of symlinks (from pyproject's package-dir) makes the copy importable.
    """
    source = into / "src"
    source.mkdir(parents=True)
    if commit is not None:
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
        _link_packages(into, source)
        return source
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    names = [name for name in files.decode().split("\0") if name and (ROOT / name).is_file()]
    for name in names:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    _link_packages(into, source)
    return source


def _link_packages(into: Path, source: Path) -> None:
    link_packages(into / "shadow", source)


#: Seconds one test command may run against a mutant (the suites take seconds to a minute).
COMMAND_BOUND_S = 300


def runner_script(scratch: Path, source: Path, target: Target) -> Path:
    """A shell script running the target's tests against the scratch copy; exit 0 = mutant survived."""
    python = shlex.quote(sys.executable)
    lines = [
        "#!/bin/sh",
        "set -e",
        f"cd {shlex.quote(str(source))}",
        *(
            f"export {name}={shlex.quote(value)}"
            for name, value in _test_environment(scratch, source).items()
        ),
        # mutmut counts only exit code 1 as "killed"; pytest says 2, 3 or 4 when a mutant breaks
        # collection or a plugin's import, which kills it just as well
        # mutmut's own timeout kills this shell, not the test process under it: the bound
        # here ends that process too, so hanging mutants do not pile up as orphans
        *(
            _command_lines(python, index, command, scratch / SELECTION_DIR)
            for index, command in enumerate(target.commands)
        ),
    ]
    script = scratch / f"run-{target.name}.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


#: Per scratch copy: the tests :mod:`mutation.selection` chose for the mutant under test.
SELECTION_DIR = "selection"


def _command_lines(python: str, index: int, command: str, selection: Path) -> str:
    """Run one command: only the selected tests, none, or (no selection) all of them."""
    chosen = shlex.quote(str(selection / str(index)))
    bounded = f"timeout -k 5 {COMMAND_BOUND_S} {python}"
    killed = f"{{ echo {index} > {shlex.quote(str(selection / KILLER))}; exit 1; }}"
    return (
        f"if [ ! -f {chosen} ]; then {bounded} {command} >/dev/null 2>&1 || {killed}\n"
        f'elif [ "$(cat {chosen})" != {shlex.quote(NO_TEST)} ]; then '
        f"{bounded} {command} @{chosen} >/dev/null 2>&1 || {killed}\nfi"
    )


def _test_environment(scratch: Path, source: Path) -> dict[str, str]:
    """What the tests run with: the scratch copy imported as ``dstl``, no bytecode cache.

    No bytecode cache: mutmut writes a mutant and restores the original within one second,
    and a .pyc is trusted on (mtime in seconds, size): a same-size mutant would run stale code.
    """
    return {
        "PYTHONPATH": f"{scratch / 'shadow'}{os.pathsep}{source}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def run_target(
    target: Target,
    console: Console,
    keep: Path | None = None,
    commit: str | None = None,
    jobs: int = 1,
) -> list[Mutant]:
    """Mutate the target's files (of the work tree or ``commit``) and test every mutant.

    ``jobs`` mutmut processes share the files, each in a scratch copy of its own
    (mutmut tests one mutant at a time, in place).
    """
    groups = _split(target.paths, jobs)
    scratches = [Path(tempfile.mkdtemp(prefix=f"dstl-mutation-{target.name}-", dir=keep)) for _ in groups]
    try:
        runs = []
        for scratch, paths in zip(scratches, groups, strict=True):
            source = scratch_copy(scratch, commit)
            script = runner_script(scratch, source, target)
            runs.append((source, script, paths))
        baseline = subprocess.run([str(runs[0][1])], check=False, capture_output=True, timeout=1800)
        if baseline.returncode != 0:
            msg = f"the {target.name} tests fail without any mutant ({runs[0][1]}): fix them first"
            raise SystemExit(msg)
        # which tests run each line, once: each mutant then runs only those (mutation.selection)
        maps = coverage_map.build(
            runs[0][0],
            {**os.environ, **_test_environment(scratches[0], runs[0][0])},
            target.commands,
            target.paths,
            scratches[0],
        )
        environments = []
        for scratch, (source, _, _) in zip(scratches, runs, strict=True):
            (scratch / SELECTION_DIR).mkdir()
            (source / "mutmut_config.py").write_text(
                "from mutation.selection import pre_mutation as pre_mutation\n"
            )
            environments.append(
                {
                    **os.environ,
                    selection.MAPS_ENV: os.pathsep.join(str(path) for path in maps),
                    selection.SELECTION_ENV: str(scratch / SELECTION_DIR),
                }
            )
        caches = [source / ".mutmut-cache" for source, _, _ in runs]
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"mutants of {target.name}", total=None)
            done = threading.Event()
            watcher = threading.Thread(target=_watch, args=(caches, progress, task, done), daemon=True)
            watcher.start()
            try:
                processes = [
                    subprocess.Popen(
                        _mutmut_command(source, script, paths),
                        cwd=source,
                        env=environment,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    for (source, script, paths), environment in zip(runs, environments, strict=True)
                ]
                for process in processes:
                    process.wait()
            finally:
                done.set()
                watcher.join()
        killed_by: dict[tuple[str, int, int], int] = {}
        for scratch in scratches:
            selection.record_killer(scratch / SELECTION_DIR)  # the last mutant's
            killed_by.update(selection.killers(scratch / SELECTION_DIR))
        return [
            Mutant(
                **{
                    **asdict(mutant),
                    "killed_by": killed_by.get((mutant.file, mutant.line_number, mutant.index)),
                }
            )
            for (source, _, _), cache in zip(runs, caches, strict=True)
            for mutant in _mutants(cache, source)
        ]
    finally:
        if keep is None:
            for scratch in scratches:
                shutil.rmtree(scratch, ignore_errors=True)


def _split(paths: tuple[str, ...], jobs: int) -> list[tuple[str, ...]]:
    """``paths`` in at most ``jobs`` groups of about equal size (bytes of source)."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(jobs, len(paths))))]
    sizes = [0] * len(groups)
    for path in sorted(paths, key=lambda p: -(ROOT / p).stat().st_size):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(path)
        sizes[smallest] += (ROOT / path).stat().st_size
    return [tuple(group) for group in groups if group]


def _mutmut_command(source: Path, script: Path, paths: tuple[str, ...]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mutmut",
        "run",
        "--paths-to-mutate",
        ",".join(paths),
        "--runner",
        str(script),
        "--tests-dir",
        str(source / "conformance_tests"),
        "--no-progress",
    ]


def _watch(caches: list[Path], progress: Progress, task: int, done: threading.Event) -> None:
    while not done.wait(2.0):
        counts: dict[str, int] = {}
        for cache in caches:
            for status, count in _counts(cache).items():
                counts[status] = counts.get(status, 0) + count
        if counts:
            total = sum(counts.values())
            progress.update(task, total=total, completed=total - counts.get("untested", 0))


def _counts(cache: Path) -> dict[str, int]:
    if not cache.exists():
        return {}
    try:
        with sqlite3.connect(f"file:{cache}?mode=ro", uri=True, timeout=1) as db:
            return dict(db.execute("select status, count(*) from Mutant group by status").fetchall())
    except sqlite3.Error:
        return {}


def _mutants(cache: Path, source: Path) -> list[Mutant]:
    from mutmut import Context, RelativeMutationID, mutate

    with sqlite3.connect(cache) as db:
        rows = db.execute(
            'select f.filename, l.line_number, l.line, m."index", m.status from Mutant m '
            "join Line l on m.line = l.id join SourceFile f on l.sourcefile = f.id "
            'order by f.filename, l.line_number, m."index"'
        ).fetchall()
    found = []
    sources: dict[str, str] = {}
    for filename, line_number, line, index, status in rows:
        text = sources.setdefault(filename, (source / filename).read_text())
        context = Context(
            source=text,
            mutation_id=RelativeMutationID(line, index, line_number),
            filename=filename,
        )
        mutated, _ = mutate(context)
        after = _changed_lines(text, mutated) or line
        found.append(
            Mutant(
                filename,
                line_number + 1,
                line.strip(),
                index,
                MUTMUT_STATUSES.get(status, status),
                after.strip(),
            )
        )
    return found


def _changed_lines(before: str, after: str) -> str:
    """The lines of ``after`` that differ from ``before`` (a mutant may reflow a statement)."""
    changed = [
        line[1:].strip()
        for line in difflib.unified_diff(before.split("\n"), after.split("\n"), lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")
    ]
    return " / ".join(changed)


def explain(mutants: list[Mutant], explained: dict[str, list[dict[str, str | int]]]) -> list[Mutant]:
    """Survivors matched by ``explained.toml`` carry its reason.

    A ``[[mutant]]`` entry names one mutant (file, stripped source line, optional
    mutmut index); a ``[[rule]]`` entry names a kind of line by a regular expression
    (optionally in one file, optionally only mutants whose mutated line matches ``mutated``),
    for mutants that are equivalent wherever they occur.
    """
    return [
        Mutant(**{**asdict(m), "explanation": _explanation(m, explained) if m.status == "survived" else None})
        for m in mutants
    ]


def _matching_entry(
    mutant: Mutant, explained: dict[str, list[dict[str, str | int]]]
) -> dict[str, str | int] | None:
    """The ``explained.toml`` entry that explains ``mutant`` (a mutant entry before any rule)."""
    for entry in explained.get("mutant", []):
        if (
            entry["file"] == mutant.file
            and entry["line"] == mutant.line
            and entry.get("index", mutant.index) == mutant.index
        ):
            return entry
    for rule in explained.get("rule", []):
        if (
            rule.get("file", mutant.file) == mutant.file
            and re.search(str(rule["pattern"]), mutant.line)
            and re.search(str(rule.get("mutated", "")), mutant.mutated)
        ):
            return rule
    return None


def _explanation(mutant: Mutant, explained: dict[str, list[dict[str, str | int]]]) -> str | None:
    entry = _matching_entry(mutant, explained)
    return None if entry is None else f"{entry['kind']}: {entry['reason']}"


def unused_explanations(
    mutants: list[Mutant], explained: dict[str, list[dict[str, str | int]]], paths: tuple[str, ...]
) -> list[str]:
    """Entries of ``explained.toml`` for the target's files that explain no survivor: prune them."""
    used = {id(_matching_entry(m, explained)) for m in mutants if m.status == "survived"}
    return [
        str(entry.get("line") or entry.get("pattern"))
        for section in ("mutant", "rule")
        for entry in explained.get(section, [])
        if id(entry) not in used and entry.get("file", paths[0]) in paths
    ]


def by_the_suite_alone(mutants: list[Mutant], suite_commands: int) -> list[Mutant]:
    """``mutants`` as the conformance suite alone leaves them.

    Those only the code's own tests killed count as survivors (a timeout, whose killer is
    unknown, stays killed).
    """
    return [
        m
        if m.killed_by is None or m.killed_by < suite_commands
        else Mutant(**{**asdict(m), "status": "survived"})
        for m in mutants
    ]


def score(mutants: list[Mutant]) -> dict[str, float | int]:
    """Killed (timeouts included) over all mutants, over those not equivalent, over those not explained.

    The middle one is the textbook mutation score: an equivalent mutant behaves as the
    original for every input, so no test can kill it. Every other explanation (wording,
    unreachable from these storages...) still counts against it.
    """
    detected = sum(1 for m in mutants if m.status in ("killed", "timeout"))
    explained = sum(1 for m in mutants if m.explanation)
    equivalent = sum(1 for m in mutants if (m.explanation or "").startswith("equivalent:"))
    return {
        "mutants": len(mutants),
        "killed": detected,
        "survived": sum(1 for m in mutants if m.status == "survived"),
        "explained": explained,
        "equivalent": equivalent,
        "raw_score": _ratio(detected, len(mutants)),
        "score_without_equivalent": _ratio(detected, len(mutants) - equivalent),
        "score": _ratio(detected, len(mutants) - explained),
    }


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 1.0


def report(
    target: Target,
    mutants: list[Mutant],
    seconds: float,
    out: Path,
    explained: dict[str, list[dict[str, str | int]]],
) -> dict[str, object]:
    """Write ``out/<target>.md`` and ``.json``; returns the figures."""
    out.mkdir(parents=True, exist_ok=True)
    per_file = {path: score([m for m in mutants if m.file == path]) for path in target.paths}
    total = score(mutants)
    alone = score(by_the_suite_alone(mutants, target.suite_commands))
    figures = {
        "target": target.name,
        "seconds": round(seconds, 1),
        "total": total,
        "suite_alone": alone,
        "files": per_file,
    }
    lines = [
        f"# Mutation testing: {target.name}",
        "",
        f"mutmut 2.5.1; tests: {'; then '.join(target.commands)}; {seconds / 60:.1f} min.",
        "",
        "Scores: killed over all mutants (raw), over the mutants that are not equivalent, and over",
        "the mutants that are not explained survivors.",
        "",
        "| file | mutants | killed | survived | explained | of them equivalent | raw score "
        "| score without equivalent | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path, s in [*per_file.items(), ("**total**", total)]:
        lines.append(
            f"| {path} | {s['mutants']} | {s['killed']} | {s['survived']} | {s['explained']} "
            f"| {s['equivalent']} | {s['raw_score']:.1%} | {s['score_without_equivalent']:.1%} "
            f"| {s['score']:.1%} |"
        )
    lines += [
        "",
        f"By the conformance suite alone (the first {target.suite_commands} command(s); a mutant only "
        f"the code's own tests killed counts as a survivor): {alone['killed']} killed, textbook score "
        f"{alone['score_without_equivalent']:.1%} (equivalent survivors: {alone['equivalent']}).",
    ]
    survivors = [m for m in mutants if m.status == "survived"]
    lines += ["", "## Surviving mutants", ""]
    for m in survivors:
        note = f" — {m.explanation}" if m.explanation else " — **unexplained**"
        lines.append(f"- `{m.file}:{m.line_number}` `{m.line}` → `{m.mutated}`{note}")
    unused = unused_explanations(mutants, explained, target.paths)
    if unused:
        lines += ["", "## Explanations that explained no survivor (prune them)", ""]
        lines += [f"- `{text}`" for text in unused]
    (out / f"{target.name}.md").write_text("\n".join(lines) + "\n")
    records = {**figures, "mutants": [asdict(m) for m in mutants]}
    (out / f"{target.name}.json").write_text(json.dumps(records, indent=1))
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the named targets (all by default); exit 1 if a score is below its threshold."""
    parser = argparse.ArgumentParser(prog="python -m mutation.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "targets", nargs="*", metavar="TARGET", help=f"of {', '.join(TARGETS)} (default: all)"
    )
    parser.add_argument("--results", default=str(ROOT / "mutation" / "results"))
    parser.add_argument("--keep", help="keep the scratch copies under this directory")
    parser.add_argument("--at", metavar="COMMIT", help="mutate this commit's files, not the work tree's")
    parser.add_argument("--only", metavar="FILE,...", help="mutate only these of the target's files")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="mutmut processes in parallel (default: cores)"
    )
    parser.add_argument(
        "--explain-only",
        action="store_true",
        help="no run: apply explained.toml again to the results' JSON and rewrite the reports",
    )
    args = parser.parse_args(argv)
    console = Console()
    explained = tomllib.loads((ROOT / "mutation" / "explained.toml").read_text())
    unknown = [name for name in args.targets if name not in TARGETS]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r}: one of {', '.join(TARGETS)}")
    failed = False
    for name in args.targets or list(TARGETS):
        target = TARGETS[name]
        if args.only:
            target = replace(target, paths=tuple(args.only.split(",")))
        began = time.monotonic()
        keep = Path(args.keep) if args.keep else None
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
        if args.explain_only:
            previous = json.loads((Path(args.results) / f"{name}.json").read_text())
            found = [Mutant(**{**m, "explanation": None}) for m in previous["mutants"]]
            seconds = float(previous["seconds"])
        else:
            found = run_target(target, console, keep, args.at, args.jobs)
            seconds = time.monotonic() - began
        mutants = explain(found, explained)
        figures = report(target, mutants, seconds, Path(args.results), explained)
        total = figures["total"]
        assert isinstance(total, dict)
        console.print(
            f"{target.name}: {total['mutants']} mutants, {total['killed']} killed, "
            f"{total['survived']} survived ({total['explained']} explained, {total['equivalent']} of them "
            f"equivalent): score {total['score']:.1%} (raw {total['raw_score']:.1%}, without equivalent "
            f"{total['score_without_equivalent']:.1%}), {figures['seconds'] / 60:.1f} min"
        )
        unexplained = [m for m in mutants if m.status == "survived" and not m.explanation]
        if total["score_without_equivalent"] < target.threshold:  # type: ignore[operator]
            console.print(f"[red]{target.name}: textbook score below {target.threshold:.0%}[/]")
            failed = True
        for m in unexplained[:20]:
            console.print(f"  survived: {m.file}:{m.line_number} {m.line!r} -> {m.mutated!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
