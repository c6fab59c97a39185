"""The messages between the driver and an instance's task: a typed plan down, a typed report up.

Each is encoded once per hop (JSON): the driver encodes each instance's plan once
and a task decodes only its own; a task encodes its report once, with its
snapshot's document, and the driver decodes it once.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dstl.spi import InvalidHandleError

from ...changelog import BackendSnapshot
from ...documents import check_fields, parse_json
from ..processor import BatchClock

__all__ = ["InstancePlan", "InstanceReport", "InstanceStats", "Restore", "TaskPlan"]


class Restore(enum.StrEnum):
    """How a task brought its instance's working copy to the base checkpoint (one decision)."""

    FRESH = "fresh"  # no state yet
    WARM = "warm"  # the copy was at the base already
    REBASED = "rebased"  # warm, and the checkpoint moved onto a snapshot written in the background
    CAUGHT_UP = "caught_up"  # the copy was at an earlier committed checkpoint: only the difference was read
    FULL = "full"  # restored from snapshots and log

    @property
    def warm(self) -> bool:
        """Nothing was read."""
        return self in (Restore.WARM, Restore.REBASED)


_RESTORES = frozenset(item.value for item in Restore)


#: the longest a task waits for background work it finishes (``InstancePlan.finish_in_task``)
FINISH_IN_TASK_WAIT_S = 900.0


@dataclass(frozen=True)
class InstancePlan:
    """What the driver sends one instance for one batch.

    :ivar base: the instance's own base snapshot (scoped to its key groups on the driver).
    :ivar lineage: digests of its snapshots in recent completed checkpoints: a working
        copy stamped with one of them holds committed state and may catch up from it.
    :ivar materialize: materialize its state in this batch.
    :ivar wake: it runs even without rows (one of its timers is due).
    :ivar finish_in_task: its worker may be stopped as idle before its next batch: the
        task finishes its background work (its snapshot, its executor's standby copies'
        refresh), waiting at most :data:`FINISH_IN_TASK_WAIT_S`.
    """

    base: BackendSnapshot | None = None
    lineage: tuple[str, ...] = ()
    materialize: bool = False
    wake: bool = False
    finish_in_task: bool = False

    def to_json(self) -> str:
        """The plan as shipped (its base snapshot serialized here, once)."""
        return json.dumps(
            {
                "base": None if self.base is None else self.base.to_dict(),
                "lineage": list(self.lineage),
                "materialize": self.materialize,
                "wake": self.wake,
                "finish_in_task": self.finish_in_task,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> InstancePlan:
        """Decode a plan the driver encoded."""
        doc = check_fields(parse_json(text, "instance plan"), "instance plan", {"lineage": list})
        base = doc.get("base")
        return cls(
            None if base is None else BackendSnapshot.from_dict(base),
            tuple(str(digest) for digest in doc["lineage"]),
            bool(doc.get("materialize")),
            bool(doc.get("wake")),
            bool(doc.get("finish_in_task")),
        )


@dataclass(frozen=True)
class InstanceStats:
    """What one instance's task did in a batch (aggregated by :class:`~..progress.BatchProgress`)."""

    instance: str
    rows: int
    keys: int
    restore: Restore
    restored_bytes: int = 0
    materialized: bool = False
    restore_ms: float = 0.0
    checkpoint_ms: float = 0.0
    #: what starting a background materialization cost the task
    materialization_ms: float = 0.0
    expired_removed: int = 0
    persisted_bytes: int = 0
    phases_ms: dict[str, float] = field(default_factory=dict)
    timers_fired: int = 0
    next_timer: int | None = None
    #: the largest event time seen (late rows count, as in Spark); ``None`` without event time
    max_event_ms: int | None = None
    late_rows: int = 0
    #: rows the task returned to the sink
    output_rows: int = 0
    #: rows the instance's working state holds after the batch (Spark's ``numRowsTotal``)
    state_rows: int = 0
    #: changes the batch wrote and removed (Spark's ``numRowsUpdated``/``numRowsRemoved``)
    rows_updated: int = 0
    rows_removed: int = 0
    #: bytes of the working state (LMDB), or the worker's anonymous resident memory (heap)
    memory_bytes: int = 0
    #: the storage's work during the task (see ``storage_figures``)
    storage: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        doc = asdict(self)
        doc["restore"] = self.restore.value
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> InstanceStats:
        """Decode :meth:`to_dict`'s document."""
        doc = check_fields(doc, "instance stats", {"instance": str, "rows": int, "keys": int, "restore": str})
        unknown = set(doc) - {item.name for item in fields(cls)}
        if unknown or doc["restore"] not in _RESTORES:
            msg = f"instance stats carry unknown fields {sorted(unknown)} or restore {doc['restore']!r:.40}"
            raise InvalidHandleError(msg)
        return cls(**{**doc, "restore": Restore(doc["restore"])})


@dataclass(frozen=True)
class InstanceReport:
    """What an instance's task sends back: its new snapshot and its figures."""

    snapshot: BackendSnapshot
    stats: InstanceStats

    @property
    def name(self) -> str:
        """The instance."""
        return self.stats.instance

    def to_json(self) -> str:
        """The report as shipped (the snapshot's document is the one its digest was taken of)."""
        return json.dumps({"snapshot": self.snapshot.to_dict(), "stats": self.stats.to_dict()})

    @classmethod
    def from_json(cls, text: str) -> InstanceReport:
        """Decode a task's report."""
        doc = check_fields(parse_json(text, "instance report"), "instance report", {"stats": dict})
        return cls(BackendSnapshot.from_dict(doc.get("snapshot")), InstanceStats.from_dict(doc["stats"]))


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one micro-batch needs (built on the driver, shipped to executors).

    :ivar instances: instance index -> its :class:`InstancePlan`, encoded once on the
        driver; a task decodes only its own. An instance not listed has no state yet.
    """

    config: dict[str, Any]
    job_id: str
    operator_id: str
    key_columns: tuple[str, ...]
    output_columns: tuple[str, ...]
    parallelism: int
    max_parallelism: int
    batch_id: int
    run_id: int
    working_dir: str
    instances: dict[int, str] = field(default_factory=dict)
    #: the output schema in Spark's JSON form: every task checks its rows against it
    output_schema: str = ""
    #: instances that run even without rows: one of their timers is due
    wake: frozenset[int] = frozenset()
    #: each instance keeps its output for a replay (:mod:`.kept_output`): the sink's actions
    #: run the tasks, rather than read a checkpointed result
    keep_output: bool = False
    #: per instance, the instances whose standby copies its executor keeps (:mod:`.standby`)
    standbys: dict[int, tuple[int, ...]] = field(default_factory=dict)
    clock: BatchClock = field(default_factory=lambda: BatchClock(int(time.time() * 1000)))
    #: unique to this plan (one batch of one driver run): another query of the job, a
    #: restarted one, or one whose checkpoint location was recreated never shares it
    batch_token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def instance(self, index: int) -> InstancePlan:
        """Instance ``index``'s own plan."""
        encoded = self.instances.get(index)
        return InstancePlan() if encoded is None else InstancePlan.from_json(encoded)
