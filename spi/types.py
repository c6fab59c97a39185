"""Value types of the SPI: key-group ranges, sequence-number ranges and state changes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["META_KEY_GROUP", "KeyGroupRange", "SequenceNumberRange", "StateChange"]

#: Key group of metadata records (state registrations and the like). Metadata is
#: returned by every read, whatever key groups the reader asked for.
META_KEY_GROUP = -1


def _check_int(value: object, what: str) -> int:
    # bool is an int subclass; a True start is a caller bug, not a key group.
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"{what} must be an int, got {type(value).__name__}: {value!r}"
        raise TypeError(msg)
    return value


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """Half-open range ``[start, end)`` of key groups owned by one operator instance.

    Key groups are non-negative. An empty range (``start == end``) is allowed and
    contains nothing.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        """Validate the bounds."""
        _check_int(self.start, "KeyGroupRange.start")
        _check_int(self.end, "KeyGroupRange.end")
        if self.start < 0 or self.end < self.start:
            msg = (
                f"KeyGroupRange({self.start}, {self.end}) is invalid: "
                "need 0 <= start <= end (the range is half-open)"
            )
            raise ValueError(msg)

    def __contains__(self, key_group: object) -> bool:
        """Whether ``key_group`` lies in ``[start, end)``."""
        return isinstance(key_group, int) and self.start <= key_group < self.end

    def __len__(self) -> int:
        """Number of key groups in the range."""
        return self.end - self.start

    def __iter__(self):  # noqa: ANN204 - plain int iterator
        """Iterate over the key groups of the range."""
        return iter(range(self.start, self.end))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """Key groups in both ranges (possibly empty)."""
        start = max(self.start, other.start)
        return KeyGroupRange(start, max(start, min(self.end, other.end)))

    def contains_range(self, other: KeyGroupRange) -> bool:
        """Whether every key group of ``other`` lies in this range."""
        return len(other) == 0 or (self.start <= other.start and other.end <= self.end)


@dataclass(frozen=True, slots=True)
class SequenceNumberRange:
    """Half-open range ``[start, end)`` of change-set sequence numbers (SQNs)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        """Validate the bounds."""
        _check_int(self.start, "SequenceNumberRange.start")
        _check_int(self.end, "SequenceNumberRange.end")
        if self.start < 0 or self.end < self.start:
            msg = (
                f"SequenceNumberRange({self.start}, {self.end}) is invalid: "
                "need 0 <= start <= end (the range is half-open)"
            )
            raise ValueError(msg)

    def __contains__(self, sqn: object) -> bool:
        """Whether ``sqn`` lies in ``[start, end)``."""
        return isinstance(sqn, int) and self.start <= sqn < self.end

    def __len__(self) -> int:
        """Number of SQNs in the range."""
        return self.end - self.start

    @property
    def is_empty(self) -> bool:
        """Whether the range holds no SQN."""
        return self.end == self.start


@dataclass(frozen=True, slots=True)
class StateChange:
    """One state change: opaque bytes under a key group.

    ``sqn`` is the sequence number of the change set the change belongs to; it is
    set by readers and is ``None`` on changes built by callers.
    """

    key_group: int
    data: bytes
    sqn: int | None = None

    @property
    def is_meta(self) -> bool:
        """Whether this is a metadata record (:data:`META_KEY_GROUP`)."""
        return self.key_group == META_KEY_GROUP
