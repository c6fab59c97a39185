"""A completed checkpoint: ``chk-N.json`` (every instance's snapshot, the clocks), read as untrusted."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dstl.spi import (
    InvalidHandleError,
)

from ..changelog import BackendSnapshot
from ..documents import check_fields, list_directory, load_document, read_regular_file

__all__ = [
    "CHECKPOINT_FILE_PREFIX",
    "CHECKPOINT_FILE_SUFFIX",
    "CompletedCheckpoint",
    "TimeProgress",
    "read_checkpoints",
]

CHECKPOINT_FILE_PREFIX = "chk-"
CHECKPOINT_FILE_SUFFIX = ".json"
_PREFIX, _SUFFIX = CHECKPOINT_FILE_PREFIX, CHECKPOINT_FILE_SUFFIX
#: Version of the checkpoint document this dstl writes and reads.
CHECKPOINT_VERSION = 1
#: Longest operator-instance name a checkpoint document may hold.
_MAX_NAME = 200
_MAX_TIME_MS = 1 << 62  # epoch milliseconds a document may carry (either sign)


@dataclass(frozen=True)
class TimeProgress:
    """Where an operator's clocks stood at a checkpoint: restored with it, like its state.

    :ivar watermark_ms: the event-time watermark the next batch uses (``None``: no event time).
    :ivar late_watermark_ms: the watermark the next batch judges late rows by: Spark's rule,
        the one the batch before it used (``None``: as ``watermark_ms``, checkpoints before it).
    :ivar next_timers: per operator instance, its earliest registered timer (epoch ms);
        instances without timers are left out. The driver runs an instance whose
        timer is due even when the batch has no rows for it.
    """

    watermark_ms: int | None = None
    next_timers: Mapping[str, int] = field(default_factory=dict)
    late_watermark_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The document form."""
        return {
            "watermark_ms": self.watermark_ms,
            "next_timers": dict(sorted(self.next_timers.items())),
            "late_watermark_ms": self.late_watermark_ms,
        }

    @classmethod
    def from_dict(cls, doc: Any, source: str) -> TimeProgress:
        """Parse and validate (untrusted).

        :raises InvalidHandleError: naming ``source`` and the field.
        """
        fields: dict[str, type | tuple[type, ...]] = {"watermark_ms": (int, type(None)), "next_timers": dict}
        doc = check_fields(doc, f"{source} field 'time'", fields)
        watermark = doc["watermark_ms"]
        late = doc.get("late_watermark_ms")  # optional: older checkpoints judged late rows by watermark_ms
        timers = doc["next_timers"]
        bad = [
            name
            for name, expiry in timers.items()
            if not name or len(name) > _MAX_NAME or type(expiry) is not int or abs(expiry) > _MAX_TIME_MS
        ]
        out_of_range = [
            mark
            for mark in (watermark, late)
            if mark is not None and (type(mark) is not int or abs(mark) > _MAX_TIME_MS)
        ]
        if out_of_range or bad:
            msg = (
                f"{source} field 'time' holds a watermark or timers out of range (instances {bad[:3]}): "
                f"epoch milliseconds within +-2^62 by instance names of 1 to {_MAX_NAME} characters"
            )
            raise InvalidHandleError(msg)
        return cls(watermark, dict(timers), late)


@dataclass(frozen=True)
class CompletedCheckpoint:
    """Checkpoint ``checkpoint_id``: a snapshot per operator instance (keyed by a name)."""

    checkpoint_id: int
    snapshots: Mapping[str, BackendSnapshot]
    time: TimeProgress = field(default_factory=TimeProgress)

    def to_json(self) -> str:
        """The metadata document."""
        return json.dumps(
            {
                "version": CHECKPOINT_VERSION,
                "checkpoint_id": self.checkpoint_id,
                "snapshots": {name: s.to_dict() for name, s in sorted(self.snapshots.items())},
                "time": self.time.to_dict(),
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "checkpoint metadata") -> CompletedCheckpoint:
        """Parse and validate (metadata is read back from shared storage: untrusted).

        :raises InvalidHandleError: naming ``source`` and the field.
        """
        doc = load_document(text, source, {"version": int, "checkpoint_id": int, "snapshots": dict})
        if doc["version"] != CHECKPOINT_VERSION:
            msg = (
                f"{source} has version {doc['version']}; this dstl reads version {CHECKPOINT_VERSION} "
                "(upgrade dstl to read checkpoints written by a newer one)"
            )
            raise InvalidHandleError(msg)
        checkpoint_id = doc["checkpoint_id"]
        if checkpoint_id < 0:
            msg = f"{source} field 'checkpoint_id' must be non-negative, got {checkpoint_id}"
            raise InvalidHandleError(msg)
        snapshots = {}
        for name, snapshot in doc["snapshots"].items():
            if not name or len(name) > _MAX_NAME:
                msg = f"{source} has an instance name of {len(name)} characters (1 to {_MAX_NAME})"
                raise InvalidHandleError(msg)
            try:
                snapshots[name] = BackendSnapshot.from_dict(snapshot)
            except InvalidHandleError as exc:
                msg = f"{source}, instance {name!r:.60}: {exc}"
                raise InvalidHandleError(msg) from exc
        time_doc = doc.get("time")  # absent in documents of earlier releases
        progress = TimeProgress() if time_doc is None else TimeProgress.from_dict(time_doc, source)
        return cls(checkpoint_id, snapshots, progress)

    def shared_keys(self) -> set[tuple[Any, ...]]:
        """Every log location and snapshot this checkpoint references."""
        keys: set[tuple[Any, ...]] = set()
        for snapshot in self.snapshots.values():
            for handle in snapshot.all_handles:
                for location in handle.locations:
                    keys.add(("log", handle.storage_id, handle.log_id, handle.epoch, location))
            for ref in snapshot.references:
                keys.add(("snapshot", ref.path))
        return keys


def read_checkpoints(fs: Any, directory: str) -> tuple[list[CompletedCheckpoint], list[tuple[int, str, str]]]:
    """The checkpoint documents in ``directory`` (read only), oldest first, and the damaged ones.

    A damaged one is ``(id from its file name, path, reason)``: unreadable, invalid,
    or naming another checkpoint than its file name does.
    """
    documents: list[CompletedCheckpoint] = []
    damaged: list[tuple[int, str, str]] = []
    for path in list_directory(fs, directory):
        name = path.rsplit("/", 1)[-1]
        if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
            continue
        digits = name[len(_PREFIX) : -len(_SUFFIX)]
        named_id = int(digits) if digits.isascii() and digits.isdigit() else -1
        try:
            text = read_regular_file(fs, path, f"checkpoint {path}")
            completed = CompletedCheckpoint.from_json(text, source=f"checkpoint {path}")
        except (InvalidHandleError, OSError) as exc:
            damaged.append((named_id, path, str(exc)))
            continue
        if completed.checkpoint_id != named_id:
            reason = f"it says it is checkpoint {completed.checkpoint_id}, its name says {digits}"
            damaged.append((named_id, path, reason))
            continue
        documents.append(completed)
    documents.sort(key=lambda c: c.checkpoint_id)
    return documents, damaged
