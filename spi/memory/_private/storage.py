"""Implementation of the memory storage."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...config import Config
from ...errors import FencedError, InvalidHandleError, StorageError
from ...handle import ChangelogHandle, Location, LocationValue
from ...kit.changeset_format import CHANGE_SET_HEADER_SIZE, change_set_identity
from ...kit.changeset_reader import (
    OFFSET_LENGTH_FIELDS,
    ChangeSetReader,
    FetchedChangeSet,
    LocationField,
    checked_locations,
)
from ...kit.changeset_storage import ChangeSetStorage, storage_settings
from ...kit.changeset_writer import ChangeSet, ChangeSetWriter
from ...names import MAX_NAME_LENGTH
from ...storage import StateChangelogStorage
from ...types import KeyGroupRange
from ..options import NAMESPACE, PREEMPTIVE_PERSIST_THRESHOLD, UPLOAD_DELAY

IDENTIFIER = "memory"


@dataclass
class _Namespace:
    """Objects and log ownership shared by the storage instances of one namespace."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    objects: dict[str, bytearray] = field(default_factory=dict)
    # object -> offsets of its change sets not yet discarded
    live: dict[str, set[int]] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)  # time.monotonic() when stored
    # (job, log) -> (epoch, owner token) of the newest writer.
    owners: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    tokens: itertools.count = field(default_factory=itertools.count)
    # job -> the owner (checkpoint location) it was bound to first
    job_owners: dict[str, str] = field(default_factory=dict)


_NAMESPACES: dict[str, _Namespace] = {}
_NAMESPACES_LOCK = threading.Lock()


def _namespace(name: str) -> _Namespace:
    with _NAMESPACES_LOCK:
        return _NAMESPACES.setdefault(name, _Namespace())


@contextmanager
def private_storage(job_id: str, purpose: str) -> Iterator[StateChangelogStorage]:
    """A memory storage in a namespace of its own, forgotten on exit: a scratch log no one else reads.

    For a backend that only restores (its writer must not touch the job's logs); without
    the forgetting, each use would leave its namespace in the process for good.
    """
    from ...plugins import load_storage  # the plugin registry imports this package

    name = f"{purpose}-{uuid.uuid4().hex}"
    try:
        with load_storage({"dstl.storage": IDENTIFIER, NAMESPACE.name: name}, job_id=job_id) as storage:
            yield storage
    finally:
        with _NAMESPACES_LOCK:
            _NAMESPACES.pop(name, None)


def namespace_objects(name: str) -> dict[str, bytearray]:
    """The live objects of namespace ``name`` (a backdoor for tests: mutate with care)."""
    return _namespace(name).objects


class _DelayedUploads:
    """Runs each upload ``delay`` seconds after it was handed over, on worker threads."""

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dstl-memory-upload")

    def submit(self, store: Callable[..., None], *args: object) -> None:
        """Run ``store(*args)`` once the delay has passed."""
        due = time.monotonic() + self._delay

        def run() -> None:
            time.sleep(max(0.0, due - time.monotonic()))
            store(*args)  # settles its upload's future, failures included (see MemoryWriter._store)

        self._pool.submit(run)

    def shutdown(self) -> None:
        """Wait for the uploads handed over so far."""
        self._pool.shutdown(wait=True)


