"""Replaying logs into a delegate: the hot half of every restore.

A restore replays up to millions of changes, so the loop avoids per-change
objects and calls: change sets come from the reader as lists, value puts (most
changes) are recognised without the general decoder, and the changes are squashed
per entry (:class:`SquashedLog`) before they reach the delegate in one batch per
state and key group. Anything unusual goes through :func:`decode_change`, which
validates it and names the damage.

A large log is squashed in a forked process while the caller loads the snapshots
(the other core), and comes back as one msgpack document that decodes at snapshot
speed. Changes that need the entry before them (a list add on a key the log never
replaced) cannot be squashed without the snapshot; they come back in order and are
applied after it.
"""

from __future__ import annotations

import logging
import os
import signal
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from dstl.spi import META_KEY_GROUP, ChangelogHandle, InvalidHandleError, KeyGroupRange, StateChangelogReader
from dstl.spi.kit import ChangeSetReader, decode_fetched

from ..delegate import StateDelegate
from ..pacing import pace
from . import child_output
from .records import _OPS, Op, decode_change, decode_registration

__all__ = [
    "DecodedChange",
    "SquashedLog",
    "applied",
    "apply_change",
    "decoded_changes",
    "replay",
    "squash",
    "visit",
]

log = logging.getLogger(__name__)

_OP_VALUE_PUT = Op.VALUE_PUT  # enum attribute lookups are slow on a per-change path
_VALUE_PUT = int(_OP_VALUE_PUT)
_ABSENT = object()


class _Registrations:
    """The state names a log registers (metadata records), by the ids its changes use."""

    def __init__(self, handle: ChangelogHandle, registered: Callable[[str, str, str], None]) -> None:
        self.where = f"{handle.storage_id}:{handle.log_id}"
        self._log_id = handle.log_id
        self._registered = registered
        self._names: dict[int, str] = {}

    def record(self, data: bytes) -> None:
        """Take in one registration record."""
        state_id, name, kind, serializer = decode_registration(data, where=self.where)
        self._names[state_id] = name
        self._registered(name, kind, serializer)

    def name(self, state_id: int) -> str:
        """The name registered for ``state_id``."""
        name = self._names.get(state_id)
        if name is None:
            msg = f"change for unregistered state id {state_id} in log {self._log_id!r}"
            raise InvalidHandleError(msg)
        return name


def applied(op: Op, current: Any | None, args: list[Any], *, owned: bool = False) -> Any | None:
    """The entry after ``op`` on ``current`` (``None``: absent, before or after).

    :param owned: ``current`` belongs to the caller and may change in place (a squash's
        own entries: a collection built by many ops then costs O(1) per op).
    """
    if op is Op.VALUE_PUT:
        return args[0]
    if op is Op.CLEAR:
        return None
    if op is Op.LIST_SET:
        return list(args[0]) or None
    if op is Op.LIST_ADD:
        entry = current if owned and current is not None else list(current or [])
        entry.append(args[0])
        return entry
    entry = current if owned and current is not None else dict(current or {})
    if op is Op.MAP_PUT:
        entry[args[0]] = args[1]
        return entry
    entry.pop(args[0], None)  # MAP_REMOVE
    return entry or None


def apply_change(
    delegate: StateDelegate, state: str, key_group: int, key: bytes, op: Op, args: list[Any]
) -> None:
    """Apply one change to the delegate (live mutations, and replayed changes that could not be squashed).

    Element changes go to the delegate's element methods: their cost does not grow
    with the collection.
    """
    if op is _OP_VALUE_PUT:
        delegate.put(state, key_group, key, args[0])
    elif op is Op.LIST_ADD:
        delegate.append(state, key_group, key, args[0])
    elif op is Op.MAP_PUT:
        delegate.map_put(state, key_group, key, args[0], args[1])
    elif op is Op.MAP_REMOVE:
        delegate.map_remove(state, key_group, key, args[0])
    else:
        entry = applied(op, None, args)
        if entry is None:
            delegate.delete(state, key_group, key)
        else:
            delegate.put(state, key_group, key, entry)


_READS_CURRENT = frozenset({Op.LIST_ADD, Op.MAP_PUT, Op.MAP_REMOVE})

#: One change set as ``read_change_sets`` gives it: its SQN and its (key group, record) pairs.
ChangeSet = tuple[int, list[tuple[int, bytes]]]
#: A handle and its change sets.
FetchedLog = tuple[ChangelogHandle, Iterable[ChangeSet]]
#: What a forked squash writes before each change set, then before its document.
_TICK, _DONE = b"\x00", b"\x01"


