"""Working state in an LMDB file: shared by the processes of a host, opened one after another.

Spark reuses Python workers without making them sticky to partitions: with the
state in an LMDB environment on local disk, whichever worker runs the next batch
of a partition opens the same file instead of restoring from the DSTL.
Durability is the DSTL's job, so transactions are committed without fsync;
:meth:`LmdbDelegate.sync` flushes them when a caller must vouch for the file
(the Spark working copy's stamp).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from dstl.spi import StorageError

from .base import StateDelegate, StateView

__all__ = ["LmdbDelegate"]

_KG = struct.Struct(">i")


def _prefix(state: str, key_group: int) -> bytes:
    name = state.encode()
    return bytes([len(name)]) + name + _KG.pack(key_group)


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
        self._env = lmdb.open(self.path, map_size=map_size, sync=False, metasync=False, max_dbs=0)
        self.resizes = 0
        # Open views (long read transactions, e.g. a materialization in the background): the map
        # may only grow while none is open.
        self._views = 0
        self._views_closed = threading.Condition()

    @property
    def map_size(self) -> int:
        """The current size of the memory map (the most the environment holds before it grows)."""
        return int(self._env.info()["map_size"])

    def _read(self) -> lmdb.Transaction:
        """A read transaction; adopts a map another process of the host grew meanwhile."""
        try:
            return self._env.begin()
        except lmdb.MapResizedError:
            self._env.set_mapsize(0)
            return self._env.begin()

    def _write(self, work: Callable[[lmdb.Transaction], None]) -> None:
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
                with self._views_closed:
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

    def _key(self, state: str, key_group: int, key: bytes) -> bytes:
        if len(state.encode()) > 255:
            msg = f"state name {state[:40]!r}... is longer than 255 bytes"
            raise ValueError(msg)
        return _prefix(state, key_group) + key

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:  # noqa: ANN401
        """The entry, or ``None``."""
        with self._read() as txn:
            raw = txn.get(self._key(state, key_group, key))
        return None if raw is None else msgpack.unpackb(raw, raw=False, strict_map_key=False)

    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:  # noqa: ANN401
        """Store ``entry``."""
        stored_key, value = self._key(state, key_group, key), msgpack.packb(entry, use_bin_type=True)
        self._write(lambda txn: txn.put(stored_key, value))

    def write_batch(self, state: str, key_group: int, entries: Mapping[bytes, Any]) -> None:
        """All in one write transaction (a transaction per entry would dominate a restore)."""
        prefix = _prefix(state, key_group)
        self._key(state, key_group, b"")  # validates the state name
        packb = msgpack.packb

        def write(txn: lmdb.Transaction) -> None:
            for key, entry in entries.items():
                if entry is None:
                    txn.delete(prefix + key)
                else:
                    txn.put(prefix + key, packb(entry, use_bin_type=True))

        self._write(write)

    def delete(self, state: str, key_group: int, key: bytes) -> None:
        """Remove the entry."""
        stored_key = self._key(state, key_group, key)
        self._write(lambda txn: txn.delete(stored_key))

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every entry of a state in a key group (read in one transaction)."""
        prefix = _prefix(state, key_group)
        found = []
        with self._read() as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                for raw_key, raw in cursor:
                    if not raw_key.startswith(prefix):
                        break
                    found.append(
                        (bytes(raw_key[len(prefix) :]), msgpack.unpackb(raw, raw=False, strict_map_key=False))
                    )
        return iter(found)

    def states(self) -> list[str]:
        """Names of the states holding entries (found by skipping from state to state, nothing decoded)."""
        with self.view() as view:
            return view.state_names()

    def clear(self) -> None:
        """Remove every entry (one write transaction; the file keeps its pages for reuse)."""
        self._write(lambda txn: txn.drop(self._env.open_db(), delete=False))

    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """Everything, read in one (MVCC) read transaction: a consistent view."""
        view: dict[str, dict[int, dict[bytes, Any]]] = {}
        with self._read() as txn:
            for raw_key, raw in txn.cursor():
                length = raw_key[0]
                state = bytes(raw_key[1 : 1 + length]).decode()
                (key_group,) = _KG.unpack_from(raw_key, 1 + length)
                key = bytes(raw_key[1 + length + _KG.size :])
                view.setdefault(state, {}).setdefault(key_group, {})[key] = msgpack.unpackb(
                    raw, raw=False, strict_map_key=False
                )
        return view

    def view(self) -> LmdbView:
        """A read transaction: a consistent view in O(1), read one key group at a time."""
        with self._views_closed:
            self._views += 1
        try:
            return LmdbView(self, self._read())
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


class LmdbView(StateView):
    """One LMDB read transaction (MVCC): the state as it was when the view was taken."""

    def __init__(self, delegate: LmdbDelegate, txn: lmdb.Transaction) -> None:
        self._delegate = delegate
        self._txn: lmdb.Transaction | None = txn

    def _open(self) -> lmdb.Transaction:
        if self._txn is None:
            msg = "the view is closed"
            raise ValueError(msg)
        return self._txn

    def state_names(self) -> list[str]:
        """The state names in the view, found by skipping from one state's prefix to the next."""
        cursor = self._open().cursor()
        found: list[str] = []
        position = b""
        while cursor.set_range(position):
            raw_key = cursor.key()
            length = raw_key[0]
            name = bytes(raw_key[1 : 1 + length])
            found.append(name.decode())
            position = bytes([length]) + name + b"\xff" * (_KG.size + 1)  # past every key of this state
        return sorted(found)

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """The entries of a state in a key group, decoded as the cursor reaches them."""
        prefix = _prefix(state, key_group)
        cursor = self._open().cursor()
        if not cursor.set_range(prefix):
            return
        for raw_key, raw in cursor:
            if not raw_key.startswith(prefix):
                return
            yield bytes(raw_key[len(prefix) :]), msgpack.unpackb(raw, raw=False, strict_map_key=False)

    def close(self) -> None:
        """End the read transaction (idempotent)."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
            self._delegate._view_closed()  # noqa: SLF001 - the view belongs to its delegate
