"""A writer base that keeps the change-set bookkeeping every storage shares.

Storages subclass :class:`ChangeSetWriter` and implement only
:meth:`ChangeSetWriter._upload`: how a batch of closed change sets becomes durable
and where each one can be found again. SQN rules, truncation, confirm/reset,
reuse of earlier uploads and the state guard live here once.
"""

from __future__ import annotations

import enum
import threading
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Protocol

from ..errors import ClosedError, FencedError, TruncatedError
from ..handle import ChangelogHandle, Location
from ..types import META_KEY_GROUP, KeyGroupRange, SequenceNumberRange
from ..writer import StateChangelogWriter
from .changeset_format import CHANGE_ITEM, frame_change_set
from .futures import when_all

if TYPE_CHECKING:
    from ..metrics import StorageMetrics

__all__ = ["ChangeSet", "ChangeSetWriter", "WriterHost", "WriterState"]


class WriterState(enum.Enum):
    """Lifecycle of a writer; every state but OPEN refuses work."""

    OPEN = "open"
    FENCED = "fenced"
    CLOSED = "closed"


@dataclass
class ChangeSet:
    """A closed change set and what is known about its persisted copy.

    The changes are kept already encoded (``body``, built at append time), so a
    persist only frames and checksums them.

    :ivar size: bytes of change data (without framing).
    """

    sqn: int
    body: bytes
    count: int
    size: int
    location: Location | None = None
    confirmed: bool = False
    pending: Future[list[Location]] | None = field(default=None, repr=False)

    def encode(self, log_id: str, epoch: int, *, codec: str = "none") -> bytes:
        """The change set in the stored format (:mod:`dstl.spi.changeset_format`), compressed by ``codec``."""
        return frame_change_set(log_id, epoch, self.sqn, self.count, self.body, codec=codec)


_PACK_ITEM = CHANGE_ITEM.pack


def _as_bytes(data: object) -> bytes:
    """A copy of any bytes-like value's bytes (typed views and arrays count their bytes, not items).

    A copy: the caller may reuse its buffer as soon as ``append`` returns.
    """
    if isinstance(data, bytes):
        return data
    try:
        view = memoryview(data)  # type: ignore[arg-type]  # any object with the buffer protocol
    except TypeError:
        msg = f"state change data must be bytes-like, got {type(data).__name__}"
        raise TypeError(msg) from None
    return view.tobytes()


class WriterHost(Protocol):
    """What a :class:`ChangeSetWriter` needs of its storage (:class:`ChangeSetStorage` is one)."""

    @property
    def identifier(self) -> str:
        """The storage identifier handles carry."""
        ...

    @property
    def preemptive_threshold(self) -> float:
        """Open change-set bytes at which the writer uploads ahead of the next persist."""
        ...

    @property
    def change_set_codec(self) -> str:
        """How the writer compresses the change sets it stores."""
        ...

    @property
    def metrics(self) -> StorageMetrics:
        """Where the writer counts ``appends`` and ``persists``."""
        ...

    def writer_closed(self, writer: ChangeSetWriter) -> None:
        """``writer`` closed: the storage forgets it."""
        ...


