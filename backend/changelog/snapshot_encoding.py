"""Encoding a snapshot's sections: in the caller's process, or in a forked one from a spooled copy.

A materialization runs beside the task that processes batches, in the same Python
process: encoding millions of entries there takes the GIL from the task (a wait of up to
the switch interval at each of its releases) and is paced to a tenth of the time while
batches run back to back. A view detached onto a copy of the state (an LMDB spool) can be
read by any process: a forked child encodes it into a local file at a lower CPU priority,
with no GIL in common with the task, and the parent only uploads the file.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from dstl.spi import StorageError

from ..delegate import StateView
from ..materialization import SnapshotWriter
from ..options import CHANGELOG_MATERIALIZATION_COMPRESSION, CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM
from ..pacing import Pacer
from .sections import purged

__all__ = ["NICENESS", "Expiry", "SnapshotEncoding", "encode_sections"]

#: The forked encoder's niceness: beside a batch on the same core it gets about a tenth of it
#: (Linux's weights: 110 against 1024), the share a paced in-process materialization keeps.
NICENESS = 10
#: The file the forked encoder writes, inside the spool (it goes with the spool).
ENCODED_NAME = "dstl-snapshot.part"


@dataclass
class Expiry:
    """What a snapshot leaves out as expired, and the keys it found so (for the owner to remove).

    :ivar ttl_states: ``name -> (kind, seconds)`` to purge; empty for an incremental
        (only a full snapshot cleans up).
    :ivar now: the clock TTL is measured against.
    :ivar most: the most keys noted; the rest are found by the next full snapshot.
    :ivar found: ``(state, key group, key)`` noted so far.
    """

    ttl_states: dict[str, tuple[str, float]]
    now: float
    most: int
    found: list[tuple[str, int, bytes]] = field(default_factory=list)

    def note(self, state: str, key_group: int, key: bytes) -> None:
        """Note an expired key (beyond :attr:`most`, nothing)."""
        if len(self.found) < self.most:
            self.found.append((state, key_group, key))


def encode_sections(
    view: StateView,
    key_groups: Iterable[int],
    writer: SnapshotWriter,
    expiry: Expiry,
    between: Callable[[], object],
) -> None:
    """Add ``view``'s sections of ``key_groups`` to ``writer``, leaving out state whose TTL expired.

    :param between: called after each section (pacing, a liveness check).
    """
    ttl_states = expiry.ttl_states
    for key_group, section in view.sections(key_groups):
        if ttl_states:

            def note(state: str, key: bytes, key_group: int = key_group) -> None:
                expiry.note(state, key_group, key)

            kept = purged(section, ttl_states, expiry.now, note)
        else:
            kept = section
        if kept:
            writer.add_section(key_group, kept)
        between()


@dataclass(frozen=True)
class SnapshotEncoding:
    """How a materialization encodes a snapshot object: the sections' codec, and where.

    :ivar codec: section compression, a name of :data:`~dstl.backend.materialization.CODEC_IDS`.
    :ivar apart_from: a view detached onto a copy of at least this many bytes is encoded
        by a forked process (:data:`NICENESS`); 0: always in the caller's process.
    """

    codec: str = CHANGELOG_MATERIALIZATION_COMPRESSION.default
    apart_from: int = CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM.default

    def write(
        self,
        fs: Any,
        path: str,
        view: StateView,
        key_groups: range,
        meta: dict[str, Any],
        expiry: Expiry,
    ) -> tuple[int, int]:
        """Write ``view``'s snapshot to ``path`` on ``fs``; its size and entries (:func:`encode_sections`).

        :raises StorageError: a forked encoder failed. Whatever the failure, what was written
            to ``path`` is the caller's to remove.
        """
        spool = view.hand_over_copy() if self.apart_from and hasattr(os, "fork") else None
        if spool is not None and self.apart_from <= _spool_bytes(spool):
            room = Expiry(expiry.ttl_states, expiry.now, expiry.most - len(expiry.found))
            encoded = _ForkedEncoding(view, spool, key_groups, self.codec, meta, room).run()
            expiry.found.extend(encoded.expired)
            fs.put_file(str(encoded.path), path)  # I/O: the task keeps the GIL meanwhile
            encoded.path.unlink()  # its room on the working disk is free before the view closes
            return encoded.size, encoded.entries
        stream = fs.open(path, "wb")
        try:
            writer = SnapshotWriter(stream, self.codec)
            # paced between sections: a batch being processed meanwhile keeps the GIL (mostly)
            encode_sections(view, key_groups, writer, expiry, Pacer())
            size = writer.finish(meta)
        except BaseException:
            # Closing would commit what was written (fsspec files commit on close): abort the
            # upload where the file can (an S3 multipart upload), and close it quietly.
            with contextlib.suppress(Exception):
                stream.discard()
            with contextlib.suppress(Exception):
                stream.close()
            raise
        stream.close()
        return size, writer.entries


def _spool_bytes(directory: str) -> int:
    """The size of a spooled copy's files (what deciding to encode it apart goes by)."""
    return sum(entry.stat().st_size for entry in Path(directory).iterdir() if entry.is_file())


