"""The schemas a PySpark processor declares for its states: found on the driver, enforced in the tasks.

Spark runs a processor's ``init`` on the driver to learn its state variables and
their schemas (its driver-side handle), and checks and converts every value by
them. dstl does the same: :func:`declared_schemas` runs ``init`` once at the call
with a handle that only records (a DDL string becomes a schema there, where the
JVM parses it), and each task's handle types its states with :class:`TypedValues`:
a value that does not fit its schema is an error naming the state and the field
(Spark would store a NULL), a value reads back as a ``Row`` of its schema, and a
value stored before fields were added reads with those fields null.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dstl.spi import ConfigError

__all__ = ["DeclaredStates", "StateSchemas", "TypedValues", "declared_schemas", "declared_states"]

#: state name -> {"value": schema JSON, "key": schema JSON (map states)}
StateSchemas = dict[str, dict[str, str]]


@dataclass(frozen=True)
class DeclaredStates:
    """What a processor's ``init`` declares: each state's schemas and kind, and the states it deletes.

    :ivar schemas: state name -> its schemas (:data:`StateSchemas`).
    :ivar kinds: state name -> ``value``, ``list`` or ``map``.
    :ivar deleted: the states ``init`` removes with ``deleteIfExists``.
    :ivar expiring: the states declared with a TTL.
    """

    schemas: StateSchemas = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    expiring: frozenset[str] = frozenset()

    def metrics(self) -> dict[str, int]:
        """Spark's state-variable counts of ``transformWithState`` (its ``customMetrics`` names)."""
        kinds = list(self.kinds.values())
        return {
            "numValueStateVars": kinds.count("value"),
            "numListStateVars": kinds.count("list"),
            "numMapStateVars": kinds.count("map"),
            "numDeletedStateVars": len(self.deleted),
        }


def declared_schemas(make: Callable[[], Any]) -> StateSchemas:
    """The schemas of :func:`declared_states`."""
    return declared_states(make).schemas


def declared_states(make: Callable[[], Any]) -> DeclaredStates:  # noqa: C901 - PySpark's handle, recorded
    """Run a fresh PySpark processor's ``init`` with a recording handle: the states it declares.

    :raises ConfigError: when ``init`` fails or declares a schema Spark cannot parse or
        a field that is not nullable (known at the call, as on Spark, instead of in
        every task).
    """
    from pyspark.sql.streaming import stateful_processor as api

    schemas: StateSchemas = {}
    kinds: dict[str, str] = {}
    deleted: set[str] = set()
    expiring: set[str] = set()
    base: Any = api.StatefulProcessorHandle  # PySpark's class, found at run time

    class Recording(base):
        def __init__(self) -> None:  # no super(): it binds an API client
            pass

        def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> None:
            schemas[stateName] = {"value": _schema_json(schema, stateName)}
            kinds[stateName] = "value"
            _note_ttl(stateName, ttlDurationMs)

        def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> None:
            schemas[stateName] = {"value": _schema_json(schema, stateName)}
            kinds[stateName] = "list"
            _note_ttl(stateName, ttlDurationMs)

        def getMapState(
            self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
        ) -> None:
            schemas[stateName] = {
                "value": _schema_json(valueSchema, stateName),
                "key": _schema_json(userKeySchema, stateName),
            }
            kinds[stateName] = "map"
            _note_ttl(stateName, ttlDurationMs)

        def registerTimer(self, expiryTimestampMs: int) -> None:
            pass

        def deleteTimer(self, expiryTimestampMs: int) -> None:
            pass

        def listTimers(self) -> Iterator[int]:
            return iter(())

        def deleteIfExists(self, stateName: str) -> None:
            deleted.add(stateName)

    def _note_ttl(name: str, ttl_ms: int | None) -> None:
        if ttl_ms is not None:
            expiring.add(name)

    processor = make()
    try:
        processor.init(Recording())
    except ConfigError:
        raise
    except Exception as exc:
        msg = f"{type(processor).__name__}.init failed on the driver, where its states are declared: {exc!r}"
        raise ConfigError(msg) from exc
    return DeclaredStates(schemas, kinds, frozenset(deleted), frozenset(expiring))


def _schema_json(schema: Any, state: str) -> str:
    """A declared schema (``StructType`` or DDL string) as Spark's JSON form."""
    from pyspark.sql.types import StructType

    try:
        parsed = schema if isinstance(schema, StructType) else StructType.fromDDL(str(schema))
    except Exception as exc:
        msg = f"state {state!r} declares the schema {schema!r:.80}, which Spark cannot parse: {exc}"
        raise ConfigError(msg) from exc
    fields = parsed.fields if isinstance(parsed, StructType) else []  # fromDDL of fields: a struct
    required = [item.name for item in fields if not item.nullable]
    if required:  # Spark's TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE
        msg = (
            f"state {state!r} declares fields {required} not nullable: a state's schema must be nullable "
            "(as on Spark: a value is absent until written); declare them with nullable=True"
        )
        raise ConfigError(msg)
    return parsed.json()


