"""Declared configuration options and the parsers for their value forms."""

from __future__ import annotations

import datetime as _dt
import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

from .errors import ConfigError

__all__ = [
    "ConfigOption",
    "OptionType",
    "UnderCheckpoint",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
]

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_SIZE_UNITS = {
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}
_NUMBER_UNIT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def parse_duration(value: object) -> float:
    """Parse ``10ms``, ``1s``, ``2min``, ``1h`` (or a plain number of ms) into seconds."""
    if isinstance(value, _dt.timedelta):
        if value < _dt.timedelta(0):
            msg = f"a duration must be non-negative, got {value!r}"
            raise ValueError(msg)
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            msg = f"a duration must be finite and non-negative, got {value!r}"
            raise ValueError(msg)
        return value / 1000.0
    if isinstance(value, str):
        match = _NUMBER_UNIT.fullmatch(value)
        if match:
            unit = match.group(2).lower() or "ms"
            if unit in _DURATION_UNITS:
                return float(match.group(1)) * _DURATION_UNITS[unit]
    msg = f"{value!r} is not a duration"
    raise ValueError(msg)


def parse_size(value: object) -> int:
    """Parse ``512``, ``64kb``, ``5mb``, ``1gb`` (binary units) into bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            msg = f"a size must be non-negative, got {value}"
            raise ValueError(msg)
        return value
    if isinstance(value, str):
        match = _NUMBER_UNIT.fullmatch(value)
        if match:
            unit = match.group(2).lower() or "b"
            if unit in _SIZE_UNITS:
                return int(float(match.group(1)) * _SIZE_UNITS[unit])
    msg = f"{value!r} is not a size"
    raise ValueError(msg)


def format_duration(seconds: float) -> str:
    """Render seconds in the largest unit that keeps an integer (``10ms``, ``10min``)."""
    for unit, factor in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= factor and (seconds / factor).is_integer():
            return f"{int(seconds / factor)}{unit}"
    return f"{seconds * 1000:g}ms"


def format_size(size: int) -> str:
    """Render bytes in the largest binary unit that keeps an integer (``5mb``)."""
    for unit in ("gb", "mb", "kb"):
        factor = _SIZE_UNITS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}b"


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    msg = f"{value!r} is not a boolean"
    raise ValueError(msg)


def _parse_int(value: object) -> int:
    if isinstance(value, bool):
        msg = f"{value!r} is not an integer"
        raise ValueError(msg)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    msg = f"{value!r} is not an integer"
    raise ValueError(msg)


def _parse_float(value: object) -> float:
    if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        number = float(value)
    else:
        msg = f"{value!r} is not a number"
        raise ValueError(msg)
    if not math.isfinite(number):
        msg = f"{value!r} is not a finite number"
        raise ValueError(msg)
    return number


def _parse_string(value: object) -> str:
    if isinstance(value, str):
        if not value.strip():
            msg = f"{value!r} is blank (leave the key unset for its default)"
            raise ValueError(msg)
        return value
    msg = f"{value!r} is not a string"
    raise ValueError(msg)


class OptionType(enum.Enum):
    """The value forms an option accepts; ``expected`` describes each for error messages."""

    STRING = ("string", _parse_string)
    INT = ("integer, e.g. 3", _parse_int)
    FLOAT = ("number, e.g. 0.5", _parse_float)
    BOOL = ("boolean: true or false", _parse_bool)
    DURATION = ("duration with a unit: ms, s, min, h, d, e.g. 10ms, 1s, 2min", parse_duration)
    SIZE = ("size with a unit: b, kb, mb, gb, e.g. 5mb", parse_size)
    ENUM = ("one of", _parse_string)

    @property
    def expected(self) -> str:
        """Human description of the accepted form."""
        return self.value[0]


#: Bounds every option of a type has unless it declares a tighter one: what the code
#: can hold (C ints, timer waits, mmap sizes), so a huge value is refused up front.
TYPE_MAXIMUM: dict[OptionType, float] = {
    OptionType.INT: (1 << 31) - 1,
    OptionType.DURATION: 365 * 86400.0,
    OptionType.SIZE: float(1 << 50),
}


@dataclass(frozen=True)
class UnderCheckpoint:
    """Where an unset option defaults to inside a job's checkpoint location (a Spark query's).

    :ivar directory: the sub-directory of the checkpoint location.
    :ivar as_url: the value is an fsspec URL (``file://`` for a local location);
        otherwise a local path, and no default exists for a remote location.
    """

    directory: str
    as_url: bool = False

    def value(self, location: str) -> str | None:
        """The option's value for checkpoint ``location`` (a path or URL); ``None`` when it has none."""
        parsed = urlparse(location)
        if len(parsed.scheme) > 1 and parsed.scheme != "file":  # remote (a one-letter scheme is a drive)
            return f"{location.rstrip('/')}/{self.directory}" if self.as_url else None
        # file:///x, file:/x (Spark's spelling) and plain paths; URL escapes such as %20 decoded
        local = Path(url2pathname(parsed.path)) if parsed.scheme == "file" else Path(location)
        path = local.resolve() / self.directory
        return path.as_uri() if self.as_url else str(path)

    def describe(self) -> str:
        """The sentence the option's documentation ends with."""
        return f"Under Spark, unset, it is {self.directory} in the query's checkpoint location."


T = TypeVar("T")


@dataclass(frozen=True)
class ConfigOption(Generic[T]):
    """One declared configuration option; ``Config.get(option)`` returns its value typed ``T``.

    Declare it as a typed constant where its component lives, e.g.
    ``MAX_LOG_RATIO: ConfigOption[float] = ConfigOption("...", OptionType.FLOAT, 2.0, "...")``.

    A name ending in ``.*`` declares a pass-through prefix (e.g.
    ``dstl.kafka.producer.*``): any key below it is accepted as a string.

    :ivar minimum: lowest accepted value for INT, FLOAT, DURATION and SIZE options.
    :ivar maximum: highest accepted value; unset, the type's own bound applies
        (:data:`TYPE_MAXIMUM`: what the code can hold, e.g. a timer's longest wait).
    :ivar aliases: keys that mean this option (a config holds it under its name).
    """

    name: str
    type: OptionType
    default: T
    doc: str
    choices: Sequence[str] = ()
    minimum: float | None = None
    maximum: float | None = None
    #: Other names the option is accepted under (Flink's current or deprecated keys).
    aliases: Sequence[str] = ()
    #: Where the option defaults to in a job's checkpoint location, when it has such a default.
    under_checkpoint: UnderCheckpoint | None = None

    @property
    def full_doc(self) -> str:
        """The documentation, with where it defaults to in a checkpoint location."""
        if self.under_checkpoint is None:
            return self.doc
        return f"{self.doc} {self.under_checkpoint.describe()}"

    @property
    def is_prefix(self) -> bool:
        """Whether the option declares a pass-through key prefix."""
        return self.name.endswith(".*")

    @property
    def type_name(self) -> str:
        """Short type name for tables: ``duration``, ``size``, ``fixed|none``."""
        if self.is_prefix:
            return "pass-through"
        if self.type is OptionType.ENUM:
            return "|".join(self.choices)
        return self.type.name.lower()

    @property
    def expected(self) -> str:
        """Human description of the accepted form, naming the choices of an enum."""
        if self.type is OptionType.ENUM:
            return "one of " + "|".join(self.choices)
        if self.is_prefix:
            return "any string (passed through)"
        return self.type.expected

    def parse(self, key: str, value: object) -> Any:
        """Parse ``value`` for ``key`` or raise :class:`ConfigError` naming both and the form."""
        if self.is_prefix:
            if isinstance(value, str | int | float | bool):
                return value if isinstance(value, str) else str(value).lower()
            msg = f"config key {key!r}: {value!r} must be a string (passed through as is)"
            raise ConfigError(msg)
        try:
            parsed = self.type.value[1](value)
        except (TypeError, ValueError) as exc:
            msg = f"config key {key!r}: {exc}; expected a {self.expected}"
            raise ConfigError(msg) from exc
        if self.type is OptionType.ENUM and parsed not in self.choices:
            msg = f"config key {key!r}: {value!r} is not valid; expected {self.expected}"
            raise ConfigError(msg)
        if self.minimum is not None and parsed < self.minimum:
            msg = f"config key {key!r}: {value!r} is below the minimum {self.minimum:g} ({self.range_text()})"
            raise ConfigError(msg)
        maximum = self.maximum if self.maximum is not None else TYPE_MAXIMUM.get(self.type)
        if maximum is not None and parsed > maximum:
            msg = f"config key {key!r}: {value!r} is above the maximum {maximum:g} ({self.range_text()})"
            raise ConfigError(msg)
        return parsed

    def range_text(self) -> str:
        """The accepted range, e.g. ``1 to 2147483647``."""
        maximum = self.maximum if self.maximum is not None else TYPE_MAXIMUM.get(self.type)
        low = "any" if self.minimum is None else f"{self.minimum:g}"
        high = "any" if maximum is None else f"{maximum:g}"
        return f"accepted: {low} to {high}"

    def default_text(self) -> str:
        """The default rendered in the form a user would type it."""
        default: Any = self.default
        if default is None:
            return "(none)"
        if self.type is OptionType.DURATION:
            return format_duration(default)
        if self.type is OptionType.SIZE:
            return format_size(default)
        if self.type is OptionType.BOOL:
            return str(self.default).lower()
        return str(self.default)
