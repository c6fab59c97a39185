"""Encoding a snapshot's sections: in the caller's process, or in a process of its own from a spooled copy.

A materialization runs beside the task that processes batches, in the same Python
process: encoding millions of entries there takes the GIL from the task (a wait of up to
the switch interval at each of its releases) and is paced to a tenth of the time while
batches run back to back. A view detached onto a copy of the state (an LMDB spool) can be
read by any process: a fresh interpreter (:mod:`.encoder_process`) encodes it into a local
file at a lower CPU priority, with no GIL in common with the task, and the parent only
uploads the file. A fresh interpreter, not a fork: a forked child kept the original of
every page the task's process rewrote while it ran (reference counts write to the
objects they count), up to three quarters of that process's memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from dstl.spi import StorageError

from ..delegate import StateView
from ..filesystems import put_local_file
from ..materialization import SnapshotWriter
from ..options import (
    CHANGELOG_MATERIALIZATION_COMPRESSION,
    CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM,
    CHANGELOG_MATERIALIZATION_ENCODER_NICENESS,
)
from ..pacing import Pacer
from . import child_output
from .changed_keys import ChangedKeysView
from .sections import purged
from .settings import BackendSettings

__all__ = ["EncodeRequest", "EncoderNotStarted", "Expiry", "SnapshotEncoding", "encode_sections"]

log = logging.getLogger(__name__)

#: What the encoder process runs (``python -m``).
ENCODER_MODULE = "dstl.backend.changelog.encoder_process"
#: The encoder's files, inside the spool (they go with it): its request, the object, its stderr.
REQUEST_NAME = "dstl-snapshot.request"
ENCODED_NAME = "dstl-snapshot.part"
ERRORS_NAME = "dstl-snapshot.stderr"
#: The end of the encoder's stderr a failure quotes.
_QUOTED_ERRORS = 800


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
        by an encoder process; 0: always in the caller's process.
    :ivar niceness: what the encoder process adds to the caller's niceness.
    """

    codec: str = CHANGELOG_MATERIALIZATION_COMPRESSION.default
    apart_from: int = CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM.default
    niceness: int = CHANGELOG_MATERIALIZATION_ENCODER_NICENESS.default

    @classmethod
    def of(cls, settings: BackendSettings) -> SnapshotEncoding:
        """The encoding a backend's settings ask for."""
        return cls(settings.snapshot_compression, settings.encode_apart_from, settings.encoder_niceness)

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

        :raises StorageError: the encoder process failed or stalled. Whatever the failure, what was written
            to ``path`` is the caller's to remove.
        """
        spool = view.hand_over_copy() if self.apart_from and _can_spawn() else None
        if spool is not None and self.apart_from <= _spool_bytes(spool):
            changes = view.changes() if isinstance(view, ChangedKeysView) else None
            room = expiry.most - len(expiry.found)
            request = EncodeRequest(
                spool,
                key_groups,
                self.codec,
                meta,
                expiry.ttl_states,
                expiry.now,
                room,
                os.getpid(),
                changes,
                self.niceness,
            )
            try:
                report = _spawned(request)
            except EncoderNotStarted as exc:  # e.g. the worker's interpreter cannot import dstl by -m
                log.warning("%s: this snapshot is encoded in the task's process", exc)
            else:
                expiry.found.extend((state, key_group, key) for state, key_group, key in report["expired"])
                # I/O (the task keeps the GIL meanwhile, unless renamed); the file's room on the
                # working disk is free before the view closes
                put_local_file(fs, str(Path(spool) / ENCODED_NAME), path)
                return report["size"], report["entries"]
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


def _can_spawn() -> bool:
    """Whether an encoder process can be started and followed here (a POSIX Python with an executable)."""
    return os.name == "posix" and bool(sys.executable)


@dataclass(frozen=True)
class EncodeRequest:
    """What an encoder process is asked: one snapshot object of a spooled copy (msgpack, a file in the spool).

    :ivar spool: the copy's directory (``hand_over_copy``); the object goes to
        :data:`ENCODED_NAME` inside it.
    :ivar changes: an incremental's changed keys (``ChangedKeysView.changes``); ``None``
        for a full snapshot.
    :ivar most: how many expired keys to report at most.
    :ivar parent: the requesting process: the encoder gives up when it is gone.
    :ivar niceness: what the encoder adds to its niceness before it starts.
    """

    spool: str
    key_groups: range
    codec: str
    meta: dict[str, Any]
    ttl_states: dict[str, tuple[str, float]]
    now: float
    most: int
    parent: int
    changes: dict[str, Any] | None
    niceness: int = CHANGELOG_MATERIALIZATION_ENCODER_NICENESS.default

    def encode(self) -> bytes:
        """The request as msgpack (once: the changed keys of an incremental may be millions)."""
        fields = dict(vars(self), key_groups=[self.key_groups.start, self.key_groups.stop])
        return msgpack.packb(fields, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> EncodeRequest:
        """The request :meth:`encode` wrote (our own process's file: trusted, but checked for shape)."""
        fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if not isinstance(fields, dict) or set(fields) != set(cls.__dataclass_fields__):
            msg = "the snapshot encoder's request is not one this version writes"
            raise ValueError(msg)
        start, stop = fields.pop("key_groups")
        return cls(key_groups=range(start, stop), **fields)


class EncoderNotStarted(StorageError):
    """No encoder process came up (no message from it): the snapshot is encoded in the task's process."""


def _spawned(request: EncodeRequest) -> dict[str, Any]:
    """Run an encoder process for ``request``; its final report (``size``, ``entries``, ``expired``).

    :raises EncoderNotStarted: it could not be started, or ended or stalled before its first message.
    :raises StorageError: (retriable) the process failed, or finished no section for
        :data:`~.child_output.STALL_SECONDS` and was killed.
    """
    spool = Path(request.spool)
    requested = spool / REQUEST_NAME
    requested.write_bytes(request.encode())
    # the interpreter finds what this one does (a Spark worker adds its archives at run time)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(entry for entry in sys.path if entry))
    with (spool / ERRORS_NAME).open("wb") as errors:
        try:
            process = subprocess.Popen(
                encoder_command(requested),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=environment,
                close_fds=True,
            )
        except OSError as exc:
            msg = f"the snapshot encoder process could not be started ({exc})"
            raise EncoderNotStarted(msg, retriable=True) from exc
    try:
        followed = _followed(process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
    if followed.stalled:
        why = f"it finished no section for {child_output.STALL_SECONDS:g} s and was stopped"
    elif process.returncode == 0 and "size" in followed.report:
        return followed.report
    else:
        why = followed.report.get("error") or f"it ended with exit code {process.returncode}"
    tail = (spool / ERRORS_NAME).read_bytes()[-_QUOTED_ERRORS:].decode(errors="replace").strip()
    quoted = f" (its stderr ends: {tail})" if tail else ""
    if not followed.started:
        msg = f"the snapshot encoder process did not start: {why}{quoted}"
        raise EncoderNotStarted(msg, retriable=True)
    msg = f"the snapshot encoder process failed: {why}{quoted}"
    raise StorageError(msg, retriable=True)


def encoder_command(request: Path) -> list[str]:
    """The command line of an encoder process for the request file ``request``."""
    return [sys.executable, "-m", ENCODER_MODULE, str(request)]


@dataclass
class _Followed:
    """What following an encoder process found: its last report, whether it stalled, whether it started.

    Stalled: silent for :data:`~.child_output.STALL_SECONDS`. Started: it sent a message
    (its first is sent before it reads the request).
    """

    report: dict[str, Any] = field(default_factory=dict)
    stalled: bool = False
    started: bool = False


def _followed(process: subprocess.Popen[bytes]) -> _Followed:
    """Read the encoder's messages until its stdout ends or it stalls."""
    assert process.stdout is not None
    messages = msgpack.Unpacker(raw=False, strict_map_key=False)
    found = _Followed()
    try:
        for chunk in child_output.chunks(process.stdout.fileno()):
            messages.feed(chunk)
            for message in messages:
                if isinstance(message, dict):  # not text printed to its stdout (ASCII reads as ints)
                    found.started = True
                    if "sections" not in message:
                        found.report = message
    except child_output.Stalled:
        found.stalled = True
    except (ValueError, msgpack.UnpackException):  # e.g. something printed to its stdout
        found.report = {"error": "its messages did not decode (something else wrote to its stdout)"}
    return found