@dataclass(frozen=True)
class _EncodedSnapshot:
    """A snapshot a forked encoder wrote to a local file: what the parent uploads and records."""

    path: Path
    size: int
    entries: int
    expired: list[tuple[str, int, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class _ForkedEncoding:
    """What a forked encoder needs (inherited by the fork: nothing is encoded to hand it over).

    :ivar view: what the child reads: a view whose copy was handed over
        (:meth:`~dstl.backend.delegate.StateView.hand_over_copy`; ``spool`` is its directory).
    """

    view: StateView
    spool: str
    key_groups: range
    codec: str
    meta: dict[str, Any]
    expiry: Expiry  # the room left in the parent's

    def run(self) -> _EncodedSnapshot:
        """Encode the spool into a file inside it, in a forked child; wait for it.

        :raises StorageError: the child failed (retriable: the materialization is retried).
        """
        target = Path(self.spool) / ENCODED_NAME
        parent = os.getpid()
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads (see _child)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_end)
            self._child(target, parent, write_end)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            result = msgpack.unpackb(data, raw=False, strict_map_key=False) if data else {}
        except (ValueError, msgpack.UnpackException):
            result = {}
        if code != 0 or "error" in result or "size" not in result:
            why = result.get("error") or f"it ended with exit code {code}"
            msg = f"the forked snapshot encoder failed: {why}"
            raise StorageError(msg, retriable=True)
        expired = [(state, key_group, key) for state, key_group, key in result["expired"]]
        return _EncodedSnapshot(target, result["size"], result["entries"], expired)

    def _child(self, target: Path, parent: int, write_end: int) -> None:
        """Encode, report through the pipe, exit without the parent's atexit handlers or destructors.

        The child opens its own environment on the spool and its own file: it touches no
        lock, storage client or logger of the parent's threads, so forking is safe here. It
        keeps none of the parent's descriptors (a lock the parent holds, the socket to
        Spark) past the parent's death, and no collection runs a finalizer of the parent's.
        """
        code = 1
        try:
            gc.disable()
            os.closerange(3, write_end)
            os.closerange(write_end + 1, os.sysconf("SC_OPEN_MAX"))
            os.nice(NICENESS)
            report: dict[str, Any]
            try:
                report = self._encode(target, parent)
                code = 0
            except BaseException as exc:
                report = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(msgpack.packb(report, use_bin_type=True))
        finally:
            os._exit(code)

    def _encode(self, target: Path, parent: int) -> dict[str, Any]:
        def alive() -> None:
            if os.getppid() != parent:  # the task's process died: nobody uploads this
                msg = "the materializing process ended"
                raise RuntimeError(msg)

        with target.open("wb") as stream:  # the view opens its copy again, in this process
            writer = SnapshotWriter(stream, self.codec)
            encode_sections(self.view, self.key_groups, writer, self.expiry, alive)
            size = writer.finish(self.meta)
        return {"size": size, "entries": writer.entries, "expired": self.expiry.found}