class ChangeSetWriter(StateChangelogWriter):
    """Buffers appends into change sets and turns persists into uploads.

    :param host: the storage that created the writer, seen through :class:`WriterHost`:
        its identifier goes into handles, its metrics count ``appends`` and
        ``persists``, and it forgets the writer when it closes.
    :param log_id: the log (see :func:`~dstl.spi.log_id_for`).
    :param token: the owner token from the storage's fencing (``_token``).
    """

    def __init__(
        self,
        host: WriterHost,
        log_id: str,
        key_groups: KeyGroupRange,
        epoch: int,
        token: str,
        *,
        initial_sqn: int = 0,
    ) -> None:
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            msg = f"epoch must be a non-negative int, got {epoch!r}"
            raise ValueError(msg)
        self._storage = host
        self._storage_id = host.identifier
        self._token = token
        self._log_id = log_id
        self._key_groups = key_groups
        self._kg_start, self._kg_end = key_groups.start, key_groups.end
        self._preempt_at = host.preemptive_threshold
        self._codec = host.change_set_codec
        self._unpublished_appends = 0
        self._epoch = epoch
        self._metrics = host.metrics
        self._initial_sqn = initial_sqn
        self._lock = threading.RLock()
        self._state = WriterState.OPEN
        self._active_sqn = initial_sqn
        self._active = bytearray()
        self._active_count = 0
        self._active_bytes = 0
        self._last_appended: int | None = None
        self._lowest = initial_sqn
        self._change_sets: OrderedDict[int, ChangeSet] = OrderedDict()
        self._held_bytes = 0

    # -- identity ---------------------------------------------------------------------
    @property
    def log_id(self) -> str:
        """Identifier of the log this writer appends to."""
        return self._log_id

    @property
    def key_groups(self) -> KeyGroupRange:
        """The key groups this writer accepts."""
        return self._key_groups

    @property
    def epoch(self) -> int:
        """The fencing epoch the writer was created with."""
        return self._epoch

    @property
    def state(self) -> WriterState:
        """Current lifecycle state."""
        return self._state

    # -- storage-specific part ------------------------------------------------------------
    def _encoded(self, change_set: ChangeSet) -> bytes:
        """``change_set`` in the stored format, compressed as the storage was configured."""
        return change_set.encode(self._log_id, self._epoch, codec=self._codec)

    @abstractmethod
    def _upload(self, change_sets: Sequence[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        """Make ``change_sets`` durable; the future yields one location per change set.

        Called with the writer lock held. It may do the I/O itself (e.g. as the
        leader of a group commit) or hand it off; the future may complete at once or
        later, on any thread. Must fail the future with
        :class:`FencedError` when a newer epoch owns the log, and with
        :class:`~dstl.spi.StorageError` on other failures.
        """

    def _released(self, locations: list[Location]) -> None:
        """Called when the writer no longer reuses ``locations`` (truncate, reset, close).

        Storages that reference-count their stored data unpin them here. Called with
        the writer lock held.
        """

    # -- guards -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state is WriterState.CLOSED:
            msg = f"writer of log {self._log_id!r} is closed"
            raise ClosedError(msg)
        if self._state is WriterState.FENCED:
            msg = f"writer of log {self._log_id!r} (epoch {self._epoch}) was fenced by a newer writer"
            raise FencedError(msg)

    def _mark_fenced(self) -> None:
        with self._lock:
            if self._state is WriterState.OPEN:
                self._state = WriterState.FENCED

    # -- appends and boundaries -------------------------------------------------------------
    def append(self, key_group: int, data: bytes) -> None:
        """Append a change under ``key_group`` to the open change set."""
        # Hot path: exact type checks and local counters (no metrics lock per append).
        if type(key_group) is not int or not self._kg_start <= key_group < self._kg_end:
            msg = (
                f"key group {key_group!r} is outside this writer's range "
                f"[{self._key_groups.start}, {self._key_groups.end}) of log {self._log_id!r}"
            )
            raise ValueError(msg)
        self._add((key_group,), (data if type(data) is bytes else _as_bytes(data),))

    def append_all(self, key_groups: Sequence[int], data: Sequence[bytes]) -> None:
        """Every change under one lock, after checking them all (a refused call appends none)."""
        self._refuse_bad_batch(key_groups, data)
        if data:
            if set(map(type, data)) != {bytes}:  # copies of other bytes-likes (the caller may reuse them)
                data = [change if type(change) is bytes else _as_bytes(change) for change in data]
            self._add(key_groups, data)

    def _add(self, key_groups: Sequence[int], changes: Sequence[bytes]) -> None:
        """Frame checked changes (at least one, bytes) into the open change set, under the lock."""
        with self._lock:
            if self._state is not WriterState.OPEN:
                self._check_open()
            if len(changes) == 1:  # append's path: two extends beat building a join
                size = len(changes[0])
                self._active += _PACK_ITEM(key_groups[0], size)
                self._active += changes[0]
            else:  # each item's header, then its bytes: framed in C, not a Python step per change
                lengths = list(map(len, changes))
                items = zip(map(_PACK_ITEM, key_groups, lengths), changes, strict=True)
                self._active += b"".join(chain.from_iterable(items))
                size = sum(lengths)
            self._active_count += len(changes)
            self._active_bytes += size
            self._last_appended = self._active_sqn
            self._unpublished_appends += len(changes)
            preempt = self._active_bytes >= self._preempt_at
        if preempt:
            self.upload_ahead()

    def append_meta(self, data: bytes) -> None:
        """Append a metadata record."""
        data = _as_bytes(data)
        with self._lock:
            self._check_open()
            self._active += _PACK_ITEM(META_KEY_GROUP, len(data))
            self._active += data
            self._active_count += 1
            self._active_bytes += len(data)
            self._last_appended = self._active_sqn
            self._unpublished_appends += 1

    def initial_sqn(self) -> int:
        """SQN of the first change set."""
        return self._initial_sqn

    def last_appended_sqn(self) -> int | None:
        """SQN of the change set that received the latest append, or ``None``."""
        return self._last_appended

    def next_sqn(self) -> int:
        """Close the open change set if non-empty; return the next SQN."""
        with self._lock:
            self._rollover()
            return self._active_sqn

    def _rollover(self) -> None:
        if self._unpublished_appends:
            self._metrics.inc("appends", self._unpublished_appends)
            self._unpublished_appends = 0
        if not self._active_count:
            return
        self._change_sets[self._active_sqn] = ChangeSet(
            self._active_sqn, bytes(self._active), self._active_count, self._active_bytes
        )
        self._held_bytes += self._active_bytes
        self._active_sqn += 1
        self._active = bytearray()
        self._active_count = 0
        self._active_bytes = 0

    def upload_ahead(self) -> None:
        """Upload the closed (and open) change sets now, ahead of the next persist.

        The pre-emptive persist of storages with slow uploads: a later persist
        reuses what this uploaded; if it fails, that persist uploads again.
        """
        with self._lock:
            if self._state is not WriterState.OPEN:
                return
            self._rollover()
            pending = [cs for cs in self._change_sets.values() if cs.location is None and cs.pending is None]
            if not pending:
                return
            self._metrics.inc("preemptive_uploads")
            self._start_upload(pending, -1)

    # -- persist ----------------------------------------------------------------------------
    def persist(self, start_sqn: int, checkpoint_id: int) -> Future[ChangelogHandle]:
        """Make every change with SQN >= ``start_sqn`` durable; see the SPI contract."""
        if not isinstance(start_sqn, int) or isinstance(start_sqn, bool) or start_sqn < 0:
            msg = f"start_sqn must be a non-negative int, got {start_sqn!r}"
            raise ValueError(msg)
        if not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            msg = f"checkpoint_id must be a non-negative int, got {checkpoint_id!r}"
            raise ValueError(msg)
        with self._lock:
            self._check_open()
            if start_sqn < self._lowest:
                msg = (
                    f"cannot persist log {self._log_id!r} from SQN {start_sqn}: changes below "
                    f"{self._lowest} were truncated (materialized)"
                )
                raise TruncatedError(msg)
            self._rollover()
            end_sqn = self._active_sqn
            if start_sqn > end_sqn:
                msg = f"start_sqn {start_sqn} is beyond the next SQN {end_sqn} of log {self._log_id!r}"
                raise ValueError(msg)
            in_range = [cs for sqn, cs in self._change_sets.items() if sqn >= start_sqn]
            waiting = {id(cs.pending): cs.pending for cs in in_range if cs.pending is not None}
            to_upload = [cs for cs in in_range if cs.location is None and cs.pending is None]
            upload = self._start_upload(to_upload, checkpoint_id) if to_upload else None
        self._metrics.inc("persists")
        result: Future[ChangelogHandle] = Future()
        dependencies = list(waiting.values()) + ([upload] if upload is not None else [])
        new_bytes = sum(cs.size for cs in to_upload)

        def finish() -> None:
            failure = next((d.exception() for d in dependencies if d.exception() is not None), None)
            if failure is not None:
                self._metrics.inc("persist_failures")
                if isinstance(failure, FencedError):
                    self._mark_fenced()
                result.set_exception(failure)
                return
            try:
                result.set_result(self._handle(start_sqn, end_sqn, in_range, new_bytes, checkpoint_id))
            except BaseException as exc:
                result.set_exception(exc)

        when_all(dependencies, finish)
        return result

    def _start_upload(self, to_upload: list[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        upload: Future[list[Location]] = Future()
        for cs in to_upload:
            cs.pending = upload

        def settle(done: Future[list[Location]]) -> None:
            with self._lock:
                for cs in to_upload:
                    cs.pending = None
                if done.exception() is None:
                    for cs, location in zip(to_upload, done.result(), strict=True):
                        cs.location = location
            if done.exception() is not None:
                upload.set_exception(done.exception())
            else:
                upload.set_result(done.result())

        try:
            inner = self._upload(to_upload, checkpoint_id)
        except BaseException:
            for cs in to_upload:
                cs.pending = None
            raise
        inner.add_done_callback(settle)
        return upload

    def _handle(
        self,
        start_sqn: int,
        end_sqn: int,
        in_range: list[ChangeSet],
        new_bytes: int,
        checkpoint_id: int,
    ) -> ChangelogHandle:
        locations = []
        for cs in in_range:
            if cs.location is None:
                msg = f"change set {cs.sqn} of log {self._log_id!r} has no persisted copy"
                raise TruncatedError(msg)
            locations.append(cs.location)
        return ChangelogHandle.create(
            storage_id=self._storage_id,
            log_id=self._log_id,
            key_groups=self._key_groups,
            sqn_range=SequenceNumberRange(start_sqn, end_sqn),
            epoch=self._epoch,
            size=sum(cs.size for cs in in_range),
            incremental_size=new_bytes,
            checkpoint_id=checkpoint_id,
            locations=locations,
        )

    # -- lifecycle of persisted change sets ---------------------------------------------------
    def truncate(self, before_sqn: int) -> None:
        """Drop change sets below ``before_sqn``."""
        with self._lock:
            self._check_open()
            if before_sqn > self._active_sqn + (1 if self._active_count else 0):
                msg = (
                    f"cannot truncate log {self._log_id!r} before SQN {before_sqn}: "
                    f"the next SQN is {self._active_sqn}"
                )
                raise ValueError(msg)
            if before_sqn > self._active_sqn:
                self._rollover()
            dropped = [self._change_sets.pop(s) for s in [s for s in self._change_sets if s < before_sqn]]
            for cs in dropped:
                self._held_bytes -= self._drop_data(cs)
            self._lowest = max(self._lowest, before_sqn)
            self._released([cs.location for cs in dropped if cs.location is not None])

    def confirm(self, start_sqn: int, end_sqn: int, checkpoint_id: int) -> None:
        """Mark persisted change sets in ``[start, end)`` as owned by a completed checkpoint."""
        with self._lock:
            for sqn, cs in self._change_sets.items():
                if start_sqn <= sqn < end_sqn and cs.location is not None and not cs.confirmed:
                    cs.confirmed = True
                    # A confirmed copy is never uploaded again: the data can go.
                    self._held_bytes -= self._drop_data(cs)

    def reset(self, start_sqn: int, end_sqn: int, checkpoint_id: int) -> None:
        """Forget unconfirmed uploads in ``[start, end)`` so they are uploaded again."""
        with self._lock:
            released = []
            for sqn, cs in self._change_sets.items():
                if start_sqn <= sqn < end_sqn and not cs.confirmed and cs.location is not None:
                    released.append(cs.location)
                    cs.location = None
            self._released(released)

    @staticmethod
    def _drop_data(cs: ChangeSet) -> int:
        held = cs.size if cs.body else 0
        cs.body = b""
        return held

    def truncate_and_close(self, from_sqn: int) -> None:
        """Drop unpersisted change sets at or after ``from_sqn`` and close."""
        with self._lock:
            self._active = bytearray()
            self._active_count = 0
            self._active_bytes = 0
            for sqn in [s for s, cs in self._change_sets.items() if s >= from_sqn and cs.location is None]:
                self._held_bytes -= self._drop_data(self._change_sets.pop(sqn))
        self.close()

    def buffered_bytes(self) -> int:
        """Bytes of change data held in memory."""
        with self._lock:
            return self._held_bytes + self._active_bytes

    def close(self) -> None:
        """Close the writer; idempotent."""
        with self._lock:
            if self._state is WriterState.CLOSED:
                return
            self._state = WriterState.CLOSED
            self._released([cs.location for cs in self._change_sets.values() if cs.location is not None])
            self._change_sets.clear()
            self._active = bytearray()
            self._active_count = 0
            self._active_bytes = 0
            self._held_bytes = 0
        self._storage.writer_closed(self)
