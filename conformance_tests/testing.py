"""Helpers for conformance tests; storage providers may use them in their own tests."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dstl.spi import ChangelogHandle, KeyGroupRange, StateChangelogStorage, StateChangelogWriter
from dstl.spi.handle import LocationValue

__all__ = [
    "DEFAULT_TIMEOUT",
    "change_bytes",
    "PowerCut",
    "failing_os_sync",
    "persist",
    "place_forgery",
    "read_changes",
    "read_data",
    "restricted_handle",
    "unsynced_writes_lost",
]

#: Seconds a persist may take in the suite before the test fails (no hang).
DEFAULT_TIMEOUT = 60.0


def persist(
    writer: StateChangelogWriter, start_sqn: int, checkpoint_id: int, timeout: float = DEFAULT_TIMEOUT
) -> ChangelogHandle:
    """Persist and wait for the handle."""
    return writer.persist(start_sqn, checkpoint_id).result(timeout=timeout)


def read_changes(
    storage: StateChangelogStorage, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None
) -> list[tuple[int | None, int, bytes]]:
    """``(sqn, key_group, data)`` of every change the handle yields, in order."""
    reader = storage.create_reader()
    try:
        return [(c.sqn, c.key_group, c.data) for c in reader.read(handle, key_groups)]
    finally:
        reader.close()


def read_data(
    storage: StateChangelogStorage, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None
) -> list[bytes]:
    """Only the data of :func:`read_changes`."""
    return [data for _, _, data in read_changes(storage, handle, key_groups)]


def assert_explained(error: BaseException) -> None:
    """Fail unless ``error`` carries a message of its own: a clear error names the problem."""
    message = error.args[0] if error.args else None
    assert isinstance(message, str) and message.strip(), f"{type(error).__name__} says nothing: {error!r}"


def restricted_handle(handle: ChangelogHandle, locations: list[dict]) -> ChangelogHandle:
    """``handle`` narrowed to ``locations`` (what a shared-state registry discards)."""
    return ChangelogHandle.create(
        storage_id=handle.storage_id,
        log_id=handle.log_id,
        key_groups=handle.key_groups,
        sqn_range=handle.sqn_range,
        epoch=handle.epoch,
        locations=locations,
    )


def place_forgery(
    handle: ChangelogHandle, data: bytes, store: Callable[[bytes], dict[str, LocationValue]]
) -> tuple[ChangelogHandle, int]:
    """What a backdoor's ``forge()`` returns, once ``store`` has written padding and ``data``.

    :param store: writes the bytes it is given (:data:`FORGERY_PADDING`, then ``data``)
        into a new object, file or record and returns the location fields that name
        it (``{"object": key}``); the offset and length are added here.
    :returns: ``handle`` with that one location, and where ``data`` starts in it.
    """
    from .backdoor import FORGERY_PADDING

    (original,) = handle.location_dicts
    where = store(FORGERY_PADDING + data)
    offset = len(FORGERY_PADDING)
    location = {**where, "offset": offset, "length": len(data), "sqn": original["sqn"]}
    return restricted_handle(handle, [location]), offset


def change_bytes(tag: str, index: int, size: int = 0) -> bytes:
    """Recognisable change data: ``tag:index`` padded to ``size`` bytes."""
    head = f"{tag}:{index}".encode()
    return head + b"." * max(0, size - len(head))


@contextmanager
def failing_os_sync() -> Iterator[list[int]]:
    """Make the process's next ``os.fdatasync`` or ``os.fsync`` fail once with ``EIO``.

    For storages whose durability is a sync of a file (a backdoor's
    ``failing_sync``); yields a list that receives a 1 when the fault fired.
    """
    fired: list[int] = []
    lock = threading.Lock()
    real = {name: getattr(os, name) for name in ("fdatasync", "fsync")}

    def failing(name: str):  # noqa: ANN202 - a replacement for os.fdatasync / os.fsync
        def sync(fd: int) -> None:
            with lock:
                fire = not fired
                if fire:
                    fired.append(1)
            if fire:
                for layer in list(_POWER_LAYERS):  # as the kernel does: the dirty pages are gone
                    layer.sync_failed(fd)
                raise OSError(errno.EIO, "injected EIO (conformance suite)")
            real[name](fd)

        return sync

    for name in real:
        setattr(os, name, failing(name))
    try:
        yield fired
    finally:
        for name, function in real.items():
            setattr(os, name, function)


@dataclass
class _File:
    created: bool  # by this process, inside the context
    entry_durable: bool  # its directory was synced after it was created
    synced_size: int | None = None  # size at the last fsync/fdatasync
    synced_head: bytes | None = None  # content then, for small files rewritten in place
    #: byte ranges written before a sync that failed: the kernel dropped those dirty pages, and
    #: no later sync brings them back (PostgreSQL's "fsyncgate")
    lost: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class PowerCut:
    """What :func:`unsynced_writes_lost` saw; calling it cuts the power.

    After the cut every tracked file holds only what was synced: appended bytes
    after the last sync are gone, small files rewritten in place go back to their
    synced content, and files whose directory entry was never synced disappear.
    """

    writes: int = 0
    syncs: int = 0
    dropped_bytes: int = 0
    removed_files: list[str] = field(default_factory=list)
    files: dict[str, _File] = field(default_factory=dict)
    cut: bool = False

    #: told of a sync that failed on a descriptor (set by :func:`unsynced_writes_lost`)
    sync_failed: Callable[[int], None] = field(default=lambda fd: None, repr=False)

    def __call__(self) -> None:
        """Drop everything written but not synced (once)."""
        if self.cut:
            return
        self.cut = True
        for path, tracked in self.files.items():
            if not os.path.exists(path):
                continue
            if tracked.created and not tracked.entry_durable:
                self.dropped_bytes += os.path.getsize(path)
                os.unlink(path)
                self.removed_files.append(path)
            elif tracked.synced_head is not None:
                Path(path).write_bytes(tracked.synced_head)
            else:
                size = os.path.getsize(path)
                keep = tracked.synced_size or 0
                if size > keep:
                    self.dropped_bytes += size - keep
                    os.truncate(path, keep)
            if os.path.exists(path):
                self._lose_failed_pages(path, tracked)

    def _lose_failed_pages(self, path: str, tracked: _File) -> None:
        """Zero what was written before a failed sync and is still in the file: it never reached the disk."""
        size = os.path.getsize(path)
        for start, end in tracked.lost:
            end = min(end, size)
            if start < end:
                with open(path, "r+b") as file:
                    file.seek(start)
                    file.write(bytes(end - start))
                self.dropped_bytes += end - start


#: files up to this size keep their synced content (epoch and marker files are rewritten in place)
_SMALL_FILE = 64 * 1024
#: the power-loss layers in effect: a sync failure injected elsewhere tells them its pages are gone
_POWER_LAYERS: list[PowerCut] = []


@contextmanager
def unsynced_writes_lost() -> Iterator[PowerCut]:  # noqa: C901 - one branch per system call a power cut loses
    """A filesystem layer that loses unsynced data, for storages that write with ``os`` calls.

    Tracks the process's ``os.open``/``os.write``/``os.pwrite`` and
    ``os.fsync``/``os.fdatasync`` (a synced directory makes the entries of the files
    created in it before durable) and yields a :class:`PowerCut`. Calling it
    leaves on disk only what a power loss would: what was synced. A storage that
    acknowledges a persist before its data and directory entries are synced loses
    acknowledged data. Used by a backdoor's ``power_loss``.
    """
    cut = PowerCut()
    lock = threading.Lock()
    paths: dict[int, str] = {}
    real = {name: getattr(os, name) for name in ("open", "write", "pwrite", "fsync", "fdatasync", "close")}

    def tracked_open(path, flags, mode=0o777, *, dir_fd=None):  # noqa: ANN001, ANN202
        existed = os.path.exists(path)
        fd = real["open"](path, flags, mode, dir_fd=dir_fd)
        full = os.path.abspath(path)
        with lock:
            paths[fd] = full
            if not cut.cut and full not in cut.files and not os.path.isdir(full):
                cut.files[full] = _File(created=not existed, entry_durable=existed)
                if existed:
                    _mark_synced(full)
        return fd

    def _mark_synced(full: str) -> None:
        tracked = cut.files[full]
        tracked.synced_size = os.path.getsize(full)
        tracked.synced_head = Path(full).read_bytes() if tracked.synced_size <= _SMALL_FILE else None

    def tracked_write(name: str):  # noqa: ANN202
        def write(fd, *args):  # noqa: ANN001, ANN002, ANN202
            written = real[name](fd, *args)
            with lock:
                cut.writes += 1
            return written

        return write

    def tracked_sync(name: str):  # noqa: ANN202
        def sync(fd):  # noqa: ANN001, ANN202
            real[name](fd)
            with lock:
                cut.syncs += 1
                full = paths.get(fd)
                if full is None or cut.cut:
                    return
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    for path, tracked in cut.files.items():
                        if os.path.dirname(path) == full:
                            tracked.entry_durable = True
                elif full in cut.files:
                    _mark_synced(full)

        return sync

    def tracked_close(fd):  # noqa: ANN001, ANN202
        with lock:
            paths.pop(fd, None)
        real["close"](fd)

    def sync_failed(fd: int) -> None:
        with lock:
            full = paths.get(fd)
            tracked = cut.files.get(full) if full is not None else None
            if tracked is None or cut.cut or stat.S_ISDIR(os.fstat(fd).st_mode):
                return
            tracked.lost.append((tracked.synced_size or 0, os.fstat(fd).st_size))

    cut.sync_failed = sync_failed

    replacements = {
        "open": tracked_open,
        "write": tracked_write("write"),
        "pwrite": tracked_write("pwrite"),
        "fsync": tracked_sync("fsync"),
        "fdatasync": tracked_sync("fdatasync"),
        "close": tracked_close,
    }
    for name, function in replacements.items():
        setattr(os, name, function)
    _POWER_LAYERS.append(cut)
    try:
        yield cut
    finally:
        _POWER_LAYERS.remove(cut)
        for name, function in real.items():
            setattr(os, name, function)
