"""What a checkpoint location's query was first started with, recorded there and checked at every start.

Spark checks a restarted query against its checkpoint (sources, state schemas);
dstl checks what its state depends on the same way: the key columns (rows are
routed and state is looked up by them: other keys would silently start empty),
the time mode (timers registered in one clock never fire in another), and keeps
whether the query has the heartbeat source of idle batches (Spark's checkpoint
records the sources, so that cannot change). A change is refused at the call,
naming the old and the new and what to do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dstl.spi import Config, ConfigError, DstlError

from ...documents import read_regular_file
from ...filesystems import checkpoint_fs

__all__ = [
    "QUERY_RECORD_FILE",
    "QueryShape",
    "key_types",
    "recorded_shape",
    "schema_change_problem",
    "settled_shape",
]

log = logging.getLogger(__name__)

#: The record, in the checkpoint location (Spark ignores the file).
QUERY_RECORD_FILE = "dstl-query.json"
_MAX_RECORD = 1024 * 1024
_KINDS = ("value", "list", "map")
#: Key types that hash alike (the driver widens them before routing): a change among them is compatible.
_WIDENED = {"tinyint": "bigint", "smallint": "bigint", "int": "bigint", "float": "double"}


def key_types(frame: Any, key_columns: list[str]) -> tuple[tuple[str, str], ...]:
    """``(column, Spark type)`` of the key columns, widened as routing widens them."""
    types = {field.name: field.dataType.simpleString() for field in frame.schema.fields}
    return tuple((column, _WIDENED.get(types[column], types[column])) for column in key_columns)


@dataclass(frozen=True)
class QueryShape:
    """What the state of a location depends on.

    :ivar key_columns: ``(column, Spark type)`` of each key column, in order.
    :ivar time_mode: the timers' clock (``none``, ``processing``, ``event``).
    :ivar idle_batches: whether the stream carries the heartbeat source.
    """

    key_columns: tuple[tuple[str, str], ...]
    time_mode: str
    idle_batches: bool
    #: state name -> {"value": schema JSON, "key": ...}: what a PySpark processor declares
    state_schemas: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: state name -> every value schema it had, oldest first: a stored value names its
    #: schema by its index here (Spark's schema ids), so it reads by name under a newer one
    value_versions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: state name -> ``value``, ``list`` or ``map``: what its declaration made it
    state_kinds: Mapping[str, str] = field(default_factory=dict)
    #: the states declared with a TTL (the newest declaration)
    expiring_states: frozenset[str] = frozenset()

    def versions_of(self, state: str) -> tuple[str, ...]:
        """The value schemas ``state`` had (records before versions: its current one)."""
        if state in self.value_versions:
            return tuple(self.value_versions[state])
        current = self.state_schemas.get(state, {}).get("value")
        return () if current is None else (current,)

    def to_json(self) -> bytes:
        """The record's bytes."""
        document = {
            "key_columns": [list(pair) for pair in self.key_columns],
            "time_mode": self.time_mode,
            "idle_batches": self.idle_batches,
            "state_schemas": {name: dict(parts) for name, parts in self.state_schemas.items()},
            "value_versions": {name: list(versions) for name, versions in self.value_versions.items()},
            "state_kinds": dict(self.state_kinds),
            "expiring_states": sorted(self.expiring_states),
        }
        return json.dumps(document).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> QueryShape:
        """Decode a record (untrusted: every field checked).

        :raises ConfigError: naming the file and what to do, when it is not a record.
        """
        try:
            document = json.loads(data)
            columns, time_mode = document["key_columns"], document["time_mode"]
            idle = document["idle_batches"]
            schemas = document.get("state_schemas", {})
            versions = document.get("value_versions", {})
            kinds = document.get("state_kinds", {})
            expiring = document.get("expiring_states", [])
            pairs_ok = isinstance(columns, list) and all(
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair)
                for pair in columns
            )
            schemas_ok = isinstance(schemas, dict) and all(
                isinstance(parts, dict) and all(_is_schema(v) for v in parts.values())
                for parts in schemas.values()
            )
            versions_ok = isinstance(versions, dict) and all(
                isinstance(listed, list) and listed and all(_is_schema(v) for v in listed)
                for listed in versions.values()
            )
            kinds_ok = isinstance(kinds, dict) and all(kind in _KINDS for kind in kinds.values())
            kinds_ok = kinds_ok and isinstance(expiring, list) and all(isinstance(n, str) for n in expiring)
            if (
                not (pairs_ok and schemas_ok and versions_ok and kinds_ok)
                or not isinstance(time_mode, str)
                or not isinstance(idle, bool)
            ):
                raise TypeError(document)
        except (ValueError, KeyError, TypeError) as exc:
            msg = (
                f"{where} is damaged ({exc!r:.80}): it records the key columns, time mode and idle batches "
                "the query was first started with. Restore it, or remove it (the next start records "
                "the query as it is then, unchecked)"
            )
            raise ConfigError(msg) from exc
        history = {name: tuple(listed) for name, listed in versions.items()}
        keys = tuple((name, kind) for name, kind in columns)
        named = {str(name): kind for name, kind in kinds.items()}
        return cls(keys, time_mode, idle, schemas, history, named, frozenset(expiring))


