"""A consistent view of an LMDB working state: one read transaction, or its copy once detached."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from itertools import chain, islice, takewhile
from pathlib import Path
from typing import Any

import lmdb

from dstl.spi import StorageError

from .base import SECTION_ENTRIES, RowBlock, StateView, chunk_rows
from .lmdb_records import _KG, _base, _chunked, _decoded, _entry_at, _prefix, _Txn, _value_rows
from .lmdb_spool import open_copy

__all__ = ["LmdbView", "read_copy"]

log = logging.getLogger(__name__)


class LmdbView(StateView):
    """One LMDB read transaction (MVCC): the state as it was when the view was taken.

    :param on_close: called once when the view stops holding the delegate's environment
        (closed, or detached onto a copy): its delegate counts open views.
    :param copy: copies what a transaction sees to a spool (:func:`~.lmdb_spool.copy_out`).
    """

    def __init__(
        self,
        txn: _Txn,
        *,
        on_close: Callable[[], None],
        copy: Callable[[_Txn], tuple[Path, lmdb.Environment]] | None = None,
    ) -> None:
        self._on_close = on_close
        self._copy = copy
        self._txn: _Txn | None = txn
        self._abandoned = False
        self._closed = False
        self._spool: Path | None = None  # the copy's directory, once detached
        self._spool_env: lmdb.Environment | None = None  # None while handed over
        self._swapping = threading.Lock()  # abandon() comes from the writer's thread

    def abandon(self) -> None:
        """Make the view's next read fail: the map must grow, which no open view allows.

        A view already detached onto its copy holds nothing of the map: it goes on.
        """
        with self._swapping:
            if self._spool is None:
                self._abandoned = True

    def detach(self) -> None:
        """Copy the view's pages to a spool beside the environment and read the copy from now on.

        The live environment reuses its pages again and its map may grow; a view given
        up meanwhile is not any more. When the copy fails (e.g. the disk is full) the
        view stays on the live environment, as before.
        """
        live = self._txn
        if live is None or self._copy is None or self._spool is not None:
            return
        try:
            spool = self._copy(live)
        except (lmdb.Error, OSError) as exc:
            log.warning("dstl: the view stays on the live LMDB file (its copy failed: %s)", exc)
            return
        directory, environment = spool
        try:
            txn = environment.begin()
        except lmdb.Error as exc:
            environment.close()
            shutil.rmtree(directory, ignore_errors=True)
            log.warning("dstl: the view stays on the live LMDB file (its copy cannot be read: %s)", exc)
            return
        with self._swapping:
            self._txn, self._spool, self._spool_env, self._abandoned = txn, directory, environment, False
        live.abort()
        self._on_close()

    def _open(self) -> _Txn:
        if self._abandoned:
            msg = "the view was given up so that the LMDB map could grow; the materialization is retried"
            raise StorageError(msg, retriable=True)
        if self._txn is None and self._spool is not None and not self._closed:  # handed over: read again
            self._spool_env = open_copy(self._spool)
            self._txn = self._spool_env.begin()
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
        if cursor.set_range(prefix):
            yield from _decoded(iter(cursor), prefix)

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """One key's entry as the view holds it."""
        return _entry_at(self._open(), _base(_prefix(state, key_group), key))

    def chunks(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any, bool]]:
        """The entries with collections in parts, streamed from the cursor (no collection held whole)."""
        prefix = _prefix(state, key_group)
        cursor = self._open().cursor()
        if cursor.set_range(prefix):
            yield from _chunked(iter(cursor), prefix)

    def row_blocks(self, state: str, key_group: int) -> Iterator[RowBlock]:
        """The rows off the cursor a block of records at a time; single values without a step per record.

        Each block is checked in C-level passes: a record is a single value when its
        key ends right after the stored key (a collection's elements carry a tail).
        From the first block that holds an element on, records go through the
        collection-aware :meth:`chunks` path.
        """
        prefix = _prefix(state, key_group)
        cursor = self._open().cursor()
        if not cursor.set_range(prefix):
            return
        records = cursor.iternext()
        at = len(prefix)
        while block := list(islice(records, SECTION_ENTRIES)):
            ended = len(block) < SECTION_ENTRIES or not block[-1][0].startswith(prefix)
            if ended:  # the state's records in the key group end in this block
                block = list(takewhile(lambda record: record[0].startswith(prefix), block))
            values = _value_rows(state, block, at)
            if values is None:
                yield from chunk_rows(state, _chunked(chain(block, () if ended else records), prefix))
                return
            yield values, True
            if ended:
                return

    def key_chunks(self, state: str, key_group: int, key: bytes) -> Iterator[tuple[bytes, Any, bool]]:
        """One key's parts, streamed (a tombstone when it has no entry)."""
        base = _base(_prefix(state, key_group), key)
        cursor = self._open().cursor()
        found = False
        if cursor.set_range(base) and cursor.key().startswith(base):
            for chunk in _chunked(iter(cursor), base[: 1 + base[0] + _KG.size]):
                if chunk[0] != key:
                    break
                found = True
                yield chunk
        if not found:
            yield key, None, False

    def hand_over_copy(self) -> str | None:
        """The spool's directory once detached, its environment closed here (see :class:`StateView`)."""
        if self._spool is None or self._closed:
            return None
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._spool_env is not None:
            self._spool_env.close()
            self._spool_env = None
        return str(self._spool)

    def close(self) -> None:
        """End the read transaction and remove the view's copy, if any (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._spool is None:
            self._on_close()
            return
        if self._spool_env is not None:
            self._spool_env.close()
            self._spool_env = None
        shutil.rmtree(self._spool, ignore_errors=True)


def read_copy(directory: str) -> LmdbView:
    """A view of a copy that another process spooled (``hand_over_copy``); closing it leaves the copy.

    The copy is the other process's to remove, when its own view closes.
    """
    environment = open_copy(directory)
    try:
        txn = environment.begin()
    except BaseException:
        environment.close()
        raise
    return LmdbView(txn, on_close=environment.close)
