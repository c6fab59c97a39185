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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from .base import StateDelegate

__all__ = ["LmdbDelegate"]

_KG = struct.Struct(">i")


def _prefix(state: str, key_group: int) -> bytes:
    name = state.encode()
    return bytes([len(name)]) + name + _KG.pack(key_group)


class LmdbDelegate(StateDelegate):
    """Entries under ``len(state) state key_group key`` in one LMDB environment.

    :param path: directory of the environment (one per operator instance).
    :param map_size: the most bytes the environment may hold.
    """

    def __init__(self, path: str | Path, *, map_size: int = 1 << 30) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self._env = lmdb.open(self.path, map_size=map_size, sync=False, metasync=False, max_dbs=0)

    def _key(self, state: str, key_group: int, key: bytes) -> bytes:
        if len(state.encode()) > 255:
            msg = f"state name {state[:40]!r}... is longer than 255 bytes"
            raise ValueError(msg)
        return _prefix(state, key_group) + key

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:  # noqa: ANN401
        """The entry, or ``None``."""
        with self._env.begin() as txn:
            raw = txn.get(self._key(state, key_group, key))
        return None if raw is None else msgpack.unpackb(raw, raw=False, strict_map_key=False)

    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:  # noqa: ANN401
        """Store ``entry``."""
        with self._env.begin(write=True) as txn:
            txn.put(self._key(state, key_group, key), msgpack.packb(entry, use_bin_type=True))

    def write_batch(self, state: str, key_group: int, entries: Mapping[bytes, Any]) -> None:
        """All in one write transaction (a transaction per entry would dominate a restore)."""
        prefix = _prefix(state, key_group)
        self._key(state, key_group, b"")  # validates the state name
        packb = msgpack.packb
        with self._env.begin(write=True) as txn:
            for key, entry in entries.items():
                if entry is None:
                    txn.delete(prefix + key)
                else:
                    txn.put(prefix + key, packb(entry, use_bin_type=True))

    def delete(self, state: str, key_group: int, key: bytes) -> None:
        """Remove the entry."""
        with self._env.begin(write=True) as txn:
            txn.delete(self._key(state, key_group, key))

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every entry of a state in a key group (read in one transaction)."""
        prefix = _prefix(state, key_group)
        found = []
        with self._env.begin() as txn:
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
        """Names of the states holding entries."""
        return sorted(self.snapshot())

    def clear(self) -> None:
        """Remove every entry (one write transaction; the file keeps its pages for reuse)."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._env.open_db(), delete=False)

    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """Everything, read in one (MVCC) read transaction: a consistent view."""
        view: dict[str, dict[int, dict[bytes, Any]]] = {}
        with self._env.begin() as txn:
            for raw_key, raw in txn.cursor():
                length = raw_key[0]
                state = bytes(raw_key[1 : 1 + length]).decode()
                (key_group,) = _KG.unpack_from(raw_key, 1 + length)
                key = bytes(raw_key[1 + length + _KG.size :])
                view.setdefault(state, {}).setdefault(key_group, {})[key] = msgpack.unpackb(
                    raw, raw=False, strict_map_key=False
                )
        return view

    def sync(self) -> None:
        """Flush every committed transaction to disk (data and meta pages)."""
        self._env.sync(True)

    def close(self) -> None:
        """Close the environment (the file stays for the next process)."""
        self._env.close()
