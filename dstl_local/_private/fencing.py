"""Epoch files: which writer owns a log, decided under an advisory lock.

The owner check fails closed: a writer keeps persisting only while the epoch file
it took over is still the same file (same inode) and still names it. A file that
was deleted, replaced (e.g. by rename) or holds garbage fences the writer instead
of letting two writers own one log.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from dstl.spi import ClosedError, FencedError, StorageError


class EpochFile:
    """``epochs/<log>.epoch`` holding ``"<epoch> <token>"`` of the owning writer.

    Taking over and checking both hold ``flock`` on the file, so a takeover and a
    check never interleave, across processes too.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def take_over(self, epoch: int, token: str) -> None:
        """Become the owner unless a higher epoch owns the log.

        :raises FencedError: when a higher epoch owns the log.
        :raises StorageError: when the file holds something other than an owner record.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 256, 0)
            current = _parse(raw)
            if current is None and raw.strip():
                msg = (
                    f"epoch file {self.path} is damaged ({raw[:40]!r}): it decides which writer owns log "
                    f"{self.path.stem!r}, so no writer is created. Stop every writer of that log, then "
                    "delete the file"
                )
                raise StorageError(msg)
            if current is not None and current[0] > epoch:
                msg = f"log {self.path.stem!r} already has a writer with epoch {current[0]} > {epoch}"
                raise FencedError(msg)
            data = f"{epoch} {token}\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)  # closing releases the lock

    def owner(self) -> tuple[int, str] | None:
        """The current ``(epoch, token)``, read under a shared lock."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return _read_locked(fd)
        finally:
            os.close(fd)


class OwnerCheck:
    """Re-reads one epoch file through a descriptor kept open (a check costs a stat and a pread).

    A takeover rewrites the file in place, so the open descriptor sees it. A file
    that is no longer the one at the path (deleted or replaced) reads as no owner.
    """

    def __init__(self, epoch_file: EpochFile) -> None:
        self._path = epoch_file.path
        self._fd: int | None = os.open(self._path, os.O_RDONLY)
        stat = os.fstat(self._fd)
        self._identity = (stat.st_dev, stat.st_ino)
        self._lock = threading.Lock()

    def owner(self) -> tuple[int, str] | None:
        """The current ``(epoch, token)``; ``None`` when the file changed identity or is unreadable."""
        with self._lock:
            if self._fd is None:
                msg = f"the writer of {self._path.stem!r} was closed while its persist waited"
                raise ClosedError(msg)
            try:
                stat = os.stat(self._path)
            except FileNotFoundError:
                return None
            if (stat.st_dev, stat.st_ino) != self._identity:
                return None
            return _read_locked(self._fd)

    def close(self) -> None:
        """Close the descriptor; idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _read_locked(fd: int) -> tuple[int, str] | None:
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        return _parse(os.pread(fd, 256, 0))
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _parse(raw: bytes) -> tuple[int, str] | None:
    parts = raw.decode(errors="replace").split()
    if len(parts) != 2 or not parts[0].isascii() or not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1]
