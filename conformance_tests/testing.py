"""Helpers for conformance tests; storage providers may use them in their own tests."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dstl.spi import ChangelogHandle, KeyGroupRange, StateChangelogStorage, StateChangelogWriter

__all__ = [
    "DEFAULT_TIMEOUT",
    "change_bytes",
    "failing_os_sync",
    "persist",
    "read_changes",
    "read_data",
    "restricted_handle",
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