def settled_shape(
    checkpoint_location: str, wanted: QueryShape, config: Config | Mapping[str, Any] | None = None
) -> QueryShape:
    """The shape the query runs with: ``wanted``, checked against the location's record.

    With no record, ``wanted`` is recorded (without idle batches when Spark already ran
    a query there: its checkpoint records the sources, a heartbeat would be a new one).

    :raises ConfigError: when the key columns or the time mode differ from the record's,
        or the record is damaged.
    """
    fs, root = checkpoint_fs(checkpoint_location, config)
    path = f"{root}/{QUERY_RECORD_FILE}"
    recorded = _read(fs, path)
    if recorded is None:
        shape = replace(wanted, idle_batches=False) if _spark_started(fs, root) else wanted
        shape = replace(shape, value_versions=_versions_with(shape, shape.state_schemas))
        fs.makedirs(root, exist_ok=True)
        fs.pipe_file(path, shape.to_json())
        return shape
    _check(recorded, wanted, checkpoint_location)
    _check_renames(recorded, wanted, _dropped_states(config), checkpoint_location)
    evolved = {**recorded.state_schemas, **wanted.state_schemas}
    versions = _versions_with(recorded, wanted.state_schemas)
    # the current declaration (a state it dropped was checked above): a later new state is no rename
    current = wanted if wanted.state_kinds else recorded
    kinds, expiring = dict(current.state_kinds), current.expiring_states
    newest = replace(
        recorded, state_schemas=evolved, value_versions=versions, state_kinds=kinds, expiring_states=expiring
    )
    if newest != recorded:
        # compatible (checked): the newer schemas hold from now on, the older ones still read
        recorded = newest
        fs.pipe_file(path, recorded.to_json())
    if recorded.idle_batches != wanted.idle_batches:
        log.warning(
            "the query at %s was started %s idle batches and keeps that (Spark's checkpoint records its "
            "sources): %s. A new checkpoint location (from a savepoint) chooses again",
            checkpoint_location,
            "with" if recorded.idle_batches else "without",
            "batches run at least every second, and an availableNow trigger takes all input in one batch"
            if recorded.idle_batches
            else "timers fire and the watermark takes effect only when rows arrive",
        )
    return recorded


def recorded_shape(
    checkpoint_location: str, config: Config | Mapping[str, Any] | None = None
) -> QueryShape | None:
    """The location's record, read only (``None``: no query recorded there).

    :raises ConfigError: when it is damaged.
    """
    fs, root = checkpoint_fs(checkpoint_location, config)
    return _read(fs, f"{root}/{QUERY_RECORD_FILE}")