class MemoryWriter(ChangeSetWriter):
    """Writer whose uploads become objects in the namespace."""

    _storage: MemoryStorage

    def _upload(self, change_sets: Sequence[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        future: Future[list[Location]] = Future()
        blobs = [self._encoded(cs) for cs in change_sets]
        sqns = [cs.sqn for cs in change_sets]
        uploads = self._storage.delayed_uploads
        if uploads is None:
            self._store(sqns, blobs, future)
        else:
            uploads.submit(self._store, sqns, blobs, future)
        return future

    def _store(self, sqns: list[int], blobs: list[bytes], future: Future[list[Location]]) -> None:
        """Write the upload's object if this writer still owns the log, then settle ``future``.

        On a worker thread nothing would see an exception: it fails the future instead,
        so the persist waiting for it fails rather than waits.
        """
        try:
            self._write_object(sqns, blobs, future)
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)

    def _write_object(self, sqns: list[int], blobs: list[bytes], future: Future[list[Location]]) -> None:
        storage = self._storage
        ns = storage.namespace
        with ns.lock:
            owner = ns.owners.get((storage.job_id, self.log_id))
            if owner != (self.epoch, self._token):
                storage.metrics.inc("upload_failures")
                future.set_exception(
                    FencedError.by_owner(self.log_id, self.epoch, owner[0] if owner else None)
                )
                return
            name = f"{storage.job_id}/{self.log_id}/{next(ns.tokens):012d}"
            ns.objects[name] = bytearray(b"".join(blobs))
            ns.created[name] = time.monotonic()  # the store's own clock: no writer's wall clock
            offsets, position = set(), 0
            for blob in blobs:
                offsets.add(position)
                position += len(blob)
            ns.live[name] = offsets
        storage.metrics.inc("uploads")
        storage.metrics.inc("uploaded_bytes", sum(len(b) for b in blobs))
        locations: list[Location] = []
        offset = 0
        for sqn, blob in zip(sqns, blobs, strict=True):
            locations.append({"object": name, "offset": offset, "length": len(blob), "sqn": sqn})
            offset += len(blob)
        future.set_result(locations)


class MemoryStorageReader(ChangeSetReader):
    """Reads change sets from the namespace's objects."""

    location_fields = {"object": LocationField(str), **OFFSET_LENGTH_FIELDS}

    def __init__(self, storage: MemoryStorage) -> None:
        super().__init__(storage.identifier)
        self._storage = storage

    def _fetch(self, handle: ChangelogHandle, location: dict[str, LocationValue]) -> FetchedChangeSet:
        name = str(location["object"])
        ns = self._storage.namespace
        with ns.lock:
            blob = ns.objects.get(name)
            data = bytes(blob) if blob is not None else None
        if data is None:
            msg = f"object {name!r} of log {handle.log_id!r} does not exist (was it discarded?)"
            raise StorageError(msg)
        return FetchedChangeSet(data, int(location["offset"]), f"memory://{name}")  # type: ignore[arg-type]


class MemoryStorage(ChangeSetStorage):
    """The in-memory reference storage; thread-safe."""

    writer_class: type[MemoryWriter] = MemoryWriter
    reader_class: type[MemoryStorageReader] = MemoryStorageReader
    storage_id = IDENTIFIER

    def __init__(self, config: Config, job_id: str) -> None:
        # the reference storage compresses like the others: the suite reads both forms through it
        super().__init__(job_id, **storage_settings(config))
        threshold = config.get(PREEMPTIVE_PERSIST_THRESHOLD)
        if threshold is not None:
            self.preemptive_threshold = threshold
        self.namespace = _namespace(config.get(NAMESPACE))
        delay = config.get(UPLOAD_DELAY)
        self.delayed_uploads = _DelayedUploads(delay) if delay > 0 else None
        self._upload_delay = delay

    @property
    def longest_upload(self) -> float:
        """The configured upload delay (uploads are otherwise immediate)."""
        return self._upload_delay

    def _close_resources(self) -> None:
        """Let uploads in flight finish (their persists are waited for)."""
        if self.delayed_uploads is not None:
            self.delayed_uploads.shutdown()

    @property
    def identifier(self) -> str:
        """``memory``."""
        return self.storage_id

    def _record_owner(self, owner: str) -> str:
        with self.namespace.lock:
            return self.namespace.job_owners.setdefault(self.job_id, owner)

    def _claim_log(self, log_id: str, epoch: int) -> str:
        with self.namespace.lock:
            current = self.namespace.owners.get((self.job_id, log_id))
            if current is not None and epoch < current[0]:
                msg = f"log {log_id!r} already has a writer with epoch {current[0]} > {epoch}"
                raise FencedError(msg)
            token = f"t{next(self.namespace.tokens)}"
            self.namespace.owners[(self.job_id, log_id)] = (epoch, token)
        return token

    def _make_writer(self, log_id: str, key_groups: KeyGroupRange, epoch: int, token: str) -> MemoryWriter:
        return self.writer_class(self, log_id, key_groups, epoch, token)

    def create_reader(self) -> MemoryStorageReader:
        """Create a reader."""
        return self.reader_class(self)

    def discard(self, handles: Iterable[ChangelogHandle]) -> None:
        """Forget the handles' change sets; delete objects none of whose change sets is left.

        A change set is forgotten only when it lies in an object of this job and
        its header names the handle's log, epoch and SQN: a forged or damaged handle
        frees nothing (another job's object is refused).

        :raises InvalidHandleError: for an object of another job.
        """
        self._check_writable()
        handles = list(handles)
        self._metrics.inc("discarded_change_sets", sum(len(h.locations) for h in handles))
        deleted = 0
        with self.namespace.lock:
            for handle in handles:
                for loc in checked_locations(handle, MemoryStorageReader.location_fields):
                    name = str(loc["object"])
                    if not name.startswith(f"{self.job_id}/"):
                        msg = (
                            f"object location {name!r:.120} does not belong to job {self.job_id!r} of this "
                            "storage: a damaged or foreign handle"
                        )
                        raise InvalidHandleError(msg)
                    live = self.namespace.live.get(name)
                    offset = int(loc["offset"])  # type: ignore[arg-type]
                    if live is None or not self._holds(name, offset, handle, loc):
                        continue
                    live.discard(offset)
                    if not live:
                        del self.namespace.live[name]
                        self.namespace.objects.pop(name, None)
                        self.namespace.created.pop(name, None)
                        deleted += 1
        self._metrics.inc("deleted_objects", deleted)

    def _holds(self, name: str, offset: int, handle: ChangelogHandle, loc: Location) -> bool:
        """Whether the change set at ``offset`` of object ``name`` is the handle's (namespace lock held)."""
        head = bytes(self.namespace.objects[name][offset : offset + CHANGE_SET_HEADER_SIZE + MAX_NAME_LENGTH])
        where = f"memory://{name}"
        return self._may_discard(
            lambda: change_set_identity(head, location=where, offset=offset),
            handle,
            loc,
            where=where,
            offset=offset,
        )

    def collect_orphans(self, live: Iterable[ChangelogHandle], *, older_than: float) -> int:
        """Delete this job's objects no ``live`` handle needs, older than the asked grace.

        Age is measured by the namespace's own clock (monotonic), not by wall clocks.
        """
        self._check_writable()
        cutoff = time.monotonic() - (time.time() - older_than)
        needed = {
            str(loc["object"])
            for handle in live
            if handle.storage_id == self.storage_id
            for loc in checked_locations(handle, MemoryStorageReader.location_fields)
        }
        with self.namespace.lock:
            orphans = [
                name
                for name in self.namespace.objects
                if name.startswith(f"{self.job_id}/")
                and name not in needed
                and self.namespace.created.get(name, cutoff) < cutoff
            ]
            for name in orphans:
                self.namespace.objects.pop(name, None)
                self.namespace.live.pop(name, None)
                self.namespace.created.pop(name, None)
        self._metrics.inc("deleted_objects", len(orphans))
        self._metrics.inc("orphans_deleted", len(orphans))
        return len(orphans)

    def list_objects(self) -> list[str]:
        """Names of the objects this job has in the namespace."""
        with self.namespace.lock:
            return sorted(n for n in self.namespace.objects if n.startswith(f"{self.job_id}/"))
