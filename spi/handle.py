"""The changelog handle: what a persist returns and a checkpoint stores.

Handles are read back from shared storage, so :meth:`ChangelogHandle.from_json`
treats its input as untrusted: size-limited, strictly typed, versioned, and free of
paths that could escape a storage's base. Handles are never pickled.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidHandleError, InvalidIdentifierError
from .names import check_relative_path, validate_name
from .types import KeyGroupRange, SequenceNumberRange

__all__ = [
    "HANDLE_SCHEMA",
    "HANDLE_SCHEMA_VERSION",
    "MAX_HANDLE_JSON_BYTES",
    "ChangelogHandle",
    "reject_duplicate_keys",
]

HANDLE_SCHEMA = "dstl.changelog-handle"
HANDLE_SCHEMA_VERSION = 1
#: Upper bound for a handle's JSON text; larger input is rejected before parsing.
MAX_HANDLE_JSON_BYTES = 16 * 1024 * 1024
MAX_LOCATIONS = 1_000_000
_MAX_LOCATION_KEYS = 16
_MAX_STRING = 1024

LocationValue = str | int | bool | None
Location = Mapping[str, LocationValue]

_FIELDS = {
    "schema",
    "version",
    "storage_id",
    "log_id",
    "epoch",
    "key_groups",
    "sqn_range",
    "size",
    "incremental_size",
    "checkpoint_id",
    "locations",
}


def _freeze_location(location: Mapping[str, Any], index: int) -> tuple[tuple[str, Any], ...]:
    if not isinstance(location, Mapping):
        msg = f"locations[{index}] must be an object, got {type(location).__name__}"
        raise InvalidHandleError(msg)
    if len(location) > _MAX_LOCATION_KEYS:
        msg = f"locations[{index}] has {len(location)} keys (at most {_MAX_LOCATION_KEYS})"
        raise InvalidHandleError(msg)
    items = []
    for key, value in location.items():
        if not isinstance(key, str) or not key.isidentifier():
            msg = f"locations[{index}] has an invalid key {key!r}"
            raise InvalidHandleError(msg)
        if isinstance(value, str):
            if len(value) > _MAX_STRING:
                msg = f"locations[{index}].{key} is longer than {_MAX_STRING} characters"
                raise InvalidHandleError(msg)
            try:
                check_relative_path(value, f"locations[{index}].{key}")
            except InvalidIdentifierError as exc:
                raise InvalidHandleError(str(exc)) from exc
        elif isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                msg = f"locations[{index}].{key} must not be negative, got {value}"
                raise InvalidHandleError(msg)
        elif not (isinstance(value, bool) or value is None):
            msg = (
                f"locations[{index}].{key} must be a string, non-negative int, bool or null, "
                f"got {type(value).__name__}"
            )
            raise InvalidHandleError(msg)
        items.append((key, value))
    return tuple(sorted(items))


def _int_field(doc: Mapping[str, Any], name: str, *, nullable: bool = False) -> int | None:
    value = doc.get(name)
    if value is None and nullable:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        msg = f"handle field {name!r} must be a non-negative integer, got {value!r}"
        raise InvalidHandleError(msg)
    return value


def _pair_field(doc: Mapping[str, Any], name: str) -> tuple[int, int]:
    value = doc.get(name)
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        msg = f"handle field {name!r} must be a list of two integers [start, end], got {value!r}"
        raise InvalidHandleError(msg)
    return value[0], value[1]


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for untrusted JSON: a repeated key is an error, not "the last one wins".

    :raises InvalidHandleError: naming the key.
    """
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            msg = f"duplicate key {key!r}"
            raise InvalidHandleError(msg)
        seen[key] = value
    return seen


