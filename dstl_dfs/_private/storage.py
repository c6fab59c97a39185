"""The DFS / object-store storage: batched, hedged uploads of change-set objects."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from dstl.spi import (
    ChangelogHandle,
    Config,
    FencedError,
    InvalidHandleError,
    KeyGroupRange,
    StorageError,
)
from dstl.spi.handle import Location
from dstl.spi.kit import (
    ChangeSetStorage,
    check_relative_path,
    storage_settings,
)
from dstl.spi.kit.changeset_format import CHANGE_SET_HEADER_SIZE, ChangeSetIdentity, change_set_identity
from dstl.spi.kit.changeset_reader import checked_locations
from dstl.spi.names import MAX_NAME_LENGTH

from ..options import (
    BASE_PATH,
    BATCH_PERSIST_DELAY,
    BATCH_PERSIST_SIZE_THRESHOLD,
    DOWNLOAD_CACHE_IDLE_TIMEOUT,
    DOWNLOAD_CACHE_MAX_SIZE,
    DOWNLOAD_MAX_ATTEMPTS,
    DOWNLOAD_TIMEOUT,
    PREEMPTIVE_PERSIST_THRESHOLD,
    UPLOAD_MAX_ATTEMPTS,
    UPLOAD_MAX_IN_FLIGHT,
    UPLOAD_NEXT_ATTEMPT_DELAY,
    UPLOAD_NUM_THREADS,
    UPLOAD_RETRY_POLICY,
    UPLOAD_TIMEOUT,
)
from .batch_format import HEADER_SIZE, build_object, index_size, read_index
from .bounded import BoundedCalls
from .cache import DownloadCache
from .hedging import HedgedUpload, RetryPolicy
from .object_store import ObjectExistsError, ObjectStore, S3Store, open_store
from .reader import DfsReader
from .scheduler import BatchingScheduler, UploadRequest
from .timers import TimerThread
from .writer import DfsWriter

log = logging.getLogger(__name__)

IDENTIFIER = "filesystem"
_INDEX_PROBE = 64 * 1024


#: The record of whose job a job prefix is (its checkpoint location), under the job prefix.
OWNER_KEY = "OWNER"
#: Longest owner record read back (a checkpoint location).
_MAX_OWNER = 4096


def data_key(job_id: str, instance: str, batch: int, attempt: int) -> str:
    """Key of an upload attempt's object: unique, and carrying its creation time (for orphan collection)."""
    return f"{job_id}/data/{instance}-{time.time_ns():020d}-{batch:010d}-a{attempt}.dstl"


def data_key_time(key: str) -> float | None:
    """The creation time (``time.time()`` seconds) in a :func:`data_key`, ``None`` for other keys."""
    parts = key.rsplit("/", 1)[-1].split("-")
    if len(parts) != 4 or len(parts[1]) != 20 or not parts[1].isdigit():
        return None
    return int(parts[1]) / 1e9


