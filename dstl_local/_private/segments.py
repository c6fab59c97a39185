"""Segment files: append-only, one writer instance each, checksummed change sets.

A segment is a sequence of change sets in the shared checksummed format
(:mod:`dstl.spi.kit.changeset_format`). Each storage instance appends only to its
own segments (``seg-<instance>-<n>.log``), so processes never interleave writes.
A segment is *sealed* (``.sealed`` marker holding its valid length) once it will
never grow again: when its instance rolls or closes it, when a write or sync to it
failed, or when recovery finds its instance dead.

A failed write or sync *retires* the segment (PostgreSQL's fsync lesson): after a
failed ``fdatasync`` the kernel may have dropped the dirty pages and will not
report the error again, so the file is never written or synced again. Its
partial bytes are cut when possible, and the marker records the length that was
durable before the failure, so nothing after it is ever counted or read.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dstl.spi import CorruptedError, StorageError
from dstl.spi.kit.changeset_format import CHANGE_SET_HEADER_SIZE, decode_change_set, framed_size
from dstl.spi.kit.durability import fsync_directory

SEGMENT_SUFFIX = ".log"
SEALED_SUFFIX = ".sealed"
QUARANTINED_SUFFIX = ".quarantined"

log = logging.getLogger(__name__)


def segment_name(instance: str, number: int) -> str:
    """File name of segment ``number`` of ``instance``."""
    return f"seg-{instance}-{number:08d}{SEGMENT_SUFFIX}"


def instance_of(segment: str) -> str:
    """The instance id in a segment file name."""
    return segment.split("-")[1]


class ActiveSegment:
    """The segment an instance currently appends to.

    :ivar size: bytes that were written (and synced, with ``fsync``) successfully:
        the offset of the next change set.
    :ivar failure: the error that retired the segment, if a write or sync failed.
    """

    def __init__(self, directory: Path, instance: str, number: int, *, fsync: bool) -> None:
        self.name = segment_name(instance, number)
        self.path = directory / self.name
        self.number = number
        self._fsync = fsync
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.size = 0
        self.failure: OSError | None = None
        if fsync:
            try:
                fsync_directory(directory)  # the new file's directory entry must be durable too
            except OSError:
                os.close(self.fd)
                self.path.unlink(missing_ok=True)
                raise

    def append(self, blobs: list[bytes]) -> int:
        """Write ``blobs`` back to back, fsync once; returns the offset of the first.

        :raises OSError: when the write or the sync failed; the segment is then
            retired (:attr:`failure` is set) and must be sealed, never appended to again.
        """
        if self.failure is not None:
            msg = f"segment {self.name} was retired after a failed write: {self.failure}"
            raise OSError(msg)
        offset = self.size
        data = b"".join(blobs)
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                if written == 0:
                    raise OSError(errno.EIO, "write returned 0 bytes")
                view = view[written:]
            if self._fsync:
                os.fdatasync(self.fd)
        except OSError as exc:
            self.failure = exc
            self._cut_failed_bytes()
            raise
        self.size += len(data)
        return offset

    def _cut_failed_bytes(self) -> None:
        """Best effort: drop what a failed write left after the last good byte."""
        try:
            os.ftruncate(self.fd, self.size)
        except OSError as exc:  # the marker's length still fences them off
            log.warning("could not cut the failed write off %s: %s", self.path, exc)

    def seal(self) -> None:
        """Close the file and mark it sealed with its valid length.

        No sync here: every append was ``fdatasync``ed (which makes the length
        durable too), and a retired segment must not be synced again (a second
        sync can report success for pages the failed one lost).
        """
        os.close(self.fd)
        write_sealed_marker(self.path, self.size)


def write_sealed_marker(path: Path, size: int) -> None:
    """Mark ``path`` sealed; the marker holds the segment's valid length."""
    marker = path.with_name(path.name + SEALED_SUFFIX)
    try:
        marker.write_text(f"{size}\n", encoding="ascii")
    except OSError:
        # A full disk may refuse the length but still take an empty marker; the
        # segment then counts at its file size (a failed segment was cut to size).
        marker.touch()


