"""A storage base for storages built on :class:`~dstl.spi.kit.ChangeSetWriter`.

It keeps the parts every such storage shares: job id, metrics, the closed guard,
epoch validation, log ids, and tracking of open writers. A storage implements
:meth:`ChangeSetStorage._claim_log` (fencing) and :meth:`ChangeSetStorage._make_writer`.
"""

from __future__ import annotations

import logging
import math
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ClosedError, JobConflictError, ReadOnlyError, StorageError
from ..handle import ChangelogHandle
from ..metrics import StorageMetrics
from ..names import log_id_for, validate_name
from ..storage import StateChangelogStorage
from ..types import KeyGroupRange
from .changeset_format import ChangeSetIdentity
from .changeset_writer import ChangeSetWriter

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["ChangeSetStorage", "storage_settings"]

log = logging.getLogger(__name__)


class ChangeSetStorage(StateChangelogStorage):
    """Writer bookkeeping shared by the built-in storages; thread-safe.

    :cvar preemptive_threshold: open change-set bytes at which a writer uploads ahead
        of the next persist (storages with slow uploads lower it; none by default).
    :ivar change_set_codec: how writers compress the change sets they store
        (``dstl.changelog.compression``).
    """

    preemptive_threshold: float = math.inf

    def __init__(self, job_id: str, *, codec: str = "none", read_only: bool = False) -> None:
        self.job_id = validate_name(job_id, "job id")
        self.change_set_codec = codec
        #: Opened only to read handles (``dstl.read-only``): nothing is created, writes are refused.
        self.read_only = read_only
        self._metrics = StorageMetrics()
        self._lock = threading.Lock()
        self._writers: set[ChangeSetWriter] = set()
        self._closed = False

    @property
    def metrics(self) -> StorageMetrics:
        """The storage's counters and histograms."""
        return self._metrics

    @abstractmethod
    def _claim_log(self, log_id: str, epoch: int) -> str:
        """Make the caller the owner of ``log_id`` at ``epoch``; returns an owner token.

        :raises FencedError: when a writer with a higher epoch owns the log.
        """

    @abstractmethod
    def _make_writer(self, log_id: str, key_groups: KeyGroupRange, epoch: int, token: str) -> ChangeSetWriter:
        """Build the writer (it tells :meth:`writer_closed` when it closes)."""

    def bind_job(self, owner: str) -> None:
        """Record ``owner`` as the job's, or refuse when another owner was recorded first.

        :raises JobConflictError: naming both owners.
        """
        self._check_writable()
        recorded = self._record_owner(owner)
        if recorded != owner:
            raise JobConflictError(self.job_id, recorded, owner)

    def _record_owner(self, owner: str) -> str:
        """Create the job's owner record holding ``owner`` unless one exists; returns the recorded owner.

        The creation must be exclusive (two jobs starting at once: one wins). The
        default records nothing and accepts every owner.
        """
        return owner

    def check_open(self) -> None:
        """Raise :class:`ClosedError` once the storage is closed."""
        if self._closed:
            msg = f"{self.identifier} storage is closed"
            raise ClosedError(msg)

    def collect_orphans(self, live: Iterable[ChangelogHandle], *, older_than: float) -> int:
        """Collect nothing (storages with the ``orphan_collection`` capability override this).

        :raises ReadOnlyError: on a storage opened read only, like every deletion.
        """
        self._check_writable()
        return 0

    def _may_discard(
        self,
        identity: Callable[[], ChangeSetIdentity],
        handle: ChangelogHandle,
        location: Mapping[str, object],
        *,
        where: str,
        offset: int,
    ) -> bool:
        """Whether a discard by ``handle`` may free the change set at ``offset`` of ``where``.

        Only when the change set's header (``identity()``, read lazily) names the
        handle's log, epoch and the location's SQN: a forged or damaged handle must
        never free another log's data. A refusal is logged and counted
        (``refused_discards``); so is a header that cannot be read.
        """
        try:
            reason = identity().differs_from(handle.log_id, handle.epoch, location.get("sqn"))
        except (OSError, StorageError) as exc:
            reason = str(exc)
        if reason is None:
            return True
        log.warning(
            "ignoring the discard of %s offset %d by a handle of log %r: %s (a damaged or forged handle)",
            where,
            offset,
            handle.log_id,
            reason,
        )
        self._metrics.inc("refused_discards")
        return False

    def _check_writable(self) -> None:
        """Refuse what would write or delete, on a storage opened read only."""
        self.check_open()
        if self.read_only:
            msg = (
                f"{self.identifier} storage of job {self.job_id!r} is open read only (dstl.read-only): it "
                "reads handles, and writes, discards or collects nothing"
            )
            raise ReadOnlyError(msg)

    def create_writer(
        self, operator_id: str, key_groups: KeyGroupRange, *, epoch: int = 0
    ) -> ChangeSetWriter:
        """Create the writer of ``operator_id``'s log over ``key_groups``; fences lower epochs."""
        self._check_writable()
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            msg = f"epoch must be a non-negative int, got {epoch!r}"
            raise ValueError(msg)
        log_id = log_id_for(operator_id, key_groups)
        token = self._claim_log(log_id, epoch)
        writer = self._make_writer(log_id, key_groups, epoch, token)
        with self._lock:
            self._writers.add(writer)
        return writer

    def writer_closed(self, writer: ChangeSetWriter) -> None:
        """``writer`` closed: it no longer holds the storage open."""
        with self._lock:
            self._writers.discard(writer)

    def close(self) -> None:
        """Close every open writer, then :meth:`_close_resources`; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writers = list(self._writers)
        for writer in writers:
            writer.close()
        self._close_resources()

    def _close_resources(self) -> None:
        """Release what the storage holds once its writers are closed."""


def storage_settings(config: Config) -> dict[str, Any]:
    """What every storage reads the same way: ``codec`` and ``read_only`` of :class:`ChangeSetStorage`."""
    from ..core_options import COMPRESSION_OPTION, READ_ONLY_OPTION  # it declares the codecs of this kit

    return {"codec": config.get(COMPRESSION_OPTION), "read_only": config.get(READ_ONLY_OPTION)}
