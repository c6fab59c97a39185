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
from typing import Any

from dstl.spi import ConfigError

__all__ = ["StateSchemas", "TypedValues", "declared_schemas"]

#: state name -> {"value": schema JSON, "key": schema JSON (map states)}
StateSchemas = dict[str, dict[str, str]]


def declared_schemas(make: Callable[[], Any]) -> StateSchemas:
    """Run a fresh PySpark processor's ``init`` with a recording handle: the states it declares.

    :raises ConfigError: when ``init`` fails or declares a schema Spark cannot parse
        (known at the call, as on Spark, instead of in every task).
    """
    from pyspark.sql.streaming import stateful_processor as api

    schemas: StateSchemas = {}
    base: Any = api.StatefulProcessorHandle  # PySpark's class, found at run time

    class Recording(base):
        def __init__(self) -> None:  # no super(): it binds an API client
            pass

        def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> None:
            schemas[stateName] = {"value": _schema_json(schema, stateName)}

        def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> None:
            schemas[stateName] = {"value": _schema_json(schema, stateName)}

        def getMapState(
            self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
        ) -> None:
            schemas[stateName] = {
                "value": _schema_json(valueSchema, stateName),
                "key": _schema_json(userKeySchema, stateName),
            }

        def registerTimer(self, expiryTimestampMs: int) -> None:
            pass

        def deleteTimer(self, expiryTimestampMs: int) -> None:
            pass

        def listTimers(self) -> Iterator[int]:
            return iter(())

        def deleteIfExists(self, stateName: str) -> None:
            pass

    processor = make()
    try:
        processor.init(Recording())
    except ConfigError:
        raise
    except Exception as exc:
        msg = f"{type(processor).__name__}.init failed on the driver, where its states are declared: {exc!r}"
        raise ConfigError(msg) from exc
    return schemas


def _schema_json(schema: Any, state: str) -> str:
    """A declared schema (``StructType`` or DDL string) as Spark's JSON form."""
    from pyspark.sql.types import StructType

    try:
        parsed = schema if isinstance(schema, StructType) else StructType.fromDDL(str(schema))
    except Exception as exc:
        msg = f"state {state!r} declares the schema {schema!r:.80}, which Spark cannot parse: {exc}"
        raise ConfigError(msg) from exc
    return parsed.json()


class TypedValues:
    """One state's values by its declared schema: checked on write, ``Row`` objects on read."""

    def __init__(self, state: str, schema_json: str, what: str = "value") -> None:
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
        self._nested = tuple(
            (index, field.dataType)
            for index, field in enumerate(schema.fields)
            if isinstance(field.dataType, StructType)
        )

    def write(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """``values`` if they fit the schema.

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
        return values

    def read(self, stored: tuple[Any, ...]) -> Any:
        """A stored value as a ``Row`` of the schema; fields added since it was written read as null.

        :raises TypeError: when it has more fields than the schema (fields were removed:
            an incompatible change).
        """
        if len(stored) > len(self._names):
            msg = (
                f"state {self.state!r} holds a {self.what} of {len(stored)} fields, more than its schema's "
                f"{len(self._names)} ({self.schema.simpleString()}): removing fields is not a compatible "
                "change. Keep them, or migrate the state through a savepoint"
            )
            raise TypeError(msg)
        values = list(stored) + [None] * (len(self._names) - len(stored))
        for index, nested in self._nested:
            values[index] = _as_row(values[index], nested)
        return self._make(*values)


def _as_row(value: Any, schema: Any) -> Any:
    """A struct field's value (a dict, tuple or ``Row``) as a ``Row`` of its schema."""
    from pyspark.sql import Row

    if value is None or (isinstance(value, Row) and hasattr(value, "__fields__")):
        return value
    if isinstance(value, dict):
        return Row(**{name: value.get(name) for name in schema.names})
    return Row(*schema.names)(*value)
