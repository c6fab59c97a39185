"""The storage half of the SPI: one instance per job per worker process."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from types import TracebackType

from .handle import ChangelogHandle
from .metrics import StorageMetrics
from .reader import StateChangelogReader
from .types import KeyGroupRange
from .writer import StateChangelogWriter

__all__ = ["StateChangelogStorage"]


class StateChangelogStorage(ABC):
    """Creates writers and readers over one backing store; thread-safe.

    One instance is shared by all writers of a job in a worker process so that
    their persists can be batched (one fsync, one object, one transaction for many
    writers). Use it as a context manager or call :meth:`close`.
    """

    @property
    @abstractmethod
    def identifier(self) -> str:
        """The storage identifier (``dstl.storage`` value) written into handles."""

    @property
    @abstractmethod
    def metrics(self) -> StorageMetrics:
        """Counters and histograms; :data:`~dstl.spi.REQUIRED_COUNTERS` always exist."""

    @abstractmethod
    def create_writer(
        self, operator_id: str, key_groups: KeyGroupRange, *, epoch: int = 0
    ) -> StateChangelogWriter:
        """Create the writer of the log of ``operator_id`` over ``key_groups``.

        Creating a writer with a higher ``epoch`` than an existing writer of the
        same log fences the older one (see :class:`StateChangelogWriter`).

        :raises FencedError: when a writer with a higher epoch already exists.
        :raises InvalidIdentifierError: when ``operator_id`` is not a safe name.
        """

    @abstractmethod
    def create_reader(self) -> StateChangelogReader:
        """Create a reader for handles of this storage."""

    @abstractmethod
    def discard(self, handles: Iterable[ChangelogHandle]) -> None:
        """Delete the stored objects the handles refer to.

        Objects are shared between handles (a persist reuses earlier uploads, and
        one object may hold many logs), so the caller — a checkpoint's shared-state
        registry — passes only handles none of whose objects is still referenced by
        a live checkpoint. Storages that pack several logs into one object delete it
        once every change set in it was discarded.
        """

    def bind_job(self, owner: str) -> None:
        """Bind this storage's data of the job to ``owner`` (the job's checkpoint location), once.

        Two jobs on one storage with the same job id would read, discard and collect
        each other's data. The first call records ``owner``; a later call with
        another owner is refused. Storages without a place to record it accept
        every owner (the default).

        :raises JobConflictError: when the job id is bound to another owner.
        """
        return

    @property
    def longest_upload(self) -> float:
        """Seconds an upload may legitimately take from its start to its acknowledgment.

        Orphan collection must never be asked for a grace shorter than this (the
        checkpoint coordinator refuses one): data younger than it may belong to a
        persist still in flight.
        """
        return 0.0

    def collect_orphans(self, live: Iterable[ChangelogHandle], *, older_than: float) -> int:
        """Delete this job's change data that no ``live`` handle needs and that is older than ``older_than``.

        Attempts that failed, were fenced or whose checkpoint never completed leave
        change data no checkpoint references; nobody will ever discard it. The
        checkpoint coordinator calls this on recovery and periodically, passing the
        handles of every retained checkpoint and a cutoff (a :func:`time.time`
        value) older than any attempt still in flight: data written after the cutoff
        is never touched, so a checkpoint still being completed loses nothing.
        ``time.time() - older_than`` is the grace the caller asks for; a storage whose
        objects are dated by another clock (an object store's) measures that grace
        in its own clock, never by a writer's.

        Storages that can do it declare the ``orphan_collection`` capability; the
        default collects nothing.

        :returns: the number of objects (segments, files) deleted.
        """
        return 0

    def available(self) -> bool:
        """Whether a persist can start without blocking (back-pressure signal)."""
        return True

    @abstractmethod
    def close(self) -> None:
        """Close writers and readers and release resources; idempotent."""

    def __enter__(self) -> StateChangelogStorage:
        """Return the storage itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the storage."""
        self.close()