@dataclass
class SquashedLog:
    """Logs replayed down to what they leave behind.

    :ivar registrations: ``(name, kind, serializer)`` of every registration record.
    :ivar batches: ``(state, key group) -> key -> last entry`` (``None``: removed).
    :ivar unsquashed: ``(state, key group, key, op, args)`` in log order, for keys whose
        first change reads the entry before it and no base was at hand; applied after
        ``batches``.
    """

    registrations: list[tuple[str, str, str]] = field(default_factory=list)
    batches: dict[tuple[str, int], dict[bytes, Any]] = field(default_factory=dict)
    unsquashed: list[tuple[str, int, bytes, int, list[Any]]] = field(default_factory=list)

    def apply(self, delegate: StateDelegate, registered: Callable[[str, str, str], None]) -> None:
        """Write it all to ``delegate`` (on top of the snapshots) and report the registrations."""
        for registration in self.registrations:
            registered(*registration)
        for (name, key_group), batch in self.batches.items():
            delegate.write_batch(name, key_group, batch)
            pace()  # applied in the background (a standby copy's restore): the worker's task first
        for name, key_group, key, op, args in self.unsquashed:
            apply_change(delegate, name, key_group, key, _OPS[op], args)

    def encode(self) -> bytes:
        """One msgpack document (decoded in C on the other side)."""
        batches = [[name, key_group, batch] for (name, key_group), batch in self.batches.items()]
        return msgpack.packb([self.registrations, batches, self.unsquashed], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes | bytearray) -> SquashedLog:
        """The inverse of :meth:`encode` (trusted: our own forked process wrote it)."""
        registrations, batches, unsquashed = msgpack.unpackb(data, raw=False, strict_map_key=False)
        return cls(
            [tuple(r) for r in registrations],
            {(name, key_group): batch for name, key_group, batch in batches},
            [tuple(u) for u in unsquashed],
        )


def squash(logs: Iterable[FetchedLog], base: Callable[[str, int, bytes], Any] | None) -> SquashedLog:
    """Replay ``logs`` in order into a :class:`SquashedLog`.

    :param base: the entry before the logs (the snapshot's); ``None`` when the
        snapshot is not at hand, which leaves reading changes unsquashed.
    :raises CorruptedError: on an undecodable record.
    :raises InvalidHandleError: on a change of a state the log never registered.
    """
    result = SquashedLog()
    batches, unsquashed = result.batches, result.unsquashed
    unsquashed_keys: set[tuple[str, int, bytes]] = set()  # once unsquashed, every later change too
    unpackb = msgpack.unpackb
    for handle, change_sets in logs:
        names = _Registrations(handle, lambda *registration: result.registrations.append(registration))
        # (state id, key group) -> (name, its batch): a log's key groups interleave change by change
        targets: dict[tuple[int, int], tuple[str, dict[bytes, Any]]] = {}
        for _sqn, changes in change_sets:
            for key_group, data in changes:
                if key_group == META_KEY_GROUP:
                    names.record(data)
                    targets = {}  # ids may be bound anew
                    continue
                try:
                    record = unpackb(data, raw=False, strict_map_key=False)
                except Exception:
                    record = None
                if (
                    type(record) is list
                    and len(record) == 4
                    and record[0] == _VALUE_PUT
                    and type(record[0]) is int
                    and type(record[1]) is int
                    and type(record[2]) is bytes
                ):  # a value put: most changes, no general decoding
                    state_id, key, op, args = record[1], record[2], _OP_VALUE_PUT, None
                else:
                    op, state_id, key, args = decode_change(data, where=names.where)
                target = targets.get((state_id, key_group))
                if target is None:
                    name = names.name(state_id)
                    target = targets[(state_id, key_group)] = (
                        name,
                        batches.setdefault((name, key_group), {}),
                    )
                name, batch = target
                if unsquashed_keys and (name, key_group, key) in unsquashed_keys:
                    unsquashed.append((name, key_group, key, int(op), record[3:] if args is None else args))
                    continue
                if args is None:
                    batch[key] = record[3]
                    continue
                current = batch.get(key, _ABSENT)
                if current is _ABSENT:
                    if base is None and op in _READS_CURRENT:
                        unsquashed_keys.add((name, key_group, key))
                        unsquashed.append((name, key_group, key, int(op), args))
                        continue
                    current = base(name, key_group, key) if base is not None else None
                    batch[key] = applied(op, current, args)  # the base's entry is copied, never changed
                else:
                    batch[key] = applied(op, current, args, owned=True)
    return result


def replay(
    sources: Iterable[tuple[StateChangelogReader, ChangelogHandle]],
    key_groups: KeyGroupRange,
    delegate: StateDelegate,
    registered: Callable[[str, str, str], None],
    load_snapshots: Callable[[], None],
    *,
    fork_from: int = 0,
) -> None:
    """Load the snapshots, then apply the logs of ``sources`` (in order) on top.

    :param load_snapshots: fills ``delegate`` with the materialized state.
    :param fork_from: decode and squash logs of at least this many bytes in a forked
        process while the snapshots load (0: never). The bytes are fetched here
        first: storage clients stay in this process. Without ``os.fork``, or if the
        process fails, the logs are decoded and squashed here.
    :raises CorruptedError: on damaged log data (the logs change nothing then).
    :raises InvalidHandleError: on a change of a state the log never registered.
    """
    decoders = [_fetch(reader, handle, key_groups) for reader, handle in sources]
    size = sum(handle.size for handle, _ in decoders)
    forked = _ForkedSquash(decoders) if 0 < fork_from <= size and hasattr(os, "fork") else None
    try:
        load_snapshots()
    finally:
        squashed = forked.result() if forked is not None else None
    if squashed is None:  # not forked, or it failed: here (raising what it raised)
        squashed = squash([(handle, list(decode())) for handle, decode in decoders], delegate.get)
    squashed.apply(delegate, registered)