def _versions_with(
    recorded: QueryShape, declared: Mapping[str, Mapping[str, str]]
) -> dict[str, tuple[str, ...]]:
    """Every state's value schemas, with each newly declared one appended (a known one keeps its index)."""
    versions = {state: recorded.versions_of(state) for state in {*recorded.state_schemas, *declared}}
    for state, parts in declared.items():
        value = parts.get("value")
        if value is not None and value not in versions[state]:
            versions[state] = (*versions[state], value)
    return {state: listed for state, listed in versions.items() if listed}


def _check(recorded: QueryShape, wanted: QueryShape, location: str) -> None:
    """Refuse what would silently lose state or timers."""
    fix = (
        f"Start the query as it was, or start the changed one at a new checkpoint location (a savepoint of "
        f"this one, `dstl savepoint {location} <target>`, carries its state to a new location)"
    )
    if recorded.key_columns != wanted.key_columns:
        msg = (
            f"key columns {_columns(wanted)} differ from {_columns(recorded)}, which the state at {location} "
            "is keyed by: rows are routed and state looked up by them, so every key's state would silently "
            f"start empty. {fix}"
        )
        raise ConfigError(msg)
    if recorded.time_mode != wanted.time_mode:
        msg = (
            f"time_mode {wanted.time_mode!r} differs from {recorded.time_mode!r}, which the timers at "
            f"{location} were registered in: they would never fire. {fix}"
        )
        raise ConfigError(msg)
    _check_schemas(recorded, wanted, fix)


def _dropped_states(config: Config | Mapping[str, Any] | None) -> frozenset[str]:
    from ..options import SPARK_DROPPED_STATES

    listed = Config.of(config).get(SPARK_DROPPED_STATES) if config is not None else None
    return frozenset(name.strip() for name in (listed or "").split(",") if name.strip())


def _check_renames(recorded: QueryShape, wanted: QueryShape, dropped: frozenset[str], location: str) -> None:
    """Refuse a state that left the declaration while one of its kind arrived: a rename, most likely.

    dstl keeps a state's data by its name, so the new one would silently start empty.
    A state named in ``dstl.spark.dropped-states`` may go.
    """
    if not recorded.state_kinds or not wanted.state_kinds:
        return  # a record before kinds, or a processor that declares nothing (dstl's own)
    gone = {name: kind for name, kind in recorded.state_kinds.items() if name not in wanted.state_kinds}
    arrived = {name: kind for name, kind in wanted.state_kinds.items() if name not in recorded.state_kinds}
    for name, kind in sorted(gone.items()):
        if name in dropped:
            continue
        alike = sorted(new for new, new_kind in arrived.items() if new_kind == kind)
        if alike:
            msg = (
                f"state {name!r} ({kind}) is no longer declared and {alike} of the same kind is new: "
                f"a renamed state would silently start empty (the state at {location} is kept by name). "
                f"Keep the name {name!r}, or move its data under the new name through a savepoint; to drop "
                f"it and start {alike[0]!r} empty, set dstl.spark.dropped-states={name}"
            )
            raise ConfigError(msg)


def _check_schemas(recorded: QueryShape, wanted: QueryShape, fix: str) -> None:
    """Each state's schemas evolve compatibly (see :func:`schema_change_problem`).

    A value schema is checked against every schema the state's values were written
    with (they stay stored until rewritten); a map's key schema against its current one.
    """
    for state, parts in wanted.state_schemas.items():
        for part, schema in parts.items():
            befores = recorded.versions_of(state) if part == "value" else ()
            if not befores:
                current = recorded.state_schemas.get(state, {}).get(part)
                befores = () if current is None else (current,)
            for before in befores:
                if before == schema:
                    continue
                problem = schema_change_problem(before, schema, by_name=part == "value")
                if problem is not None:
                    msg = (
                        f"state {state!r} now declares the {part} schema {_simple(schema)}, incompatible "
                        f"with {_simple(before)}, which its stored values have: {problem}. {fix}"
                    )
                    raise ConfigError(msg)


