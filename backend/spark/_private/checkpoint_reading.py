"""Opening a query's retained state checkpoints for the readers (read only)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstl.spi import ChangelogHandle, Config, InvalidHandleError

from ...changelog import BackendSnapshot
from ...checkpoints import CheckpointLocation, instance_key_groups, restored_read_only
from ...tools import state_entries

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ...checkpoints import CompletedCheckpoint

__all__ = ["InstanceEntries", "all_handles", "logged_handles", "opened", "retained"]


def opened(
    spark: SparkSession, checkpoint_location: str, config: Mapping[str, Any] | None, job_id: str | None
) -> tuple[CheckpointLocation, list[CompletedCheckpoint], Config]:
    """The location, its retained checkpoints (oldest first) and the job's config.

    :raises InvalidHandleError: when no checkpoint of the job is readable there.
    """
    from .call_checks import job_config
    from .sessions import require_classic, spark_conf

    require_classic(spark, "reading a state checkpoint into a DataFrame")
    raw = job_config(spark_conf(spark), config, checkpoint_location).raw()
    location = CheckpointLocation(checkpoint_location, job_id, raw)
    documents, _ = location.checkpoints()
    if not documents:
        msg = f"{checkpoint_location} has no readable state checkpoint of job {location.job!r}"
        raise InvalidHandleError(msg)
    return location, documents, location.config(raw)


def retained(documents: list[CompletedCheckpoint], batch_id: int) -> CompletedCheckpoint:
    """Checkpoint ``batch_id``.

    :raises InvalidHandleError: when it is not retained.
    """
    for completed in documents:
        if completed.checkpoint_id == batch_id:
            return completed
    msg = f"checkpoint {batch_id} is not retained (retained: {[c.checkpoint_id for c in documents]})"
    raise InvalidHandleError(msg)


def all_handles(snapshot: BackendSnapshot) -> Iterator[ChangelogHandle]:
    """Every log handle a snapshot references (its parts' too)."""
    yield from snapshot.handles
    for _, part in snapshot.parts:
        yield from all_handles(part)


def logged_handles(
    documents: list[CompletedCheckpoint], from_batch: int, to_batch: int | None, where: str
) -> list[ChangelogHandle]:
    """The log handles of batches ``from_batch`` to ``to_batch`` (inclusive; default: the newest).

    :raises InvalidHandleError: when ``from_batch`` has no retained log (the log before
        the last materialization is truncated).
    """
    last = documents[-1].checkpoint_id if to_batch is None else to_batch
    handles: dict[tuple[Any, ...], ChangelogHandle] = {}  # by what each reads: carried over, once
    logged: set[int] = set()
    for completed in documents:
        for snapshot in completed.snapshots.values():
            for handle in all_handles(snapshot):
                if handle.checkpoint_id is None:
                    continue
                logged.add(handle.checkpoint_id)
                if from_batch <= handle.checkpoint_id <= last:
                    handles.setdefault(handle.reads, handle)
    with_log = sorted(logged)
    if not with_log or from_batch < with_log[0]:
        msg = (
            f"batch {from_batch} has no retained log: the log before the last materialization is "
            f"truncated (batches with a log: {with_log[0]}..{with_log[-1]})"
            if with_log
            else f"no retained checkpoint of {where} references a log"
        )
        raise InvalidHandleError(msg)
    return sorted(handles.values(), key=ChangelogHandle.to_json)


@dataclass(frozen=True)
class InstanceEntries:
    """Restores an operator instance read only (on an executor) and yields its state entries.

    Sent with the readers' tasks: the job's config and where its snapshots are.
    """

    config: dict[str, Any]
    max_parallelism: int
    snapshot_dir: str
    job_id: str

    def of(
        self, name: str, snapshot_json: str, *, internal: bool = False, allow_pickle: bool = False
    ) -> Iterator[tuple[Any, str, str, Any]]:
        """``(key, state, kind, value)`` of instance ``name`` restored from its snapshot (JSON)."""
        snapshot = BackendSnapshot.from_json(snapshot_json)
        with restored_read_only(
            snapshot,
            instance_key_groups(name, snapshot),
            self.config,
            max_parallelism=self.max_parallelism,
            snapshot_dir=self.snapshot_dir,
            job_id=self.job_id,
            allow_pickle=allow_pickle,
        ) as backend:
            yield from state_entries(backend, internal=internal)
