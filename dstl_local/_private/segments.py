"""Segment files: append-only, one writer instance each, checksummed change sets.

A segment is a sequence of change sets in the shared checksummed format
(:mod:`dstl.spi.changeset_format`). Each storage instance appends only to its
own segments (``seg-<instance>-<n>.log``), so processes never interleave writes.
A segment is *sealed* (``.sealed`` marker) once it will never grow again: when
its instance rolls or closes it, or when recovery finds its instance dead.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dstl.spi import CorruptedError, StorageError
from dstl.spi.changeset_format import CHANGE_SET_HEADER_SIZE, decode_change_set

SEGMENT_SUFFIX = ".log"
SEALED_SUFFIX = ".sealed"


def segment_name(instance: str, number: int) -> str:
    """File name of segment ``number`` of ``instance``."""
    return f"seg-{instance}-{number:08d}{SEGMENT_SUFFIX}"


def instance_of(segment: str) -> str:
    """The instance id in a segment file name."""
    return segment.split("-")[1]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ActiveSegment:
    """The segment an instance currently appends to."""

    def __init__(self, directory: Path, instance: str, number: int, *, fsync: bool) -> None:
        self.name = segment_name(instance, number)
        self.path = directory / self.name
        self.number = number
        self._fsync = fsync
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.size = 0
        if fsync:
            _fsync_dir(directory)  # the new file's directory entry must be durable too

    def append(self, blobs: list[bytes]) -> int:
        """Write ``blobs`` back to back, fsync once; returns the offset of the first."""
        offset = self.size
        data = b"".join(blobs)
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        if self._fsync:
            os.fdatasync(self.fd)
        self.size += len(data)
        return offset

    def seal(self) -> None:
        """Close the file and mark it sealed."""
        if self._fsync:
            os.fsync(self.fd)
        os.close(self.fd)
        self.path.with_name(self.name + SEALED_SUFFIX).touch()


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


def recover_segment(path: Path) -> int:
    """Cut a torn tail off a dead instance's segment; returns the bytes cut.

    Change sets that were acknowledged were fsynced, so a damaged *last* change
    set can only be an unacknowledged torn write and is cut. Damage followed by
    valid data is corruption and raises :class:`CorruptedError`.
    """
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        try:
            offset += decode_change_set(data, offset, location=str(path)).stored_size
        except CorruptedError:
            if _valid_change_set_after(data, offset):
                raise
            with open(path, "r+b") as file:
                file.truncate(offset)
                os.fsync(file.fileno())
            return len(data) - offset
    return 0


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
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        msg = f"segment {path} does not exist (was it discarded?)"
        raise StorageError(msg) from exc
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        msg = f"segment ends after {len(data)} of {length} bytes"
        raise CorruptedError(msg, location=str(path), offset=offset)
    return data
