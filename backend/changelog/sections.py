"""Snapshot section entries as the materializer writes and loads them: TTL purge and validation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from dstl.spi import CorruptedError

from ..keyed import purge_expired
from ..materialization import as_runs, checked_runs

if TYPE_CHECKING:
    from ..delegate import StateDelegate
    from ..materialization import SnapshotSections

__all__ = ["OpenedSnapshot", "checked_entries", "load_runs", "load_section", "purged", "replaced_key_groups"]


@dataclass(frozen=True)
class OpenedSnapshot:
    """A snapshot whose meta and index were read; its sections are read as they are loaded."""

    meta: dict[str, Any]
    sections: SnapshotSections
    where: str  # names the object in errors
    replaced: frozenset[int]  # the wanted key groups it holds whole (a restore drops theirs first)


def replaced_key_groups(meta: dict[str, Any], *, where: str) -> list[int]:
    """The key groups an incremental snapshot replaces whole (validated: the snapshot is untrusted)."""
    replaced = meta.get("replaced_key_groups", [])
    if not isinstance(replaced, list) or not all(type(kg) is int for kg in replaced):
        msg = f"snapshot {where}: 'replaced_key_groups' must be a list of key groups, got {replaced!r:.80}"
        raise CorruptedError(msg, location=where)
    return replaced


def purged(
    section: list[list[Any]],
    ttl_states: dict[str, tuple[str, float]],
    now: float,
    expired: Callable[[str, bytes], None],
) -> list[list[Any]]:
    """``section`` without expired state (a full snapshot is where TTL'd state is cleaned up).

    A collection's first part that expired entirely stays as a tombstone: later parts
    of it may still hold live elements, which then extend nothing stale.

    :param expired: told ``(state, key)`` of every entry that had expired parts.
    """
    kept = []
    for state, key, entry, *continued in section:
        if state in ttl_states:
            kind, ttl = ttl_states[state]
            live = purge_expired(kind, entry, ttl, now)
            if live is None or (kind in ("list", "map") and len(live) < len(entry)):
                expired(state, key)
            if live is None and (continued or kind not in ("list", "map")):
                continue
            entry = live
        kept.append([state, key, entry, *continued])
    return kept


def checked_entries(entries: list[Any], key_group: int, where: str) -> Iterator[tuple[str, bytes, Any, bool]]:
    """``(state, key, entry, continued)`` of a section's entries, each checked (the snapshot is untrusted)."""
    for item in entries:
        valid = isinstance(item, list) and len(item) in (3, 4)
        if valid:
            state, key, entry, *flag = item
            continued = flag == [1]
            valid = (
                isinstance(state, str)
                and isinstance(key, bytes)
                and (not flag or continued)
                and (not continued or isinstance(entry, (list, dict)))
            )
        if not valid:
            msg = f"snapshot section of key group {key_group} holds a malformed entry: {item!r:.80}"
            raise CorruptedError(msg, location=where)
        yield state, key, entry, continued


def load_runs(delegate: StateDelegate, key_group: int, runs: list[Any], where: str) -> None:
    """Write a columnar section's runs (checked: the snapshot is untrusted) to ``delegate``.

    A run's keys and entries go to the delegate as they were decoded, in one batch.
    """
    for run in checked_runs(runs, key_group, where):
        if run.continued:  # parts extend what came before them: one by one, in order
            for key, part in zip(run.keys, run.entries, strict=True):
                delegate.extend(run.state, key_group, key, part)
        elif run.keys:
            delegate.write_batch(run.state, key_group, dict(zip(run.keys, run.entries, strict=True)))


def load_section(delegate: StateDelegate, key_group: int, entries: list[Any], where: str) -> None:
    """Write a row-shaped snapshot section's entries (versions 1 and 2; checked) to ``delegate``.

    A section of well-formed whole entries goes as a version-3 section's runs would
    (C-level passes, not a Python loop per entry, which cost more than a restore's
    writes); any other, entry by entry, naming a malformed one.
    """
    if _whole_entries(entries):
        load_runs(delegate, key_group, as_runs(entries), where)
        return
    # Entries come state by state: whole ones in one batch per state, a part that continues
    # a collection extends it once what came before is written.
    batch: dict[bytes, Any] = {}
    batch_state = ""  # set with the batch's first entry
    for state, key, entry, continued in checked_entries(entries, key_group, where):
        if batch and (continued or state != batch_state):
            delegate.write_batch(batch_state, key_group, batch)
            batch = {}
        if continued:
            delegate.extend(state, key_group, key, entry)
        else:
            batch[key] = entry
            batch_state = state
    if batch:
        delegate.write_batch(batch_state, key_group, batch)


def _whole_entries(entries: list[Any]) -> bool:
    """Whether every entry is a well-formed whole ``[state, key, entry]`` (checked in C-level passes)."""
    return (
        bool(entries)
        and set(map(type, entries)) == {list}
        and set(map(len, entries)) == {3}
        and set(map(type, map(itemgetter(0), entries))) == {str}
        and set(map(type, map(itemgetter(1), entries))) == {bytes}
    )
