"""Working state in an LMDB file: shared by the processes of a host, opened one after another.

Spark reuses Python workers without making them sticky to partitions: with the state in
an LMDB environment on local disk, whichever worker runs the next batch of a partition
opens the same file instead of restoring from the DSTL. Durability is the DSTL's job, so
transactions are committed without fsync; :meth:`LmdbDelegate.sync` flushes them when a
caller must vouch for the file (the Spark working copy's stamp).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lmdb

from dstl.spi import StorageError

from ..pacing import yielding
from .base import StateDelegate
from .lmdb_records import (
    _INDEX,
    _KG,
    _LIST,
    _MAP,
    _MAX_KEY,
    _base,
    _bases_of,
    _decoded,
    _entry_at,
    _next_index,
    _prefix,
    _remove,
    _store,
    _Txn,
)
from .lmdb_spool import copy_out, remove_stale_spools
from .lmdb_view import LmdbView

__all__ = ["LmdbDelegate"]

_ITEMS_CHUNK = 1024  # map entries read per read transaction while iterating a map


def _disk_failure(exc: lmdb.Error) -> bool:
    """Whether the disk refused the write (py-lmdb raises a plain Error for EIO, as a full tmpfs gives)."""
    text = str(exc)
    return isinstance(exc, lmdb.DiskError) or "Input/output error" in text or "No space left" in text


class LmdbDelegate(StateDelegate):
    """Entries under ``len(state) state key_group key`` in one LMDB environment.

    :param path: directory of the environment (one per operator instance).
    :param map_size: the initial size of the memory map; a write that does not fit
        doubles it (the file itself grows only with the data).
    """

    def __init__(self, path: str | Path, *, map_size: int = 1 << 30) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        remove_stale_spools(self.path)  # views copied out by a process that died
        self._env = lmdb.open(self.path, map_size=map_size, sync=False, metasync=False, max_dbs=0)
        self.resizes = 0
        # Open views (long read transactions, e.g. a materialization in the background): the map
        # may only grow while none is open.
        self._views = 0
        self._views_closed = threading.Condition()
        self._open_views: weakref.WeakSet[LmdbView] = weakref.WeakSet()
        # The bases of the last keys bulk-accessed, by identity: a batch reads a state's values,
        # then writes them back, with the same bound keys (tuples: they cannot change meanwhile).
        self._last_bases: tuple[str, Sequence[int], Sequence[bytes], list[bytes]] | None = None

    @property
    def map_size(self) -> int:
        """The current size of the memory map (the most the environment holds before it grows)."""
        return int(self._env.info()["map_size"])

    def _read(self) -> _Txn:
        """A read transaction; adopts a map another process of the host grew meanwhile."""
        try:
            return self._env.begin()
        except lmdb.MapResizedError:
            self._env.set_mapsize(0)
            return self._env.begin()

    def _write(self, work: Callable[[_Txn], object]) -> None:
        """Run ``work`` in one write transaction; the map doubles (and ``work`` reruns) when it is full.

        Growing needs no other transaction of this process open: the delegate's own
        are all short and on the caller's thread.

        :raises StorageError: when the disk under the environment is full.
        """
        while True:
            try:
                try:
                    txn = self._env.begin(write=True)
                except lmdb.MapResizedError:
                    self._env.set_mapsize(0)
                    continue
                with txn:
                    work(txn)
                return
            except lmdb.MapFullError:
                # The map grows only with no view open: a materialization's view is given up (it
                # fails at its next read and is retried later) rather than waited for to the end.
                for view in list(self._open_views):
                    view.abandon()
                with yielding(), self._views_closed:  # a paced materialization may hold a view
                    self._views_closed.wait_for(lambda: self._views == 0)
                    self._env.set_mapsize(self.map_size * 2)
                self.resizes += 1
            except lmdb.Error as exc:
                if not _disk_failure(exc):
                    raise
                msg = (
                    f"the working state at {self.path} cannot be written: {exc}. Free space on that disk or "
                    "point state.backend.lmdb.dir (dstl.spark.working-dir in Spark) at a larger one; the "
                    "checkpointed state is not affected"
                )
                raise StorageError(msg, retriable=True) from exc

    def _base(self, state: str, key_group: int, key: bytes, extra: int = 0) -> bytes:
        """The key's base, checked against LMDB's key size with ``extra`` bytes (an element's) to follow."""
        if len(state.encode()) > 255:
            msg = f"state name {state[:40]!r}... is longer than 255 bytes"
            raise ValueError(msg)
        base = _base(_prefix(state, key_group), key[: _MAX_KEY + 1])  # the cut key's length still packs
        if len(base) + extra > _MAX_KEY:
            msg = (
                f"state {state!r}: the key ({len(key)} bytes) with the state name and an element's "
                f"{extra} bytes exceeds the {_MAX_KEY} bytes of an LMDB key; use shorter keys or "
                "state.backend.delegate=heap"
            )
            raise ValueError(msg)
        return base

    def _bases(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> list[bytes]:
        """The bases of ``keys`` (each in its key group), checked as :meth:`_base` checks one."""
        last = self._last_bases
        if last is not None and last[0] == state and last[1] is key_groups and last[2] is keys:
            return last[3]
        longest = max(map(len, keys), default=0)
        if len(self._base(state, 0, b"")) + longest > _MAX_KEY:  # the state's name checked too
            self._base(state, 0, next(key for key in keys if len(key) == longest))  # raises, naming it
        prefixes = {key_group: _prefix(state, key_group) for key_group in set(key_groups)}
        bases = _bases_of(map(prefixes.__getitem__, key_groups), keys)
        if type(key_groups) is tuple and type(keys) is tuple:  # immutable: safe to know again by identity
            self._last_bases = (state, key_groups, keys, bases)
        return bases

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """The entry, or ``None`` (a collection's elements gathered: one seek, then a range)."""
        base = self._base(state, key_group, key)
        with self._read() as txn:
            return _entry_at(txn, base)

    def get_many(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> list[Any]:
        """Every entry in one read transaction."""
        self._base(state, 0, b"")  # validates the state name
        with self._read() as txn:
            found = []
            for key_group, key in zip(key_groups, keys, strict=True):
                base = _base(_prefix(state, key_group), key)
                raw = txn.get(base)  # a value: one lookup; a collection has no record at its base
                found.append(raw if raw is not None else _entry_at(txn, base))
            return found

    def get_values(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> list[bytes | None]:
        """One lookup per key in one read transaction: a value has no element records to gather."""
        bases = self._bases(state, key_groups, keys)
        with self._read() as txn:
            return list(map(txn.get, bases))

    def put_values(
        self, state: str, key_groups: Sequence[int], keys: Sequence[bytes], values: Sequence[bytes]
    ) -> None:
        """Every key group's values in one write transaction (a value replaces one record)."""
        bases = self._bases(state, key_groups, keys)
        self._last_bases = None  # the write is their last use: keep no batch's keys between batches
        # one C call for every record (putmulti), not a Python call per record
        self._write(lambda txn: txn.cursor().putmulti(zip(bases, values, strict=True)))

    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:
        """Store ``entry`` (a collection replaces every element the key had)."""
        base = self._base(state, key_group, key)
        self._write(lambda txn: _store(txn, base, entry))

    def write_batch(self, state: str, key_group: int, entries: Mapping[bytes, Any]) -> None:
        """All in one write transaction (a transaction per entry would dominate a restore).

        Values only (a value state's section, most of a restore): one C call writes them.
        """
        prefix = _prefix(state, key_group)
        keys = list(entries)
        self._base(state, key_group, max(keys, key=len, default=b""))  # the state name, the longest key
        values = list(entries.values())
        if set(map(type, values)) == {bytes}:
            bases = _bases_of([prefix] * len(keys), keys)
            self._write(lambda txn: txn.cursor().putmulti(zip(bases, values, strict=True)))
            return

        def write(txn: _Txn) -> None:
            for key, entry in entries.items():
                base = _base(prefix, key)
                if entry is None:
                    _remove(txn, base)
                else:
                    _store(txn, base, entry)

        self._write(write)

    def delete(self, state: str, key_group: int, key: bytes) -> None:
        """Remove the entry (a collection's elements too)."""
        base = self._base(state, key_group, key)
        self._write(lambda txn: _remove(txn, base))

    def append(self, state: str, key_group: int, key: bytes, element: bytes) -> None:
        """One record after the list's last (found by one seek): O(log n), not O(n)."""
        base = self._base(state, key_group, key, 1 + _INDEX.size)
        first = base + _LIST

        def write(txn: _Txn) -> None:
            txn.put(first + _INDEX.pack(_next_index(txn, base)), element)

        self._write(write)

    def extend(self, state: str, key_group: int, key: bytes, part: list[bytes] | dict[bytes, bytes]) -> None:
        """Records after the list's last (or map entries), in one write transaction."""
        base = self._base(state, key_group, key, 1 + _INDEX.size)

        def write(txn: _Txn) -> None:
            if isinstance(part, dict):
                for map_key, value in part.items():
                    txn.put(base + _MAP + map_key, value)
                return
            index = _next_index(txn, base)
            for offset, element in enumerate(part):
                txn.put(base + _LIST + _INDEX.pack(index + offset), element)

        self._write(write)

    def _map_key(self, state: str, key_group: int, key: bytes, map_key: bytes) -> bytes:
        return self._base(state, key_group, key, 1 + len(map_key)) + _MAP + map_key

    def map_get(self, state: str, key_group: int, key: bytes, map_key: bytes) -> bytes | None:
        """One lookup."""
        stored = self._map_key(state, key_group, key, map_key)
        with self._read() as txn:
            return txn.get(stored)

    def map_put(self, state: str, key_group: int, key: bytes, map_key: bytes, value: bytes) -> None:
        """One record."""
        stored = self._map_key(state, key_group, key, map_key)
        self._write(lambda txn: txn.put(stored, value))

    def map_remove(self, state: str, key_group: int, key: bytes, map_key: bytes) -> None:
        """One record removed."""
        stored = self._map_key(state, key_group, key, map_key)
        self._write(lambda txn: txn.delete(stored))

    def map_items(self, state: str, key_group: int, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The map's entries, read a chunk per read transaction (none stays open while the caller works)."""
        first = self._base(state, key_group, key) + _MAP
        position = first
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            with self._read() as txn:
                cursor = txn.cursor()
                if cursor.set_range(position):
                    for raw_key, raw in cursor:
                        if not raw_key.startswith(first):
                            break
                        chunk.append((raw_key[len(first) :], raw))
                        if len(chunk) == _ITEMS_CHUNK:
                            break
            yield from chunk
            if len(chunk) < _ITEMS_CHUNK:
                return
            position = first + chunk[-1][0] + b"\x00"  # the smallest key after the last one read

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every entry of a state in a key group (read in one transaction)."""
        prefix = _prefix(state, key_group)
        with self._read() as txn:
            cursor = txn.cursor()
            found = list(_decoded(iter(cursor), prefix)) if cursor.set_range(prefix) else []
        return iter(found)

    ordered = True

    def entries_after(
        self, state: str, key_group: int, after: bytes | None, limit: int
    ) -> list[tuple[bytes, Any]]:
        """Up to ``limit`` entries after key ``after``: one seek (records are in key order)."""
        prefix = _prefix(state, key_group)
        found: list[tuple[bytes, Any]] = []
        with self._read() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(prefix if after is None else _base(prefix, after)):
                return found
            for key, entry in _decoded(iter(cursor), prefix):
                if key == after:
                    continue
                found.append((key, entry))
                if len(found) == limit:
                    break
        return found

    def drop_key_group(self, key_group: int) -> None:
        """Delete the group's records of every state, in one write transaction."""
        prefixes = [_prefix(state, key_group) for state in self.states()]

        def drop(txn: _Txn) -> None:
            cursor = txn.cursor()
            for prefix in prefixes:
                if cursor.set_range(prefix):
                    while cursor.key().startswith(prefix) and cursor.delete():
                        pass

        self._write(drop)

    def states(self) -> list[str]:
        """Names of the states holding entries (found by skipping from state to state, nothing decoded)."""
        with self.view() as view:
            return view.state_names()

    def stored_rows(self) -> int:
        """Records in the file (a collection's elements each), from LMDB's counters."""
        return int(self._env.stat()["entries"])

    def stored_bytes(self) -> int:
        """Pages in use times the page size: the file's data, whatever the map's size."""
        return (int(self._env.info()["last_pgno"]) + 1) * int(self._env.stat()["psize"])

    def clear(self) -> None:
        """Remove every entry (one write transaction; the file keeps its pages for reuse)."""
        self._write(lambda txn: txn.drop(self._env.open_db(), delete=False))

    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """Everything, read in one (MVCC) read transaction: a consistent view."""
        found: dict[str, dict[int, dict[bytes, Any]]] = {}
        with self._read() as txn:
            for raw_key, _ in txn.cursor():
                length = raw_key[0]
                state = bytes(raw_key[1 : 1 + length]).decode()
                (key_group,) = _KG.unpack_from(raw_key, 1 + length)
                found.setdefault(state, {})[key_group] = {}
            for state, groups in found.items():
                for key_group in groups:
                    prefix = _prefix(state, key_group)
                    cursor = txn.cursor()
                    cursor.set_range(prefix)
                    groups[key_group] = dict(_decoded(iter(cursor), prefix))
        return found

    def view(self) -> LmdbView:
        """A read transaction: a consistent view in O(1), read one key group at a time."""
        with self._views_closed:
            self._views += 1
        try:
            view = LmdbView(
                self._read(), on_close=self._view_closed, copy=lambda txn: copy_out(self._env, txn, self.path)
            )
            self._open_views.add(view)
            return view
        except BaseException:
            self._view_closed()
            raise

    def _view_closed(self) -> None:
        with self._views_closed:
            self._views -= 1
            self._views_closed.notify_all()

    def sync(self) -> None:
        """Flush every committed transaction to disk (data and meta pages)."""
        self._env.sync(True)

    def close(self) -> None:
        """Close the environment (the file stays for the next process)."""
        self._env.close()
