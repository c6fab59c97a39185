"""Per-batch figures of a stateful query: what the caller sees, listeners get and the log shows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from dstl.spi import InvalidHandleError

from ..documents import parse_json
from ._private.protocol import InstanceStats, Restore

__all__ = ["BatchProgress"]


@dataclass(frozen=True)
class BatchProgress:
    """One micro-batch: input, state work, and what its checkpoint cost and holds.

    :ivar checkpoint_ms: the slowest instance's checkpoint (persist) duration.
    :ivar restore_ms: the slowest instance's restore (0 on the warm path).
    :ivar persisted_bytes: bytes uploaded for this checkpoint (log + new snapshots).
    :ivar full_checkpoint_bytes: bytes a restore of this checkpoint reads (every instance).
    :ivar warm_instances: instances that continued from their working copy.
    :ivar caught_up: instances whose working copy was behind (they ran elsewhere) and
        replayed only the log and incremental snapshots since.
    :ivar full_restores: instances that rebuilt their state from the snapshots and log.
    :ivar restored_bytes: what the caught-up and fully restored instances read.
    :ivar materialized: instances that materialized their state in this batch.
    :ivar timers_fired: timers whose handler ran in this batch.
    :ivar woken_instances: instances that ran without rows, because a timer was due.
    :ivar late_rows: rows dropped as late (event time at or below the watermark).
    :ivar watermark_ms: the event-time watermark the batch used (``None``: no event time).
    :ivar expired_removed: values, elements and map entries TTL removed from the working state.
    :ivar storage: what the executors' storages did for the batch: counters summed over
        the instances (persists, uploads, uploaded_bytes, persist_failures...), the
        slowest instance's ``upload_latency_p99_s`` and the largest ``gauge.*``.
    """

    batch_id: int
    rows: int
    keys_touched: int
    instances: int
    warm_instances: int
    caught_up: int
    full_restores: int
    restored_bytes: int
    materialized: tuple[str, ...]
    #: instances whose checkpoint moved onto a snapshot an earlier batch wrote in the background
    rebased: tuple[str, ...]
    restore_ms: float
    checkpoint_ms: float
    materialization_ms: float
    persisted_bytes: int
    full_checkpoint_bytes: int
    batch_ms: float
    #: driver time per phase (plan, tasks: the instances and the reports, sink, complete), ms
    phases_ms: dict[str, float] = field(default_factory=dict)
    #: the slowest instance's task time per phase (decode, bring up, group, process, checkpoint, encode), ms
    task_phases_ms: dict[str, float] = field(default_factory=dict)
    timers_fired: int = 0
    woken_instances: int = 0
    late_rows: int = 0
    watermark_ms: int | None = None
    expired_removed: int = 0
    storage: dict[str, float] = field(default_factory=dict)
    #: rows the batch wrote to the sink
    output_rows: int = 0
    #: changes the batch wrote and removed, over its instances
    rows_updated: int = 0
    rows_removed: int = 0
    #: rows and bytes of every instance's working state, as each reported last (this run)
    state_rows: int = 0
    memory_bytes: int = 0

    @classmethod
    def from_instances(
        cls,
        batch_id: int,
        stats: list[InstanceStats],
        full_checkpoint_bytes: int,
        batch_ms: float,
        phases_ms: dict[str, float] | None = None,
        watermark_ms: int | None = None,
        working_state: tuple[int, int] = (0, 0),
    ) -> BatchProgress:
        """Aggregate the figures the instances reported.

        :param working_state: ``(rows, bytes)`` of every instance's working state,
            the instances without a task in this batch included.
        """
        return cls(
            batch_id=batch_id,
            rows=sum(s.rows for s in stats),
            keys_touched=sum(s.keys for s in stats),
            instances=len(stats),
            warm_instances=sum(1 for s in stats if s.restore.warm),
            caught_up=sum(1 for s in stats if s.restore is Restore.CAUGHT_UP),
            full_restores=sum(1 for s in stats if s.restore is Restore.FULL),
            restored_bytes=sum(s.restored_bytes for s in stats),
            materialized=tuple(s.instance for s in stats if s.materialized),
            rebased=tuple(s.instance for s in stats if s.restore is Restore.REBASED),
            restore_ms=max((s.restore_ms for s in stats), default=0.0),
            checkpoint_ms=max((s.checkpoint_ms for s in stats), default=0.0),
            materialization_ms=max((s.materialization_ms for s in stats), default=0.0),
            persisted_bytes=sum(s.persisted_bytes for s in stats),
            full_checkpoint_bytes=full_checkpoint_bytes,
            batch_ms=round(batch_ms, 3),
            phases_ms=dict(phases_ms or {}),
            task_phases_ms=max(
                (s.phases_ms for s in stats), key=lambda phases: sum(phases.values()), default={}
            ),
            timers_fired=sum(s.timers_fired for s in stats),
            woken_instances=sum(1 for s in stats if not s.rows),
            late_rows=sum(s.late_rows for s in stats),
            watermark_ms=watermark_ms,
            expired_removed=sum(s.expired_removed for s in stats),
            storage=_storage_totals(s.storage for s in stats),
            output_rows=sum(s.output_rows for s in stats),
            rows_updated=sum(s.rows_updated for s in stats),
            rows_removed=sum(s.rows_removed for s in stats),
            state_rows=working_state[0],
            memory_bytes=working_state[1],
        )

    def to_json(self) -> str:
        """For logs and progress files."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "batch progress") -> BatchProgress:
        """Decode :meth:`to_json`'s document, read back from shared storage (untrusted).

        :raises InvalidHandleError: naming ``source`` and the field that does not fit.
        """
        doc = parse_json(text, source)
        if not isinstance(doc, dict):
            msg = f"{source} is not a JSON object"
            raise InvalidHandleError(msg)
        known = {item.name: item for item in fields(cls)}
        unknown = sorted(set(doc) - set(known))
        missing = sorted(name for name, item in known.items() if _required(item) and name not in doc)
        if unknown or missing:
            msg = f"{source} has unknown fields {unknown} or lacks {missing}: was it written by another dstl?"
            raise InvalidHandleError(msg)
        kinds = {name: str(item.type) for name, item in known.items()}
        values = {name: _field_value(value, kinds[name], f"{source} {name!r}") for name, value in doc.items()}
        return cls(**values)


def _required(item: Any) -> bool:
    return item.default is MISSING and item.default_factory is MISSING


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _field_value(value: Any, kind: str, what: str) -> Any:
    """``value`` as the field of type ``kind`` (its annotation) holds it, or a named error."""
    fits = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "int | None": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
        "float": _is_number,
        "tuple[str, ...]": lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v),
        "dict[str, float]": lambda v: isinstance(v, dict) and all(_is_number(item) for item in v.values()),
    }[kind]
    if not fits(value):
        msg = f"{what} is {value!r:.60}, not {kind}"
        raise InvalidHandleError(msg)
    return tuple(value) if kind.startswith("tuple") else value


def _storage_totals(per_instance: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Counters summed; latencies and gauges (levels, not amounts) at their largest."""
    totals: dict[str, float] = {}
    for figures in per_instance:
        for name, value in figures.items():
            if name.startswith("gauge.") or name.endswith("_p99_s"):
                totals[name] = max(totals.get(name, value), value)
            else:
                totals[name] = totals.get(name, 0) + value
    return totals