class DfsStorage(ChangeSetStorage):
    """Change sets of many writers uploaded as one object per batch.

    Keys under ``dstl.dfs.base-path``::

        <job>/data/<instance>-<time_ns>-<batch>-a<attempt>.dstl    objects (unique per attempt)
        <job>/epochs/<log>/<epoch>-<time>-<id>             epoch markers (conditional puts)
    """

    def __init__(self, config: Config, job_id: str) -> None:
        super().__init__(
            job_id,
            **storage_settings(config),
        )
        self.store: ObjectStore = open_store(config)
        # Epoch markers need conditional puts: on S3 through botocore even when data goes through s3fs.
        on_s3 = urlparse(config.get(BASE_PATH)).scheme in ("s3", "s3a")
        self.markers = (
            open_store(config, for_markers=True)
            if on_s3 and not isinstance(self.store, S3Store)
            else self.store
        )
        self.preemptive_threshold = config.get(PREEMPTIVE_PERSIST_THRESHOLD)
        self.instance = uuid.uuid4().hex[:12]
        self._batches = itertools.count()
        self._policy = RetryPolicy(
            kind=config.get(UPLOAD_RETRY_POLICY),
            timeout=config.get(UPLOAD_TIMEOUT),
            max_attempts=config.get(UPLOAD_MAX_ATTEMPTS),
            next_attempt_delay=config.get(UPLOAD_NEXT_ATTEMPT_DELAY),
        )
        threads = config.get(UPLOAD_NUM_THREADS)
        self._pool = ThreadPoolExecutor(
            threads * self._policy.attempts + 1, thread_name_prefix="dstl-dfs-upload"
        )
        self._timers = TimerThread("dstl-dfs-timers")
        self._scheduler = BatchingScheduler(
            delay=config.get(BATCH_PERSIST_DELAY),
            size_threshold=config.get(BATCH_PERSIST_SIZE_THRESHOLD),
            max_in_flight=config.get(UPLOAD_MAX_IN_FLIGHT),
            timers=self._timers,
            metrics=self._metrics,
            upload_batch=self._upload_batch,
        )
        self._reads = BoundedCalls(
            timeout=config.get(DOWNLOAD_TIMEOUT),
            attempts=config.get(DOWNLOAD_MAX_ATTEMPTS),
            metrics=self._metrics,
        )
        #: downloaded objects shared by the readers (and invalidated by discards)
        self.cache = DownloadCache(
            lambda key: self._reads.call(f"reading {self.store.describe(key)}", lambda: self.store.get(key)),
            idle_timeout=config.get(DOWNLOAD_CACHE_IDLE_TIMEOUT),
            max_bytes=config.get(DOWNLOAD_CACHE_MAX_SIZE),
            metrics=self._metrics,
        )
        self._gc_lock = threading.Lock()
        self._live: dict[str, set[int]] = {}
        #: Per object this process uploaded or checked: whose change set lies at each offset.
        self._identities: dict[str, dict[int, ChangeSetIdentity]] = {}
        self._pins: Counter[tuple[str, int]] = Counter()
        self._pinned_objects: Counter[str] = Counter()

    @property
    def identifier(self) -> str:
        """``filesystem``."""
        return IDENTIFIER

    # -- job binding ------------------------------------------------------------------------------
    def _record_owner(self, owner: str) -> str:
        """``<job>/OWNER``, created with a conditional put; read back when it exists."""
        key = f"{self.job_id}/{OWNER_KEY}"
        try:
            self.markers.put_new(key, owner.encode())
        except ObjectExistsError:
            data = self.markers.get_range(key, 0, _MAX_OWNER + 1)
            if len(data) > _MAX_OWNER:
                where = self.markers.describe(key)
                msg = f"the job's owner record {where} is over {_MAX_OWNER} bytes: remove it"
                raise StorageError(msg) from None
            return data.decode("utf-8", errors="replace")
        return owner

    # -- fencing ------------------------------------------------------------------------------
    def _marker_prefix(self, log_id: str = "") -> str:
        return f"{self.job_id}/epochs/{log_id}/" if log_id else f"{self.job_id}/epochs/"

    def _claim_log(self, log_id: str, epoch: int) -> str:
        existing = [key.rsplit("/", 1)[-1] for key in self.markers.list(self._marker_prefix(log_id))]
        highest = max((int(name.split("-", 1)[0]) for name in existing if name[:20].isdigit()), default=None)
        if highest is not None and highest > epoch:
            msg = f"log {log_id!r} already has a writer with epoch {highest} > {epoch}"
            raise FencedError(msg)
        # Markers sort by (epoch, creation time): the greatest one owns the log.
        token = f"{epoch:020d}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self.markers.put_new(self._marker_prefix(log_id) + token, b"")
        self._delete_superseded_markers(log_id, [name for name in existing if name < token])
        return token

    def _delete_superseded_markers(self, log_id: str, superseded: list[str]) -> None:
        """Delete markers below the one just created: the log keeps one marker per live claim.

        Safe: the greatest marker owns the log and a claimer deletes only markers
        below its own, so the owner's marker is never deleted, and a fenced writer
        finds a greater marker (or none of its own) either way. A marker left by a
        failed delete is deleted by the next claim.
        """
        for name in superseded:
            try:
                self.markers.delete(self._marker_prefix(log_id) + name)
            except StorageError as exc:
                log.warning("could not delete superseded epoch marker %s of log %r: %s", name, log_id, exc)
                continue
            self._metrics.inc("deleted_markers")

    def _owners(self) -> dict[str, str]:
        owners: dict[str, str] = {}
        prefix = self._marker_prefix()
        markers = self._reads.call(
            f"listing the epoch markers under {self.markers.describe(prefix)}",
            lambda: self.markers.list(prefix),
        )
        for key in markers:
            log_id, _, token = key[len(prefix) :].rpartition("/")
            if token > owners.get(log_id, ""):
                owners[log_id] = token
        return owners

    def _make_writer(self, log_id: str, key_groups: KeyGroupRange, epoch: int, token: str) -> DfsWriter:
        return DfsWriter(self, log_id, key_groups, epoch, token)

    # -- uploads --------------------------------------------------------------------------------
    def available(self) -> bool:
        """False while uploads in flight exceed ``upload.max-in-flight`` (persists would block)."""
        return self._scheduler.available()

    def wait_available(self, timeout: float | None = None) -> bool:
        """Block until persists can start without blocking; interruptible."""
        return self._scheduler.wait_available(timeout)

    def _upload_batch(self, batch: list[UploadRequest], done: Callable[[], None]) -> None:
        entries = sorted(
            (
                (request.log_id, sqn, index, blob)
                for index, request in enumerate(batch)
                for sqn, blob in request.blobs
            ),
            key=lambda entry: (entry[0], entry[1], entry[2]),
        )
        data, offsets = build_object(
            [entry[3] for entry in entries], compressed=self.change_set_codec != "none"
        )
        placed: dict[tuple[int, int], tuple[int, int]] = {}
        for (_, sqn, index, blob), offset in zip(entries, offsets, strict=True):
            placed[(index, sqn)] = (offset, len(blob))
        number = next(self._batches)
        upload = HedgedUpload(
            policy=self._policy,
            pool=self._pool,
            timers=self._timers,
            metrics=self._metrics,
            key_for_attempt=lambda attempt: data_key(self.job_id, self.instance, number, attempt),
            put=lambda key: self.store.put_new(key, data),
            delete=self.store.delete,
        )
        uploaded = upload.start()
        # The fencing check runs in parallel with the upload.
        owners = self._pool.submit(self._owners)
        pending = [2]
        lock = threading.Lock()

        def settle(_: Future[Any]) -> None:
            with lock:
                pending[0] -= 1
                if pending[0]:
                    return
            done()
            self._settle(batch, placed, len(data), uploaded, owners)

        uploaded.add_done_callback(settle)
        owners.add_done_callback(settle)

    def _settle(
        self,
        batch: list[UploadRequest],
        placed: dict[tuple[int, int], tuple[int, int]],
        size: int,
        uploaded: Future[str],
        owners: Future[dict[str, str]],
    ) -> None:
        error = uploaded.exception() or owners.exception()
        if error is not None:
            failure = error if isinstance(error, StorageError) else StorageError(str(error), retriable=True)
            for request in batch:
                request.future.set_exception(failure)
            if uploaded.exception() is None:
                self._delete_object(uploaded.result())
            return
        key, current = uploaded.result(), owners.result()
        self._metrics.inc("uploads")
        self._metrics.inc("uploaded_bytes", size)
        self._metrics.observe("upload_bytes", size)
        live: set[int] = set()
        identities: dict[int, ChangeSetIdentity] = {}
        outcomes: list[tuple[UploadRequest, Any]] = []
        for index, request in enumerate(batch):
            spots = [placed[(index, sqn)] for sqn, _ in request.blobs]
            if current.get(request.log_id) != request.token:
                outcomes.append(
                    (
                        request,
                        FencedError(
                            f"writer of log {request.log_id!r} with epoch {request.epoch} was fenced"
                        ),
                    )
                )
                continue
            live.update(offset for offset, _ in spots)
            identities.update(
                (offset, ChangeSetIdentity(request.log_id, request.epoch, sqn))
                for (sqn, _), (offset, _) in zip(request.blobs, spots, strict=True)
            )
            outcomes.append((request, [(key, offset, length) for offset, length in spots]))
        with self._gc_lock:
            self._live[key] = live
            self._identities[key] = identities
        if not live:
            self._delete_object(key)
        for request, outcome in outcomes:
            if isinstance(outcome, BaseException):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)

    # -- reads, discard, GC ------------------------------------------------------------------------
    def create_reader(self) -> DfsReader:
        """Create a reader (sharing the storage's download cache)."""
        return DfsReader(self)

    def submit_upload(self, request: UploadRequest) -> Future[Any]:
        """Queue a writer's change sets for the next upload batch: ``(key, offset, length)`` of each."""
        return self._scheduler.submit(request)

    def pin(self, key: str, offset: int) -> None:
        """A writer holds the change set at ``offset`` of object ``key`` for reuse."""
        with self._gc_lock:
            self._pins[(key, offset)] += 1
            self._pinned_objects[key] += 1

    def unpin(self, locations: list[Location]) -> None:
        """A writer released these change sets (an object may be collected once all are discarded)."""
        to_check = set()
        with self._gc_lock:
            for loc in locations:
                spot = (str(loc["object"]), int(loc["offset"]))  # type: ignore[arg-type]
                if self._pins[spot] > 0:
                    self._pins[spot] -= 1
                    self._pinned_objects[spot[0]] -= 1
                    if self._pins[spot] == 0:
                        del self._pins[spot]
                    if self._pinned_objects[spot[0]] == 0:
                        del self._pinned_objects[spot[0]]
                        to_check.add(spot[0])
        for key in to_check:
            self._collect(key)

    def _index_of(self, key: str) -> set[int] | None:
        try:
            head = self.store.get_range(key, 0, _INDEX_PROBE)
        except StorageError:
            return None  # already gone
        where = self.store.describe(key)
        needed = index_size(head[:HEADER_SIZE], location=where)
        if needed > len(head):
            head = self.store.get_range(key, 0, needed)
        return {offset for offset, _ in read_index(head, location=where)}

    def discard(self, handles: Iterable[ChangelogHandle]) -> None:
        """Forget the handles' change sets; delete objects none of whose change sets is needed.

        Only this job's objects are touched, and a change set is forgotten only when
        its header names the handle's log, epoch and SQN (a forged or damaged handle
        frees nothing).

        :raises InvalidHandleError: for an object location outside this job.
        """
        self._check_writable()
        handles = list(handles)
        self._metrics.inc("discarded_change_sets", sum(len(h.locations) for h in handles))
        by_object: dict[str, set[int]] = {}
        for handle in handles:
            for loc in checked_locations(handle, DfsReader.location_fields):
                key = self._own_object(str(loc["object"]))
                offset = int(loc["offset"])  # type: ignore[arg-type]
                if self._holds(key, offset, handle, loc):
                    by_object.setdefault(key, set()).add(offset)
        for key, offsets in by_object.items():
            with self._gc_lock:
                known = key in self._live
            if not known:
                index = self._index_of(key)
                if index is None:
                    continue
                with self._gc_lock:
                    self._live.setdefault(key, index)
            with self._gc_lock:
                self._live[key] -= offsets
            self._collect(key)

    def _own_object(self, key: str) -> str:
        """``key`` if it names a data object of this storage's job; anything else is refused."""
        check_relative_path(key, "object location")
        if not key.startswith(f"{self.job_id}/data/") or "/" in key[len(f"{self.job_id}/data/") :]:
            msg = (
                f"object location {key!r:.120} does not belong to job {self.job_id!r} of this storage "
                f"(expected {self.job_id}/data/<object>): a damaged or foreign handle"
            )
            raise InvalidHandleError(msg)
        return key

    def _holds(self, key: str, offset: int, handle: ChangelogHandle, loc: Location) -> bool:
        """Whether the change set at ``offset`` of ``key`` is the handle's (its header says whose it is)."""

        def identity() -> ChangeSetIdentity:
            with self._gc_lock:
                known = self._identities.get(key, {}).get(offset)
            if known is not None:
                return known
            head = self.store.get_range(key, offset, offset + CHANGE_SET_HEADER_SIZE + MAX_NAME_LENGTH)
            return change_set_identity(head, location=self.store.describe(key), offset=offset)

        return self._may_discard(identity, handle, loc, where=self.store.describe(key), offset=offset)

    def _collect(self, key: str) -> None:
        with self._gc_lock:
            live = self._live.get(key)
            if live is None or live or self._pinned_objects[key] > 0:
                return
            del self._live[key]
            self._identities.pop(key, None)
        self._delete_object(key)

    def _delete_object(self, key: str) -> None:
        try:
            self.store.delete(key)
        except StorageError as exc:
            log.warning("could not delete %s: %s", self.store.describe(key), exc)
            return
        self.cache.invalidate(key)
        self._metrics.inc("deleted_objects")

    @property
    def longest_upload(self) -> float:
        """Every attempt's timeout plus the delays between them: no upload is acknowledged later."""
        policy = self._policy
        return policy.timeout * policy.attempts + policy.next_attempt_delay * (policy.attempts - 1)

    def collect_orphans(self, live: Iterable[ChangelogHandle], *, older_than: float) -> int:
        """Delete this job's data objects that no ``live`` handle needs, older than the asked grace.

        Age is measured in the store's clock: the object's modification time against
        the store's now (a probe object), so a writer whose clock runs behind cannot
        have its in-flight upload taken for old. Where the store reports no
        modification time, the creation time in the key (:func:`data_key`) is used.
        Objects an open writer still reuses stay.
        """
        self._check_writable()
        grace = time.time() - older_than
        needed = {
            str(loc["object"])
            for handle in live
            if handle.storage_id == IDENTIFIER
            for loc in checked_locations(handle, DfsReader.location_fields)
        }
        listed = self.store.list_modified(f"{self.job_id}/data/")
        store_now = self.store.store_now(f"{self.job_id}/clock") if listed else None
        deleted = 0
        for key, modified in sorted(listed.items()):
            if store_now is not None and modified is not None:
                young = modified >= store_now - grace
            else:
                created = data_key_time(key)
                young = created is None or created >= older_than
            if key in needed or young:
                continue
            with self._gc_lock:
                if self._pinned_objects[key] > 0:
                    continue
                self._live.pop(key, None)
                self._identities.pop(key, None)
            self._delete_object(key)
            log.info("deleted orphan object %s (no retained checkpoint needs it)", self.store.describe(key))
            deleted += 1
        self._metrics.inc("orphans_deleted", deleted)
        return deleted

    def list_objects(self) -> list[str]:
        """Data objects of this job."""
        return self.store.list(f"{self.job_id}/data/")

    def _close_resources(self) -> None:
        self._scheduler.close()
        self._pool.shutdown(wait=True)
        self._timers.close()
        self._reads.close()
        self.cache.clear()
        self.store.close()
        if self.markers is not self.store:
            self.markers.close()