def _fetch(
    reader: StateChangelogReader, handle: ChangelogHandle, key_groups: KeyGroupRange
) -> tuple[ChangelogHandle, Callable[[], Iterable[ChangeSet]]]:
    """Do the I/O of reading ``handle`` now; the returned callable decodes (CPU only)."""
    if isinstance(reader, ChangeSetReader) and reader.fetches_change_sets:
        fetched = reader.fetch_change_sets(handle)
        return handle, lambda: decode_fetched(handle, fetched, key_groups)
    change_sets = list(reader.read_change_sets(handle, key_groups))
    return handle, lambda: change_sets


class _ForkedSquash:
    """:func:`squash` of fetched logs in a child process, its result read back through a pipe.

    The child only decodes bytes it inherited and writes to its pipe: no locks,
    storage clients or logging, so forking a process that has other threads is safe
    here. Should it hang all the same, it is stopped after :data:`~.child_output.STALL_SECONDS`
    without a word: it writes a byte before each change set, then the document.
    """

    def __init__(self, decoders: list[tuple[ChangelogHandle, Callable[[], Iterable[ChangeSet]]]]) -> None:
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads (see above)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(read_end)

                def ticking(change_sets: Iterable[ChangeSet]) -> Iterator[ChangeSet]:
                    for change_set in change_sets:
                        os.write(write_end, _TICK)
                        yield change_set

                squashed = squash([(handle, ticking(decode())) for handle, decode in decoders], None)
                with os.fdopen(write_end, "wb") as pipe:
                    pipe.write(_DONE)
                    pipe.write(squashed.encode())
                code = 0
            finally:
                os._exit(code)  # no atexit handlers, no destructors of the parent's objects
        os.close(write_end)
        self._pid, self._read_end = pid, read_end

    def result(self) -> SquashedLog | None:
        """The child's squashed logs, or ``None`` if it failed or stalled."""
        document, started = bytearray(), False
        try:
            for chunk in child_output.chunks(self._read_end):
                if not started:
                    chunk = chunk.lstrip(_TICK)
                    if not chunk:
                        continue
                    if chunk[:1] != _DONE:
                        break  # not its output: the child is stopped by the closed pipe
                    started, chunk = True, chunk[1:]
                document += chunk
        except child_output.Stalled:
            log.warning(
                "a restore's forked squash wrote nothing for %g s: stopped, the logs are squashed here",
                child_output.STALL_SECONDS,
            )
            os.kill(self._pid, signal.SIGKILL)
        finally:
            os.close(self._read_end)
            _, status = os.waitpid(self._pid, 0)
        if not started or os.waitstatus_to_exitcode(status) != 0:
            return None
        return SquashedLog.decode(document)


@dataclass(frozen=True)
class DecodedChange:
    """One change record of a log, decoded: what it did to which key of which state."""

    sqn: int
    key_group: int
    op: Op
    state: str
    key: bytes
    args: list[Any]


def decoded_changes(
    reader: StateChangelogReader,
    handle: ChangelogHandle,
    key_groups: KeyGroupRange | None = None,
    registered: Callable[[str, str, str], None] | None = None,
) -> Iterator[DecodedChange]:
    """Every change of ``handle`` (of ``key_groups``), in log order, with its state's name.

    Registration records are taken in on the way (``registered(name, kind,
    serializer)`` hears each); a change of an unregistered state id is an
    :class:`InvalidHandleError`, undecodable bytes a :class:`CorruptedError`.
    """
    names = _Registrations(handle, registered or _ignore)
    for sqn, changes in reader.read_change_sets(handle, key_groups):
        for key_group, data in changes:
            if key_group == META_KEY_GROUP:
                names.record(data)
                continue
            op, state_id, key, args = decode_change(data, where=names.where)
            yield DecodedChange(sqn, key_group, op, names.name(state_id), key, args)


def _ignore(*_: str) -> None:
    return None


def visit(
    reader: StateChangelogReader,
    handle: ChangelogHandle,
    key_groups: KeyGroupRange,
    seen: Callable[[str, int, bytes], None],
    registered: Callable[[str, str, str], None],
) -> None:
    """Call ``seen(state, key group, key)`` for every change of ``key_groups`` in ``handle``."""
    for change in decoded_changes(reader, handle, key_groups, registered):
        seen(change.state, change.key_group, change.key)