def sealed_size(path: Path) -> int | None:
    """The valid length of a sealed segment, ``None`` when it is not sealed.

    Markers without a length (older ones, or written on a full disk) count the file size.
    """
    marker = path.with_name(path.name + SEALED_SUFFIX)
    try:
        text = marker.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    if text.isdigit():
        return int(text)
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class InstanceLock:
    """An ``flock`` held for the life of a storage instance (liveness for recovery)."""

    def __init__(self, directory: Path, instance: str) -> None:
        self.path = directory / f"instance-{instance}.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        """Release the lock and remove the file."""
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


def instance_alive(directory: Path, instance: str) -> bool:
    """Whether the instance still holds its lock (a dead one cannot)."""
    path = directory / f"instance-{instance}.lock"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass(frozen=True)
class SegmentRecovery:
    """What recovery found at the end of a dead instance's segment.

    :ivar cut: bytes of an incomplete last change set that were cut off.
    :ivar damage: damage that was kept (quarantined) because it may hold
        acknowledged data: a complete change set failing its checksum, or damage
        followed by valid change sets.
    """

    cut: int = 0
    damage: CorruptedError | None = None


def recover_segment(path: Path, discarded: Callable[[], dict[int, int]] = dict) -> SegmentRecovery:
    """Cut a torn tail off a dead instance's segment; report damage it must keep.

    Acknowledged change sets were synced, so an *incomplete* last change set (the
    file ends inside it, or the rest is zeros) is an unacknowledged torn write and
    is cut. Anything else that fails to decode may be acknowledged data that was
    damaged later; it is kept so that a handle needing it gets a
    :class:`CorruptedError` naming file and offset, and the segment is quarantined
    instead of stopping the whole job.

    :param discarded: returns ``offset -> length`` of the change sets recorded as
        discarded; they are skipped, not decoded (their blocks may be holes now).
        It is called after the data was read: a range is recorded before it is punched.
    """
    data = path.read_bytes()
    skip = discarded()
    offset = 0
    while offset < len(data):
        if offset in skip and offset + skip[offset] <= len(data):
            offset += skip[offset]
            continue
        try:
            offset += decode_change_set(data, offset, location=str(path)).stored_size
        except CorruptedError as exc:
            if _valid_change_set_after(data, offset) or not _incomplete(data, offset):
                return SegmentRecovery(damage=exc)
            with open(path, "r+b") as file:
                file.truncate(offset)
                os.fsync(file.fileno())
            return SegmentRecovery(cut=len(data) - offset)
    return SegmentRecovery()


def _incomplete(data: bytes, offset: int) -> bool:
    """Whether the change set at ``offset`` is cut short (a torn write), not damaged."""
    tail = memoryview(data)[offset:]
    if len(tail) < CHANGE_SET_HEADER_SIZE or not any(tail):
        return True
    try:
        return offset + framed_size(tail[:CHANGE_SET_HEADER_SIZE], location="probe") > len(data)
    except CorruptedError:
        return False


def _valid_change_set_after(data: bytes, offset: int) -> bool:
    """Whether any valid change set starts after ``offset`` (damage in the middle)."""
    position = data.find(b"DSTC", offset + 1)
    while position != -1 and position + CHANGE_SET_HEADER_SIZE <= len(data):
        try:
            decode_change_set(data, position, location="probe")
        except CorruptedError:
            position = data.find(b"DSTC", position + 1)
            continue
        return True
    return False


def read_change_set_bytes(path: Path, offset: int, length: int) -> bytes:
    """Read exactly ``length`` bytes at ``offset`` of a segment."""
    try:
        # Non-blocking and no links: a FIFO or a link planted under the job's name must not hang or
        # redirect the read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        msg = f"segment {path} does not exist (was it discarded?)"
        raise StorageError(msg) from exc
    except OSError as exc:
        msg = f"segment {path} cannot be opened: {exc} (a link or something else than a file)"
        raise CorruptedError(msg, location=str(path), offset=offset) from exc
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            msg = "not a regular file"
            raise CorruptedError(msg, location=str(path), offset=offset)
        available = status.st_size - offset
        if available < length:
            msg = f"segment ends after {max(available, 0)} of {length} bytes"
            raise CorruptedError(msg, location=str(path), offset=offset)
        data = os.pread(fd, length, offset)
        if _has_hole(fd, offset, length):
            # Segments are written sequentially: a hole is a discarded change set's freed blocks.
            msg = f"the change set at {path} offset {offset} was discarded: its disk blocks were freed"
            raise StorageError(msg)
    finally:
        os.close(fd)
    if len(data) != length:
        msg = f"segment ends after {len(data)} of {length} bytes"
        raise CorruptedError(msg, location=str(path), offset=offset)
    return data


def _has_hole(fd: int, offset: int, length: int) -> bool:
    """Whether ``[offset, offset + length)`` of the file has a hole (where the OS can tell)."""
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_hole is None:
        return False
    try:
        return os.lseek(fd, offset, seek_hole) < offset + length
    except OSError:  # not supported here: the file system reports no holes
        return False
