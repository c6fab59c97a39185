"""Conformance support of the local storage: a directory per run and a backdoor."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from dstl.conformance import ConformanceBackdoor
from dstl.conformance.testing import failing_os_sync, place_forgery, unsynced_writes_lost
from dstl.spi import ChangelogHandle, StateChangelogStorage
from dstl.spi.handle import LocationValue

from .storage import LocalStorage


@contextlib.contextmanager
def local_environment(workdir: Path) -> Iterator[dict[str, str]]:
    """A directory of its own for the run."""
    # the smallest segments the storage allows: the suite's volume tests then cross many of them
    yield {"dstl.local.dir": str(workdir / "local"), "dstl.local.segment-size": "4096"}


class LocalBackdoor(ConformanceBackdoor):
    """Lists and damages segment files directly."""

    def list_objects(self, storage: StateChangelogStorage) -> list[str]:
        """Segment files of the storage's job."""
        assert isinstance(storage, LocalStorage)
        return storage.list_objects()

    def corrupt(self, storage: StateChangelogStorage, handle: ChangelogHandle) -> None:
        """Flip the last byte of the handle's first change set in its segment."""
        assert isinstance(storage, LocalStorage)
        first = min(handle.location_dicts, key=lambda loc: loc["sqn"])  # type: ignore[arg-type,return-value]
        path = storage.base / str(first["segment"])
        position = int(first["offset"]) + int(first["length"]) - 1  # type: ignore[arg-type]
        with open(path, "r+b") as file:
            file.seek(position)
            byte = file.read(1)
            file.seek(position)
            file.write(bytes([byte[0] ^ 0x5A]))

    def forge(
        self, storage: StateChangelogStorage, handle: ChangelogHandle, data: bytes
    ) -> tuple[ChangelogHandle, int]:
        """A new segment file of the job holding padding, then ``data``."""
        assert isinstance(storage, LocalStorage)
        name = f"seg-forged-{uuid.uuid4().hex[:12]}.log"

        def store(blob: bytes) -> dict[str, LocationValue]:
            (storage.segments_dir / name).write_bytes(blob)
            return {"segment": f"{storage.job_id}/segments/{name}"}

        return place_forgery(handle, data, store)

    def unreachable_config(self, config: Mapping[str, str]) -> tuple[dict[str, str], float]:
        """A directory below a regular file cannot be created."""
        return {"dstl.local.dir": "/dev/null/dstl-unreachable"}, 5.0

    def failing_sync(self, storage: StateChangelogStorage) -> AbstractContextManager[list[int]]:
        """The next ``fsync``/``fdatasync`` of the process fails once with ``EIO``."""
        return failing_os_sync()

    def power_loss(self) -> AbstractContextManager[Callable[[], None]]:
        """Segments and epoch files are written with ``os`` calls: a layer that loses unsynced data."""
        return unsynced_writes_lost()

    def list_metadata(self, storage: StateChangelogStorage) -> list[str]:
        """Epoch files, discard records and lock files of the job."""
        assert isinstance(storage, LocalStorage)
        files = [p for p in storage.job_dir.rglob("*") if p.is_file()]
        return sorted(str(p.relative_to(storage.job_dir)) for p in files if not p.name.endswith(".log"))
