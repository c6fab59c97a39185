"""Conformance support of the memory storage: a private namespace and a backdoor."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from dstl.conformance import ConformanceBackdoor
from dstl.conformance.testing import place_forgery

from ...handle import ChangelogHandle, LocationValue
from ...storage import StateChangelogStorage
from .storage import MemoryStorage


@contextlib.contextmanager
def memory_environment(workdir: Path) -> Iterator[dict[str, str]]:
    """A namespace of its own for the run; writers upload ahead past 16 KiB, as slow storages do."""
    yield {
        "dstl.memory.namespace": f"conformance-{uuid.uuid4().hex}",
        "dstl.memory.preemptive-persist-threshold": "16kb",
        "dstl.memory.upload-delay": "1ms",
    }


class MemoryBackdoor(ConformanceBackdoor):
    """Reads and damages the namespace's objects directly."""

    def list_objects(self, storage: StateChangelogStorage) -> list[str]:
        """Objects of the storage's job."""
        assert isinstance(storage, MemoryStorage)
        return storage.list_objects()

    def corrupt(self, storage: StateChangelogStorage, handle: ChangelogHandle) -> None:
        """Flip the last byte of the handle's first change set."""
        assert isinstance(storage, MemoryStorage)
        first = min(handle.location_dicts, key=lambda loc: loc["sqn"])  # type: ignore[arg-type,return-value]
        blob = storage.namespace.objects[str(first["object"])]
        blob[int(first["offset"]) + int(first["length"]) - 1] ^= 0x5A  # type: ignore[arg-type]

    def forge(
        self, storage: StateChangelogStorage, handle: ChangelogHandle, data: bytes
    ) -> tuple[ChangelogHandle, int]:
        """A new object of the log holding padding, then ``data``."""
        assert isinstance(storage, MemoryStorage)
        name = f"{storage.job_id}/{handle.log_id}/forged-{uuid.uuid4().hex}"

        def store(blob: bytes) -> dict[str, LocationValue]:
            storage.namespace.objects[name] = bytearray(blob)
            return {"object": name}

        return place_forgery(handle, data, store)