def schema_change_problem(before_json: str, after_json: str, *, by_name: bool = False) -> str | None:
    """Why values of schema ``before`` cannot be read by ``after`` (``None``: they can).

    ``by_name`` (values, which record their schema: Spark's Avro evolution): fields
    match by name, so fields may be added (nullable), removed and reordered; a field
    kept may be widened (int to bigint, float to double), never narrowed or changed.
    Otherwise (map keys, compared as they are stored): the same fields in the same
    order, widened, made nullable, and nullable fields added at the end.
    """
    before, after = json.loads(before_json)["fields"], json.loads(after_json)["fields"]
    if by_name:
        return _by_name_problem(before, after)
    if len(after) < len(before):
        removed = [f["name"] for f in before[len(after) :]]
        return f"fields {removed} were removed"
    for old, new in zip(before, after, strict=False):
        if old["name"] != new["name"]:
            return f"field {old['name']!r} became {new['name']!r} (renamed or reordered)"
        if old["type"] != new["type"] and (old["type"], new["type"]) not in _WIDENINGS:
            return f"field {old['name']!r} changed from {old['type']} to {new['type']}"
        if old["nullable"] and not new["nullable"]:
            return f"field {old['name']!r} is no longer nullable"
    added = [f["name"] for f in after[len(before) :] if not f["nullable"]]
    return f"fields {added} were added without being nullable" if added else None


def _by_name_problem(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str | None:
    """:func:`schema_change_problem` of fields matched by name."""
    old_fields = {f["name"]: f for f in before}
    for new in after:
        old = old_fields.get(new["name"])
        if old is None:
            if not new["nullable"]:
                return f"fields {[new['name']]} were added without being nullable"
            continue
        if old["type"] != new["type"] and (old["type"], new["type"]) not in _WIDENINGS:
            narrowed = (new["type"], old["type"]) in _WIDENINGS
            return f"field {old['name']!r} changed from {old['type']} to {new['type']}" + (
                ": a stored value cannot narrow (Spark's STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION)"
                if narrowed
                else ""
            )
        if old["nullable"] and not new["nullable"]:
            return f"field {old['name']!r} is no longer nullable"
    return None


#: Type changes every stored value survives (Spark's widening).
_WIDENINGS = frozenset(
    {
        ("byte", "short"),
        ("byte", "integer"),
        ("byte", "long"),
        ("short", "integer"),
        ("short", "long"),
        ("integer", "long"),
        ("float", "double"),
    }
)


def _is_schema(text: object) -> bool:
    """Whether ``text`` is a struct schema in Spark's JSON form, as far as the checks here read it."""
    if not isinstance(text, str) or len(text) > _MAX_RECORD:
        return False
    try:
        fields = json.loads(text)["fields"]
    except (ValueError, TypeError, KeyError):
        return False
    return isinstance(fields, list) and all(
        isinstance(f, dict)
        and isinstance(f.get("name"), str)
        and isinstance(f.get("type"), str | dict)
        and isinstance(f.get("nullable"), bool)
        for f in fields
    )


def _simple(schema_json: str) -> str:
    fields = json.loads(schema_json)["fields"]
    return (
        "struct<"
        + ", ".join(f"{f['name']}: {f['type'] if isinstance(f['type'], str) else 'struct'}" for f in fields)
        + ">"
    )


def _columns(shape: QueryShape) -> str:
    return "[" + ", ".join(f"{name} {kind}" for name, kind in shape.key_columns) + "]"


def _spark_started(fs: Any, root: str) -> bool:
    """Whether Spark's offset log in the location has an entry (a query ran there)."""
    try:
        entries = fs.ls(f"{root}/offsets", detail=False)
    except FileNotFoundError:
        return False
    return any(not entry.rsplit("/", 1)[-1].startswith(".") for entry in entries)


def _read(fs: Any, path: str) -> QueryShape | None:
    """The record, ``None`` when there is none."""
    try:
        data = read_regular_file(fs, path, f"the query record {path}", max_bytes=_MAX_RECORD)
    except FileNotFoundError:
        return None
    except (OSError, DstlError) as exc:
        msg = f"{path} cannot be read ({exc}): restore it, or remove it (the next start records it anew)"
        raise ConfigError(msg) from exc
    return QueryShape.from_json(data, path)
