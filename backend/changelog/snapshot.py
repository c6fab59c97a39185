"""The checkpoint of one backend: its snapshot chain and the log after it, as a JSON document."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dstl.spi import ChangelogHandle, InvalidHandleError, KeyGroupRange

from ..documents import check_fields, parse_json
from ..materialization import MaterializationRef

__all__ = ["BackendSnapshot", "encode_snapshot"]

_MAX_PART_DEPTH = 16  # parts of parts: one level per rescale an instance did not materialize across


@dataclass(frozen=True)
class BackendSnapshot:
    """A checkpoint of one backend: snapshots plus the changelog after them (JSON, never pickle).

    :ivar parts: after rescaling, until the instance's first full snapshot: the
        snapshots it was restored from, each with the key groups its instance owned.
        A restore takes each part for those key groups only (a part of a rescaled
        instance carries history of key groups it never owned), before ``handles``.
    """

    checkpoint_id: int
    handles: tuple[ChangelogHandle, ...]
    materialized: tuple[MaterializationRef, ...] = ()
    #: The previous snapshot chain plus an incremental at ``materialized[0]``'s SQN: what a
    #: working copy of the previous chain loads instead of the full ``materialized[0]``.
    bridge: tuple[MaterializationRef, ...] = ()
    parts: tuple[tuple[KeyGroupRange, BackendSnapshot], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (see :meth:`from_dict`), built once per snapshot: do not change it."""
        return self._document

    @functools.cached_property
    def _document(self) -> dict[str, Any]:
        return encode_snapshot(self)

    def to_json(self) -> str:
        """Serialise for the checkpoint metadata."""
        return json.dumps(self.to_dict())

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 of the canonical document: equal for snapshots equal after a JSON round trip."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def references(self) -> tuple[MaterializationRef, ...]:
        """Every snapshot object this checkpoint keeps alive (its chain and bridge, its parts')."""
        return (*self.materialized, *self.bridge, *(ref for _, part in self.parts for ref in part.references))

    @property
    def all_handles(self) -> tuple[ChangelogHandle, ...]:
        """Every log handle this checkpoint reads, its parts' included."""
        return (*(h for _, part in self.parts for h in part.all_handles), *self.handles)

    @property
    def all_materialized(self) -> tuple[MaterializationRef, ...]:
        """Every snapshot a restore loads, its parts' included."""
        return (*(ref for _, part in self.parts for ref in part.all_materialized), *self.materialized)

    @classmethod
    def from_json(cls, text: str | bytes) -> BackendSnapshot:
        """Parse and validate (untrusted input)."""
        return cls.from_dict(parse_json(text, "backend snapshot"))

    @classmethod
    def from_dict(cls, doc: Any, _depth: int = 0) -> BackendSnapshot:
        """Validate an already parsed document (e.g. inside a checkpoint).

        :raises InvalidHandleError: naming the field.
        """
        doc = check_fields(doc, "backend snapshot", {"checkpoint_id": int, "handles": list})
        if doc["checkpoint_id"] < 0:
            msg = f"backend snapshot field 'checkpoint_id' must be non-negative, got {doc['checkpoint_id']}"
            raise InvalidHandleError(msg)
        refs = {}
        for field in ("materialized", "bridge"):
            value = doc.get(field, [])
            if not isinstance(value, list):
                msg = f"backend snapshot field {field!r} must be a list"
                raise InvalidHandleError(msg)
            refs[field] = tuple(MaterializationRef.from_dict(m) for m in value)
        return cls(
            doc["checkpoint_id"],
            tuple(ChangelogHandle.from_dict(h) for h in doc["handles"]),
            refs["materialized"],
            refs["bridge"] if refs["materialized"] else (),
            _parts_from(doc.get("parts", []), _depth),
        )


def _parts_from(value: Any, depth: int) -> tuple[tuple[KeyGroupRange, BackendSnapshot], ...]:
    """The validated ``parts`` of a snapshot document."""
    if not isinstance(value, list):
        msg = "backend snapshot field 'parts' must be a list"
        raise InvalidHandleError(msg)
    if value and depth >= _MAX_PART_DEPTH:
        msg = f"backend snapshot parts nest deeper than {_MAX_PART_DEPTH} levels (damaged or forged)"
        raise InvalidHandleError(msg)
    parts = []
    for part in value:
        part = check_fields(part, "backend snapshot part", {"key_groups": list})
        bounds = part["key_groups"]
        if len(bounds) != 2 or not all(type(b) is int for b in bounds) or not 0 <= bounds[0] <= bounds[1]:
            msg = f"backend snapshot part 'key_groups' must be [start, end], got {bounds!r:.60}"
            raise InvalidHandleError(msg)
        parts.append((KeyGroupRange(*bounds), BackendSnapshot.from_dict(part.get("snapshot"), depth + 1)))
    return tuple(parts)


def encode_snapshot(snapshot: BackendSnapshot) -> dict[str, Any]:
    """Build ``snapshot``'s document: the one place a snapshot is serialized (once per object)."""
    doc: dict[str, Any] = {
        "checkpoint_id": snapshot.checkpoint_id,
        "handles": [h.to_dict() for h in snapshot.handles],
        "materialized": [m.to_dict() for m in snapshot.materialized],
    }
    if snapshot.bridge:
        doc["bridge"] = [m.to_dict() for m in snapshot.bridge]
    if snapshot.parts:
        doc["parts"] = [
            {"key_groups": [owned.start, owned.end], "snapshot": part.to_dict()}
            for owned, part in snapshot.parts
        ]
    return doc
