"""Columnar sections (format version 3): a section's entries as runs of one state, keys and entries apart.

A row-shaped section (versions 1 and 2) holds one ``[state, key, entry(, 1)]`` list
per entry, and decoding it costs a Python list per entry. A run holds the
consecutive entries of one state as ``[state, [key, ...], [entry, ...]]``, or, for
parts that continue a collection, ``[state, [key, ...], [part, ...], 1]``: decoding
makes two lists per run, and a restore hands the keys and entries to the working
state as they come.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import compress
from operator import itemgetter, ne
from typing import Any, NamedTuple

from dstl.spi import CorruptedError

__all__ = ["Run", "as_runs", "checked_runs", "rows_of"]

_STATE, _KEY, _ENTRY = itemgetter(0), itemgetter(1), itemgetter(2)


class Run(NamedTuple):
    """Consecutive entries of one state in a section, checked."""

    state: str
    keys: list[bytes]
    entries: list[Any]
    continued: bool  # parts extending collections an earlier part began


def as_runs(entries: list[list[Any]]) -> list[list[Any]]:
    """Row-shaped entries (``[state, key, entry(, 1)]``, as a view gives them) as runs to store.

    C-level passes over the entries: a section is written as the state is read.
    """
    if not entries:
        return []
    if set(map(len, entries)) == {3} and len(set(map(_STATE, entries))) == 1:  # the usual section
        return [[entries[0][0], list(map(_KEY, entries)), list(map(_ENTRY, entries))]]
    kinds = list(zip(map(_STATE, entries), map(len, entries), strict=True))
    starts = [0, *compress(range(1, len(kinds)), map(ne, kinds[1:], kinds))]
    ends = [*starts[1:], len(kinds)]
    keys, values = list(map(_KEY, entries)), list(map(_ENTRY, entries))
    runs = []
    for start, end in zip(starts, ends, strict=True):
        state, length = kinds[start]
        run = [state, keys[start:end], values[start:end]]
        runs.append([*run, 1] if length == 4 else run)
    return runs


def checked_runs(runs: Any, key_group: int, where: str) -> Iterator[Run]:
    """Each run of a decoded version-3 section, checked (the snapshot is untrusted).

    :raises CorruptedError: naming the key group and the run that is malformed.
    """
    if not isinstance(runs, list):
        msg = f"snapshot section of key group {key_group} is not a list of runs"
        raise CorruptedError(msg, location=where)
    for run in runs:
        valid = type(run) is list and len(run) in (3, 4)
        if valid:
            state, keys, entries, *flag = run
            continued = flag == [1]
            valid = (
                type(state) is str
                and type(keys) is list
                and type(entries) is list
                and len(keys) == len(entries)
                and (not flag or continued)
                and (not keys or set(map(type, keys)) == {bytes})
                and (not continued or all(isinstance(part, (list, dict)) for part in entries))
            )
        if not valid:
            msg = f"snapshot section of key group {key_group} holds a malformed run: {run!r:.80}"
            raise CorruptedError(msg, location=where)
        yield Run(state, keys, entries, continued)


def rows_of(runs: Any, key_group: int, where: str) -> list[list[Any]]:
    """A version-3 section's entries in the row shape of versions 1 and 2 (for readers of entries)."""
    rows: list[list[Any]] = []
    for run in checked_runs(runs, key_group, where):
        flag = [1] if run.continued else []
        rows.extend([run.state, key, entry, *flag] for key, entry in zip(run.keys, run.entries, strict=True))
    return rows