class TypedValues:
    """One state's values by its declared schema: checked on write, ``Row`` objects on read.

    ``versions`` lists every value schema the state had (the checkpoint location's
    record); a value is stored as a list ``[version, field, ...]`` naming the schema it
    was written with, and read by field name: fields added since read as null, fields
    removed are dropped, reordered ones land by name (Spark's Avro evolution). A
    stored tuple is a value written before versions: read by position.
    """

    def __init__(
        self, state: str, schema_json: str, what: str = "value", versions: tuple[str, ...] = ()
    ) -> None:
        from pyspark.sql import Row
        from pyspark.sql.types import StructType, _make_type_verifier

        self.state = state
        self.what = what
        schema = StructType.fromJson(json.loads(schema_json))
        self.schema = schema
        self._names = tuple(schema.names)
        self._make = Row(*self._names)
        self._verifiers = tuple(
            _make_type_verifier(field.dataType, field.nullable, name=field.name) for field in schema.fields
        )
        self._readers = tuple(_reader(field.dataType) for field in schema.fields)
        # without a record (a processor run outside a query), the declared schema is version 0;
        # a map's keys are looked up as they are stored: plain tuples, never versioned
        self._versions = tuple(versions) if schema_json in versions else (*versions, schema_json)
        self._version = None if what == "key" else self._versions.index(schema_json)
        self._written_names: dict[int, tuple[str, ...]] = {}

    def write(self, values: tuple[Any, ...]) -> tuple[Any, ...] | list[Any]:
        """``values`` if they fit the schema, as stored: ``[version, field, ...]`` (a map key: the tuple).

        :raises TypeError: naming the state, the field, its type and the value.
        """
        if len(values) != len(self._names):
            msg = (
                f"state {self.state!r}: a {self.what} of {len(values)} fields for its schema's "
                f"{len(self._names)} ({self.schema.simpleString()})"
            )
            raise TypeError(msg)
        for verify, name, value in zip(self._verifiers, self._names, values, strict=True):
            try:
                verify(value)
            except (TypeError, ValueError) as exc:
                msg = (
                    f"state {self.state!r}: field {name!r} of its {self.what} schema "
                    f"({self.schema.simpleString()}) cannot hold {value!r:.60}: {exc}"
                )
                raise TypeError(msg) from exc
        return values if self._version is None else [self._version, *values]

    def read(self, stored: tuple[Any, ...] | list[Any]) -> Any:
        """A stored value as a ``Row`` of the schema (structs inside it as ``Row`` too).

        :raises TypeError: when a value's recorded schema is unknown, or an unversioned
            value has more fields than the schema (fields were removed from it).
        """
        if isinstance(stored, dict):  # what a reader shows of a value it must not decode (pickle)
            msg = (
                f"state {self.state!r} holds a {self.what} stored with pickle by an earlier release, which "
                "this reader does not decode (it would run the checkpoint's code): read it with "
                "read_state(allow_pickle=True) if you trust the checkpoint, or rewrite it through a savepoint"
            )
            raise TypeError(msg)
        if isinstance(stored, list) and self._version is not None:
            values = self._by_name(stored)
        else:
            values = self._by_position(tuple(stored))
        return self._make(*(read(value) for read, value in zip(self._readers, values, strict=True)))

    def _by_name(self, stored: list[Any]) -> list[Any]:
        version = stored[0] if stored else None
        if type(version) is not int or not 0 <= version < len(self._versions):
            msg = (
                f"state {self.state!r} holds a {self.what} written with schema version {version!r:.20}, "
                f"which the checkpoint location's record does not list ({len(self._versions)} versions): "
                "the record was replaced or damaged. Restore it, or migrate the state through a savepoint"
            )
            raise TypeError(msg)
        names = self._written_names.get(version)
        if names is None:
            names = tuple(f["name"] for f in json.loads(self._versions[version])["fields"])
            self._written_names[version] = names
        found = dict(zip(names, stored[1:], strict=False))
        return [found.get(name) for name in self._names]

    def _by_position(self, stored: tuple[Any, ...]) -> list[Any]:
        if len(stored) > len(self._names):
            msg = (
                f"state {self.state!r} holds a {self.what} of {len(stored)} fields, more than its schema's "
                f"{len(self._names)} ({self.schema.simpleString()}): removing fields is not a compatible "
                "change. Keep them, or migrate the state through a savepoint"
            )
            raise TypeError(msg)
        return list(stored) + [None] * (len(self._names) - len(stored))


def _reader(kind: Any) -> Callable[[Any], Any]:
    """How a stored field of type ``kind`` reads back: structs (also in arrays and maps) as ``Row``."""
    from pyspark.sql import Row
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, StructType):
        names = tuple(kind.names)
        make = Row(*names)
        inner = tuple(_reader(field.dataType) for field in kind.fields)

        def struct(value: Any) -> Any:
            if value is None:
                return None
            if isinstance(value, dict):
                fields = [value.get(name) for name in names]
            elif isinstance(value, Row) and hasattr(value, "__fields__"):
                fields = [value[name] if name in value.__fields__ else None for name in names]
            else:
                fields = list(value)
            fields += [None] * (len(names) - len(fields))
            return make(*(read(item) for read, item in zip(inner, fields, strict=False)))

        return struct
    if isinstance(kind, ArrayType):
        element = _reader(kind.elementType)
        if element is _as_is:
            return _as_is
        return lambda value: None if value is None else [element(item) for item in value]
    if isinstance(kind, MapType):
        key, item = _reader(kind.keyType), _reader(kind.valueType)
        if key is _as_is and item is _as_is:
            return _as_is
        return lambda value: None if value is None else {key(k): item(v) for k, v in value.items()}
    return _as_is


def _as_is(value: Any) -> Any:
    return value