@dataclass(frozen=True)
class ChangelogHandle:
    """Immutable reference to the persisted changes of one log in ``sqn_range``.

    Reading the handle yields exactly the changes of log ``log_id`` (written by the
    writer with ``epoch``) whose SQN lies in ``sqn_range``, even when the objects in
    ``locations`` also hold older or foreign changes.

    :ivar storage_id: identifier of the storage that wrote the handle; restore picks
        the storage by it, not by the current config.
    :ivar size: bytes of change data the handle covers.
    :ivar incremental_size: bytes uploaded by the persist that returned the handle
        (the rest was uploaded by earlier persists and is shared).
    :ivar locations: storage-specific, JSON-scalar-valued entries; string values are
        paths relative to the storage's configured base.
    """

    storage_id: str
    log_id: str
    key_groups: KeyGroupRange
    sqn_range: SequenceNumberRange
    epoch: int = 0
    size: int = 0
    incremental_size: int = 0
    checkpoint_id: int | None = None
    locations: tuple[tuple[tuple[str, LocationValue], ...], ...] = field(default=())

    @classmethod
    def create(  # noqa: PLR0913 - one keyword per field of the handle
        cls,
        *,
        storage_id: str,
        log_id: str,
        key_groups: KeyGroupRange,
        sqn_range: SequenceNumberRange,
        epoch: int = 0,
        size: int = 0,
        incremental_size: int = 0,
        checkpoint_id: int | None = None,
        locations: Iterable[Location] = (),
    ) -> ChangelogHandle:
        """Build and validate a handle from plain location mappings."""
        try:
            validate_name(storage_id, "storage_id")
            validate_name(log_id, "log_id")
        except InvalidIdentifierError as exc:
            raise InvalidHandleError(str(exc)) from exc
        frozen = tuple(_freeze_location(loc, i) for i, loc in enumerate(locations))
        for name, value in (("epoch", epoch), ("size", size), ("incremental_size", incremental_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                msg = f"handle field {name!r} must be a non-negative integer, got {value!r}"
                raise InvalidHandleError(msg)
        if checkpoint_id is not None and (not isinstance(checkpoint_id, int) or checkpoint_id < 0):
            msg = f"handle field 'checkpoint_id' must be a non-negative integer, got {checkpoint_id!r}"
            raise InvalidHandleError(msg)
        if incremental_size > size:
            msg = f"incremental_size {incremental_size} exceeds size {size}"
            raise InvalidHandleError(msg)
        return cls(
            storage_id=storage_id,
            log_id=log_id,
            key_groups=key_groups,
            sqn_range=sqn_range,
            epoch=epoch,
            size=size,
            incremental_size=incremental_size,
            checkpoint_id=checkpoint_id,
            locations=frozen,
        )

    @property
    def location_dicts(self) -> list[dict[str, LocationValue]]:
        """The locations as plain dicts (fresh copies)."""
        return [dict(loc) for loc in self.locations]

    @property
    def is_empty(self) -> bool:
        """Whether the handle covers no stored change."""
        return not self.locations

    @property
    def reads(self) -> tuple[Any, ...]:
        """What reading the handle yields, as a hashable key: equal keys, the same changes.

        The accounting fields are left out: a later checkpoint that carries the
        handle over reports the same changes with ``incremental_size`` 0.
        """
        return (self.storage_id, self.log_id, self.epoch, self.key_groups, self.sqn_range, self.locations)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document of this handle."""
        return {
            "schema": HANDLE_SCHEMA,
            "version": HANDLE_SCHEMA_VERSION,
            "storage_id": self.storage_id,
            "log_id": self.log_id,
            "epoch": self.epoch,
            "key_groups": [self.key_groups.start, self.key_groups.end],
            "sqn_range": [self.sqn_range.start, self.sqn_range.end],
            "size": self.size,
            "incremental_size": self.incremental_size,
            "checkpoint_id": self.checkpoint_id,
            "locations": self.location_dicts,
        }

    def to_json(self) -> str:
        """Serialise to compact JSON text (the only persisted form of a handle)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, doc: Any) -> ChangelogHandle:
        """Validate a decoded JSON document and build the handle.

        :raises InvalidHandleError: naming the offending field.
        """
        if not isinstance(doc, Mapping):
            msg = f"handle JSON must be an object, got {type(doc).__name__}"
            raise InvalidHandleError(msg)
        if doc.get("schema") != HANDLE_SCHEMA:
            msg = f"not a dstl changelog handle: schema is {doc.get('schema')!r}, expected {HANDLE_SCHEMA!r}"
            raise InvalidHandleError(msg)
        version = doc.get("version")
        if version != HANDLE_SCHEMA_VERSION:
            msg = (
                f"unsupported handle schema version {version!r}; this dstl reads version "
                f"{HANDLE_SCHEMA_VERSION} (upgrade dstl to read handles written by a newer one)"
            )
            raise InvalidHandleError(msg)
        unknown = set(doc) - _FIELDS
        if unknown:
            msg = f"unknown handle fields: {sorted(unknown)}"
            raise InvalidHandleError(msg)
        locations = doc.get("locations")
        if not isinstance(locations, list):
            msg = f"handle field 'locations' must be a list, got {type(locations).__name__}"
            raise InvalidHandleError(msg)
        if len(locations) > MAX_LOCATIONS:
            msg = f"handle has {len(locations)} locations (at most {MAX_LOCATIONS})"
            raise InvalidHandleError(msg)
        try:
            key_groups = KeyGroupRange(*_pair_field(doc, "key_groups"))
            sqn_range = SequenceNumberRange(*_pair_field(doc, "sqn_range"))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidHandleError):
                raise
            msg = f"invalid range in handle: {exc}"
            raise InvalidHandleError(msg) from exc
        for name in ("storage_id", "log_id"):
            if not isinstance(doc.get(name), str):
                msg = f"handle field {name!r} must be a string, got {doc.get(name)!r}"
                raise InvalidHandleError(msg)
        return cls.create(
            storage_id=doc["storage_id"],
            log_id=doc["log_id"],
            key_groups=key_groups,
            sqn_range=sqn_range,
            epoch=_int_field(doc, "epoch"),  # type: ignore[arg-type]
            size=_int_field(doc, "size"),  # type: ignore[arg-type]
            incremental_size=_int_field(doc, "incremental_size"),  # type: ignore[arg-type]
            checkpoint_id=_int_field(doc, "checkpoint_id", nullable=True),
            locations=locations,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ChangelogHandle:
        """Parse and validate untrusted JSON text.

        :raises InvalidHandleError: on oversized, malformed or hostile input.
        """
        if not isinstance(text, str | bytes | bytearray):
            msg = f"handle JSON must be text or bytes, got {type(text).__name__}"
            raise InvalidHandleError(msg)
        if len(text) > MAX_HANDLE_JSON_BYTES:
            msg = (
                f"handle JSON is {len(text)} bytes, above the limit of {MAX_HANDLE_JSON_BYTES}; "
                "this is not a handle dstl wrote"
            )
            raise InvalidHandleError(msg)
        try:
            doc = json.loads(text, object_pairs_hook=reject_duplicate_keys)
        except InvalidHandleError:
            raise
        except (ValueError, RecursionError) as exc:
            msg = f"handle is not valid JSON: {exc}"
            raise InvalidHandleError(msg) from exc
        return cls.from_dict(doc)
