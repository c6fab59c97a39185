"""The writer half of the SPI: one writer per log (operator instance)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future

from .handle import ChangelogHandle
from .types import KeyGroupRange

__all__ = ["StateChangelogWriter"]


class StateChangelogWriter(ABC):
    """Appends state changes of one log and makes them durable on request.

    Invariants every storage keeps:

    - **Change sets.** Changes appended between two boundaries form a change set.
      A boundary is :meth:`next_sqn` (or :meth:`persist`, which closes the open
      change set first). The change set's SQN is the value :meth:`next_sqn`
      returned at the boundary before it; the first change set has
      :meth:`initial_sqn`. A boundary with nothing appended since the last one does
      not advance the SQN.
    - **Ranges are half-open.** ``[start, end)`` everywhere.
    - **persist(start_sqn)** makes every change with SQN >= ``start_sqn`` appended
      so far durable and returns a handle that yields exactly those changes, even
      when they share an object, a segment or a partition with older or foreign
      changes. Change sets persisted earlier are reused, not uploaded again
      (``incremental_size`` counts only what this call uploaded).
    - **Truncation.** After :meth:`truncate` ``(before)``, persisting from a lower SQN
      raises :class:`~dstl.spi.TruncatedError`; handles already returned stay
      readable until they are discarded through the storage.
    - **Fencing.** A writer is created with an ``epoch``. Once a writer for the same
      log is created with a higher epoch, this writer's persists fail with
      :class:`~dstl.spi.FencedError`, and nothing it writes afterwards is ever
      returned by reading the newer writer's handles.
    - **Ownership.** A writer never deletes persisted data by itself; objects are
      deleted by :meth:`StateChangelogStorage.discard` once no checkpoint needs them.
    - A writer is used by one thread at a time (its operator); the storage it came
      from is thread-safe and may batch the persists of many writers.

    **What an engine must call, and what it may leave out.** Every engine creates,
    appends, persists and closes. :meth:`confirm`, :meth:`reset`, :meth:`truncate` and
    :meth:`truncate_and_close` serve a writer that outlives checkpoints (reuse of
    confirmed uploads, memory release after a materialization); an engine whose
    writer lives for one checkpoint (dstl's Spark integration: one per task) leaves
    them out and removes old log data through :meth:`StateChangelogStorage.discard`
    only. A storage must be correct under both; the conformance suite tests both
    (``test_lifecycle.py``).
    """

    @property
    @abstractmethod
    def log_id(self) -> str:
        """Identifier of the log this writer appends to (unique within the job)."""

    @property
    @abstractmethod
    def key_groups(self) -> KeyGroupRange:
        """The key groups this writer accepts."""

    @property
    @abstractmethod
    def epoch(self) -> int:
        """The fencing epoch the writer was created with."""

    @abstractmethod
    def append(self, key_group: int, data: bytes) -> None:
        """Append a change under ``key_group`` to the open change set; not durable yet.

        :raises ValueError: when ``key_group`` is outside :attr:`key_groups`.
        :raises TypeError: when ``data`` is not bytes-like.
        :raises ClosedError: after :meth:`close` or :meth:`truncate_and_close`.
        """

    def append_all(self, key_groups: Sequence[int], data: Sequence[bytes]) -> None:
        """Append ``data[i]`` under ``key_groups[i]``, in order: :meth:`append` for each, in one call.

        The bulk write path (a batch's updates of a state). Storages may override it
        to append faster. A batch refused by the checks below appends none of its
        changes (the kit's writers append none on any error).

        :raises ValueError: when the two sequences differ in length, or a key group is
            outside :attr:`key_groups`.
        :raises TypeError: when a change is not bytes-like.
        :raises ClosedError: after :meth:`close` or :meth:`truncate_and_close`.
        """
        self._refuse_bad_batch(key_groups, data)
        for key_group, change in zip(key_groups, data, strict=True):
            self.append(key_group, change)

    def _refuse_bad_batch(self, key_groups: Sequence[int], data: Sequence[bytes]) -> None:
        """:meth:`append_all`'s checks, made before anything is appended."""
        if len(key_groups) != len(data):
            msg = f"append_all got {len(key_groups)} key groups for {len(data)} changes"
            raise ValueError(msg)
        start, end = self.key_groups.start, self.key_groups.end
        if _plain_batch(key_groups, data, start, end):
            return
        for key_group, change in zip(key_groups, data, strict=True):
            if type(key_group) is not int or not start <= key_group < end:
                msg = (
                    f"key group {key_group!r} is outside this writer's range [{start}, {end}) "
                    f"of log {self.log_id!r}"
                )
                raise ValueError(msg)
            if type(change) is not bytes:
                try:
                    memoryview(change)  # any object with the buffer protocol
                except TypeError:
                    msg = f"state change data must be bytes-like, got {type(change).__name__}"
                    raise TypeError(msg) from None

    @abstractmethod
    def append_meta(self, data: bytes) -> None:
        """Append a metadata record (key group :data:`~dstl.spi.META_KEY_GROUP`)."""

    @abstractmethod
    def initial_sqn(self) -> int:
        """SQN of the first change set this writer produces."""

    @abstractmethod
    def next_sqn(self) -> int:
        """Close the open change set if it has changes; return the SQN of the next one.

        Calling it twice without an append in between returns the same SQN.
        """

    @abstractmethod
    def last_appended_sqn(self) -> int | None:
        """SQN of the change set that received the latest append, or ``None``."""

    @abstractmethod
    def persist(self, start_sqn: int, checkpoint_id: int) -> Future[ChangelogHandle]:
        """Make every change with SQN >= ``start_sqn`` appended so far durable.

        Closes the open change set first (like :meth:`next_sqn`). The future
        completes with a handle whose ``sqn_range`` is ``[start_sqn, next_sqn())``,
        or fails with :class:`~dstl.spi.StorageError` (including
        :class:`~dstl.spi.FencedError`).

        :raises TruncatedError: when ``start_sqn`` is below the truncation point.
        :raises ValueError: when ``start_sqn`` is negative or beyond :meth:`next_sqn`.
        """

    @abstractmethod
    def truncate(self, before_sqn: int) -> None:
        """Drop changes with SQN < ``before_sqn`` from the writer (they are materialized).

        Memory they held is released; later persists below ``before_sqn`` raise
        :class:`~dstl.spi.TruncatedError`. Handles already returned stay readable.
        """

    @abstractmethod
    def confirm(self, start_sqn: int, end_sqn: int, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed with the change sets in ``[start, end)``.

        Their persisted copies now belong to that checkpoint and are reused by later
        persists.
        """

    @abstractmethod
    def reset(self, start_sqn: int, end_sqn: int, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted.

        Change sets in ``[start, end)`` that were persisted but never confirmed are
        uploaded again by the next persist that covers them (the aborted checkpoint's
        handle may be discarded by the caller).
        """

    @abstractmethod
    def truncate_and_close(self, from_sqn: int) -> None:
        """Drop change sets with SQN >= ``from_sqn`` that were not persisted, then close.

        Used when the operator fails over: nothing after ``from_sqn`` will be needed.
        """

    @abstractmethod
    def buffered_bytes(self) -> int:
        """Bytes of change data the writer holds in memory (falls after truncation)."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; idempotent. Appended but unpersisted changes are lost."""


def _plain_batch(key_groups: Sequence[int], data: Sequence[bytes], start: int, end: int) -> bool:
    """Whether every key group is an ``int`` in ``[start, end)`` and every change ``bytes``.

    The common batch, checked in C (``map``, ``min``, ``max``): a Python loop per change
    cost more than appending it. Anything else gets the loop, which names the culprit.
    """
    return (
        bool(key_groups)
        and set(map(type, key_groups)) == {int}
        and set(map(type, data)) == {bytes}
        and start <= min(key_groups)
        and max(key_groups) < end
    )
