"""Implementation of the memory storage."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ...changeset_format import decode_change_set, encode_change_set
from ...changeset_writer import ChangeSet, ChangeSetWriter, log_id_for
from ...config import Config
from ...errors import ClosedError, CorruptedError, FencedError, StorageError
from ...handle import ChangelogHandle, Location
from ...metrics import StorageMetrics
from ...names import validate_name
from ...reader import StateChangelogReader
from ...storage import StateChangelogStorage
from ...types import KeyGroupRange, StateChange

IDENTIFIER = "memory"


@dataclass
class _Namespace:
    """Objects and log ownership shared by the storage instances of one namespace."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    objects: dict[str, bytearray] = field(default_factory=dict)
    # (job, log) -> (epoch, owner token) of the newest writer.
    owners: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    tokens: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]


_NAMESPACES: dict[str, _Namespace] = {}
_NAMESPACES_LOCK = threading.Lock()


def _namespace(name: str) -> _Namespace:
    with _NAMESPACES_LOCK:
        return _NAMESPACES.setdefault(name, _Namespace())


def namespace_objects(name: str) -> dict[str, bytearray]:
    """The live objects of namespace ``name`` (a backdoor for tests: mutate with care)."""
    return _namespace(name).objects


class MemoryWriter(ChangeSetWriter):
    """Writer whose uploads become objects in the namespace."""

    def __init__(
        self, storage: MemoryStorage, log_id: str, key_groups: KeyGroupRange, epoch: int, token: int
    ) -> None:
        super().__init__(
            storage_id=storage.identifier,
            log_id=log_id,
            key_groups=key_groups,
            epoch=epoch,
            metrics=storage.metrics,
            on_close=storage._forget,
        )
        self._storage = storage
        self._token = token

    def _upload(self, change_sets: Sequence[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        future: Future[list[Location]] = Future()
        storage = self._storage
        ns = storage._ns
        blobs = [encode_change_set(self.log_id, self.epoch, cs.sqn, cs.changes) for cs in change_sets]
        with ns.lock:
            owner = ns.owners.get((storage.job_id, self.log_id))
            if owner != (self.epoch, self._token):
                newer = owner[0] if owner else "?"
                storage.metrics.inc("upload_failures")
                future.set_exception(
                    FencedError(
                        f"writer of log {self.log_id!r} with epoch {self.epoch} was fenced by a "
                        f"newer writer (epoch {newer})"
                    )
                )
                return future
            name = f"{storage.job_id}/{self.log_id}/{next(ns.tokens):012d}"
            ns.objects[name] = bytearray(b"".join(blobs))
        storage.metrics.inc("uploads")
        storage.metrics.inc("uploaded_bytes", sum(len(b) for b in blobs))
        locations: list[Location] = []
        offset = 0
        for cs, blob in zip(change_sets, blobs, strict=True):
            locations.append({"object": name, "offset": offset, "length": len(blob), "sqn": cs.sqn})
            offset += len(blob)
        future.set_result(locations)
        return future


class MemoryStorageReader(StateChangelogReader):
    """Reads handles of the memory storage, verifying every change set."""

    def __init__(self, storage: MemoryStorage) -> None:
        self._storage = storage

    def read(self, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None) -> Iterator[StateChange]:
        """Yield the handle's changes; see :class:`StateChangelogReader`."""
        if handle.storage_id != self._storage.identifier:
            msg = (
                f"handle of storage {handle.storage_id!r} cannot be read by "
                f"storage {self._storage.identifier!r}"
            )
            raise StorageError(msg)
        ns = self._storage._ns
        locations = sorted(handle.location_dicts, key=lambda loc: loc["sqn"])  # type: ignore[arg-type,return-value]
        for loc in locations:
            sqn = loc.get("sqn")
            if sqn not in handle.sqn_range:
                continue
            name, offset = str(loc["object"]), int(loc["offset"])  # type: ignore[arg-type]
            with ns.lock:
                blob = ns.objects.get(name)
                data = bytes(blob) if blob is not None else None
            if data is None:
                msg = f"object {name!r} of log {handle.log_id!r} does not exist (was it discarded?)"
                raise StorageError(msg)
            decoded = decode_change_set(data, offset, location=f"memory://{name}")
            if (decoded.log_id, decoded.epoch, decoded.sqn) != (handle.log_id, handle.epoch, sqn):
                msg = (
                    f"change set at this location belongs to log {decoded.log_id!r} epoch "
                    f"{decoded.epoch} SQN {decoded.sqn}, not to the handle's log {handle.log_id!r} "
                    f"epoch {handle.epoch} SQN {sqn}"
                )
                raise CorruptedError(msg, location=f"memory://{name}", offset=offset)
            for key_group, change in decoded.changes:
                if key_groups is None or key_group < 0 or key_group in key_groups:
                    yield StateChange(key_group, change, decoded.sqn)


class MemoryStorage(StateChangelogStorage):
    """The in-memory reference storage; thread-safe."""

    writer_class: type[MemoryWriter] = MemoryWriter
    reader_class: type[MemoryStorageReader] = MemoryStorageReader
    storage_id = IDENTIFIER

    def __init__(self, config: Config, job_id: str) -> None:
        self._config = config
        self.job_id = validate_name(job_id, "job id")
        self.namespace = str(config["dstl.memory.namespace"])
        self._ns = _namespace(self.namespace)
        self._metrics = StorageMetrics()
        self._lock = threading.Lock()
        self._writers: set[MemoryWriter] = set()
        self._closed = False

    @property
    def identifier(self) -> str:
        """``memory``."""
        return self.storage_id

    @property
    def metrics(self) -> StorageMetrics:
        """The storage's counters."""
        return self._metrics

    def create_writer(self, operator_id: str, key_groups: KeyGroupRange, *, epoch: int = 0) -> MemoryWriter:
        """Create the writer of ``operator_id``'s log; fences older epochs."""
        if self._closed:
            msg = "memory storage is closed"
            raise ClosedError(msg)
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            msg = f"epoch must be a non-negative int, got {epoch!r}"
            raise ValueError(msg)
        log_id = log_id_for(operator_id, key_groups)
        with self._ns.lock:
            current = self._ns.owners.get((self.job_id, log_id))
            if current is not None and epoch < current[0]:
                msg = f"log {log_id!r} already has a writer with epoch {current[0]} > {epoch}"
                raise FencedError(msg)
            token = next(self._ns.tokens)
            self._ns.owners[(self.job_id, log_id)] = (epoch, token)
        writer = self.writer_class(self, log_id, key_groups, epoch, token)
        with self._lock:
            self._writers.add(writer)
        return writer

    def _forget(self, writer: ChangeSetWriter) -> None:
        with self._lock:
            self._writers.discard(writer)  # type: ignore[arg-type]

    def create_reader(self) -> MemoryStorageReader:
        """Create a reader."""
        return self.reader_class(self)

    def discard(self, handles: Iterable[ChangelogHandle]) -> None:
        """Delete the objects the handles refer to."""
        names = {str(loc["object"]) for h in handles for loc in h.location_dicts}
        deleted = 0
        with self._ns.lock:
            for name in names:
                if self._ns.objects.pop(name, None) is not None:
                    deleted += 1
        self._metrics.inc("discarded_objects", deleted)

    def list_objects(self) -> list[str]:
        """Names of the objects this job has in the namespace."""
        with self._ns.lock:
            return sorted(n for n in self._ns.objects if n.startswith(f"{self.job_id}/"))

    def close(self) -> None:
        """Close every writer; the namespace keeps its data."""
        with self._lock:
            self._closed = True
            writers = list(self._writers)
        for writer in writers:
            writer.close()
