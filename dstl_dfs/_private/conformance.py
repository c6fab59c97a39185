"""Conformance support of the ``filesystem`` storage: environment and backdoor."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from dstl.conformance import ConformanceBackdoor
from dstl.conformance.testing import failing_os_sync, place_forgery, unsynced_writes_lost
from dstl.spi import ChangelogHandle, Config, StateChangelogStorage, StorageError
from dstl.spi.handle import LocationValue

from ..options import BASE_PATH
from .object_store import FsspecStore, S3Store
from .storage import DfsStorage

#: ``file`` (default) or ``s3`` (moto's server on loopback). memory:// is not offered:
#: fsspec's memory filesystem lives in one process, so the process-level
#: capabilities (SIGKILL durability, cross-process fencing) cannot hold there.
BACKEND_ENV = "DSTL_DFS_CONFORMANCE_BACKEND"


@contextlib.contextmanager
def dfs_environment(workdir: Path) -> Iterator[dict[str, str]]:
    """A base path for the run, on the backend ``DSTL_DFS_CONFORMANCE_BACKEND`` names."""
    backend = os.environ.get(BACKEND_ENV, "file")
    if backend == "s3":
        from dstl.dfs.testing import moto_s3_server

        with moto_s3_server() as endpoint:
            yield endpoint.config(prefix=workdir.name)
    elif backend == "file":
        yield {"dstl.dfs.base-path": (workdir / "dfs").as_uri()}
    else:
        msg = f"{BACKEND_ENV}={backend!r}: use file or s3"
        raise ValueError(msg)


class DfsBackdoor(ConformanceBackdoor):
    """Raw object access that bypasses the storage (no conditional puts, no cache)."""

    def list_objects(self, storage: StateChangelogStorage) -> list[str]:
        """Data objects of the job."""
        assert isinstance(storage, DfsStorage)
        return storage.list_objects()

    def corrupt(self, storage: StateChangelogStorage, handle: ChangelogHandle) -> None:
        """Overwrite the object with the last byte of the first change set flipped."""
        assert isinstance(storage, DfsStorage)
        first = min(handle.location_dicts, key=lambda loc: loc["sqn"])  # type: ignore[arg-type,return-value]
        key = str(first["object"])
        data = bytearray(storage.store.get(key))
        data[int(first["offset"]) + int(first["length"]) - 1] ^= 0x5A  # type: ignore[arg-type]
        _put_raw(storage, key, bytes(data))

    def forge(
        self, storage: StateChangelogStorage, handle: ChangelogHandle, data: bytes
    ) -> tuple[ChangelogHandle, int]:
        """A new data object of the job holding padding, then ``data``."""
        assert isinstance(storage, DfsStorage)
        key = f"{storage.job_id}/data/forged-{uuid.uuid4().hex}"

        def store(blob: bytes) -> dict[str, LocationValue]:
            _put_raw(storage, key, blob)
            return {"object": key}

        return place_forgery(handle, data, store)

    def unreachable_config(self, config: Mapping[str, str]) -> tuple[dict[str, str], float]:
        """A base path that cannot be written (file) or an endpoint nobody listens on (s3)."""
        fast = {"dstl.dfs.upload.timeout": "500ms", "dstl.dfs.upload.next-attempt-delay": "50ms"}
        if str(Config.of(config).get(BASE_PATH) or "").startswith("s3://"):
            from dstl.dfs.testing import free_port

            return {**fast, "dstl.dfs.s3.endpoint-url": f"http://127.0.0.1:{free_port()}"}, 0.5 * 3 + 3.0
        return {**fast, "dstl.dfs.base-path": "file:///dev/null/dstl-unreachable"}, 0.5 * 3 + 3.0

    def failing_sync(self, storage: StateChangelogStorage) -> AbstractContextManager[list[int]]:
        """On ``file://`` the next ``fsync`` fails once with ``EIO``; on S3 the next upload gets a 5xx."""
        assert isinstance(storage, DfsStorage)
        if isinstance(storage.store, S3Store):
            return _failing_upload(storage.store)
        return failing_os_sync()

    def power_loss(self) -> AbstractContextManager[Callable[[], None]]:
        """On ``file://`` a layer that loses unsynced data; S3 acknowledges a put once it is stored."""
        if os.environ.get(BACKEND_ENV, "file") == "s3":
            return contextlib.nullcontext(lambda: None)  # the client host's power holds nothing of S3's
        return unsynced_writes_lost()

    def list_metadata(self, storage: StateChangelogStorage) -> list[str]:
        """Epoch markers of the job."""
        assert isinstance(storage, DfsStorage)
        return storage.markers.list(f"{storage.job_id}/epochs/")


def _put_raw(storage: DfsStorage, key: str, data: bytes) -> None:
    """Write object ``key`` past the storage (no conditional put, no cache)."""
    store = storage.store
    if isinstance(store, S3Store):
        store.client.put_object(Bucket=store.bucket, Key=store.key_of(key), Body=data)
    elif isinstance(store, FsspecStore):
        store.fs.pipe_file(store.path_of(key), data)
    storage.cache.invalidate(key)


@contextlib.contextmanager
def _failing_upload(store: S3Store) -> Iterator[list[int]]:
    fired: list[int] = []
    real = store.put_new

    def put_new(key: str, data: bytes) -> None:
        if not fired:
            fired.append(1)
            msg = f"writing {store.describe(key)} failed: injected 503 SlowDown (conformance suite)"
            raise StorageError(msg, retriable=True)
        real(key, data)

    store.put_new = put_new  # type: ignore[method-assign]
    try:
        yield fired
    finally:
        store.put_new = real  # type: ignore[method-assign]
