"""Key → key group, computed identically in Python and in Spark SQL.

The hash is Spark's ``xxhash64`` (seed 42): Python reproduces it with the
``xxhash`` package, so rows routed in Spark with
``pmod(xxhash64(k1, k2, ...), max_parallelism)`` reach the operator instance whose
backend computes the same key group. Never Python's ``hash()``: it is salted per
process.

Type mapping (Spark's hashing of each type):

- ``str`` → UTF-8 bytes (``StringType``); ``bytes`` → as is (``BinaryType``)
- ``int`` → 8 bytes little-endian (``LongType``, what Spark infers for Python ints)
- ``bool`` → 4-byte int 1/0 (``BooleanType``)
- ``float`` → the IEEE-754 bits of the double, ``-0.0`` as ``0.0`` (``DoubleType``)
- ``None`` → skipped (the running hash passes through, as in Spark)
- a tuple → its fields hashed in order, each seeded with the previous result
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import xxhash

from dstl.spi import KeyGroupRange

__all__ = [
    "instance_name",
    "parse_instance_name",
    "DEFAULT_MAX_PARALLELISM",
    "MAX_KEY_GROUPS",
    "SPARK_SEED",
    "key_group_for",
    "key_groups_trusting",
    "key_groups_for",
    "key_group_range_for_instance",
    "spark_key_group_expr",
    "spark_xxhash64",
]

SPARK_SEED = 42
DEFAULT_MAX_PARALLELISM = 128
#: The most key groups a job may have (Flink's bound too): snapshot readers refuse more.
MAX_KEY_GROUPS = 32768
_MASK = (1 << 64) - 1
_INT = struct.Struct("<i")
_LONG = struct.Struct("<q")
_DOUBLE = struct.Struct("<d")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _hash_field(value: object, seed: int) -> int:
    if value is None:
        return seed
    if isinstance(value, bool):
        data = _INT.pack(1 if value else 0)
    elif isinstance(value, int):
        if not -(1 << 63) <= value < 1 << 63:
            msg = f"key {value} does not fit a 64-bit long (Spark's LongType)"
            raise ValueError(msg)
        data = _LONG.pack(value)
    elif isinstance(value, float):
        if math.isnan(value):
            value = float("nan")  # Spark hashes the canonical NaN
        data = _DOUBLE.pack(0.0 if value == 0.0 else value)
    elif isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    else:
        msg = (
            f"cannot hash a key of type {type(value).__name__}: use str, int, float, bool, bytes, "
            "None or a tuple of them (what Spark's xxhash64 can hash identically)"
        )
        raise TypeError(msg)
    return _signed(xxhash.xxh64_intdigest(data, seed=seed & _MASK))


def spark_xxhash64(key: object) -> int:
    """Spark SQL's ``xxhash64(...)`` of ``key`` (a tuple means several columns)."""
    seed = SPARK_SEED
    for field in key if isinstance(key, tuple) else (key,):
        seed = _hash_field(field, seed)
    return seed


def key_group_for(key: object, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group of ``key``: ``pmod(xxhash64(key), max_parallelism)``."""
    if max_parallelism < 1:
        msg = f"max_parallelism must be at least 1, got {max_parallelism}"
        raise ValueError(msg)
    return spark_xxhash64(key) % max_parallelism


def key_groups_for(keys: Iterable[object], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> list[int]:
    """:func:`key_group_for` of each key (bulk binding): ``str`` and ``int`` keys skip the type dispatch."""
    if max_parallelism < 1:
        msg = f"max_parallelism must be at least 1, got {max_parallelism}"
        raise ValueError(msg)
    digest, seed, half, whole = xxhash.xxh64_intdigest, SPARK_SEED, 1 << 63, 1 << 64
    pack_long = _LONG.pack
    groups = []
    for key in keys:
        if type(key) is str:
            hashed = digest(key.encode("utf-8"), seed)
        elif type(key) is int and -half <= key < half:
            hashed = digest(pack_long(key), seed)
        else:
            groups.append(key_group_for(key, max_parallelism))
            continue
        groups.append((hashed - whole if hashed >= half else hashed) % max_parallelism)
    return groups


#: keys of a batch whose given key groups are checked against their hashes
_KEY_GROUP_SAMPLE = 16


def _agree(keys: Sequence[Any], key_groups: Sequence[int], max_parallelism: int) -> bool:
    """Whether ``key_groups`` are the keys' own: keys all ``str`` or ``int``, a spread sample checked.

    Those two hash the same bytes in Spark and here (UTF-8, a long) for every value,
    so a difference would be one of the whole batch (another ``max_parallelism``, a
    shifted column), which a sample finds; a float's or a date's hash may differ by value.
    """
    if len(key_groups) != len(keys) or not set(map(type, keys)) <= _EXACT_KEY_TYPES:
        return False
    if set(map(type, key_groups)) != {int}:  # e.g. numpy's: what the log's writer refuses
        return False
    sample = range(0, len(keys), max(1, len(keys) // _KEY_GROUP_SAMPLE))
    return key_groups_for([keys[i] for i in sample], max_parallelism) == [key_groups[i] for i in sample]


_EXACT_KEY_TYPES = frozenset({str, int})


def key_groups_trusting(
    keys: Sequence[Any], given: Sequence[int] | None, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> tuple[int, ...]:
    """The keys' key groups: ``given`` once a sample agrees with the keys' hashes, else hashed.

    ``given`` is e.g. what Spark computed to route the rows: hashing again costs more
    than the state's own read of a key.
    """
    if given is not None and _agree(keys, given, max_parallelism):
        return tuple(given)
    return tuple(key_groups_for(keys, max_parallelism))


def key_group_range_for_instance(
    index: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> KeyGroupRange:
    """The contiguous key groups of operator instance ``index`` of ``parallelism`` (Flink's split)."""
    if not 0 < parallelism <= max_parallelism:
        msg = f"parallelism must be in [1, {max_parallelism}] (max_parallelism), got {parallelism}"
        raise ValueError(msg)
    if not 0 <= index < parallelism:
        msg = f"instance index {index} is outside [0, {parallelism})"
        raise ValueError(msg)
    return KeyGroupRange(
        (index * max_parallelism + parallelism - 1) // parallelism,
        ((index + 1) * max_parallelism + parallelism - 1) // parallelism,
    )


def spark_key_group_expr(columns: list[str], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> str:
    """The Spark SQL expression computing the key group of rows keyed by ``columns``."""
    if not columns:
        msg = "at least one key column is needed"
        raise ValueError(msg)
    quoted = ", ".join(f"`{c.replace('`', '``')}`" for c in columns)
    return f"pmod(xxhash64({quoted}), {max_parallelism})"


def instance_name(key_groups: KeyGroupRange) -> str:
    """Name of an instance's snapshot in a checkpoint (its key groups, so rescaling can match them)."""
    return f"kg{key_groups.start}-{key_groups.end}"


def parse_instance_name(name: str) -> KeyGroupRange:
    """Inverse of :func:`instance_name` (names come from checkpoint files: validated)."""
    try:
        start, end = name.removeprefix("kg").split("-")
        return KeyGroupRange(int(start), int(end))
    except ValueError as exc:
        msg = f"checkpoint entry {name!r} is not an instance name like 'kg0-64'"
        raise ValueError(msg) from exc
