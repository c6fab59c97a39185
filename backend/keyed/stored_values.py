"""A state's serializer as its states use it: a stored value that does not decode is named, not raised raw.

What a state reads back came from its working copy (an LMDB file on the executor's
disk) or from a checkpoint restored into it: bytes that may be damaged or forged. A
value that its serializer cannot decode (or an entry of another kind where a value is
expected) is a :class:`~dstl.spi.CorruptedError` naming the state, the serializer and
the fix, instead of whatever the decoder raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dstl.spi import CorruptedError

from ..serialization import Serializer

__all__ = ["StoredValues"]


class StoredValues(Serializer):
    """``serializer`` for one state: writes as it does; a failed decode is a :class:`CorruptedError`."""

    def __init__(self, serializer: Serializer, state: str) -> None:
        self.name = serializer.name
        self._serializer = serializer
        self._state = state

    def dumps(self, value: Any) -> bytes:
        """The serializer's encoding."""
        return self._serializer.dumps(value)

    def dumps_many(self, values: Sequence[Any]) -> list[bytes]:
        """The serializer's encoding of each value."""
        return self._serializer.dumps_many(values)

    def loads(self, data: bytes) -> Any:
        """The serializer's decoding; :class:`CorruptedError` when the stored bytes do not decode."""
        try:
            return self._serializer.loads(data)
        except Exception as exc:  # whatever a decoder raises on bytes it did not write
            raise self._damaged(exc) from exc

    def loads_many(self, stored: Sequence[bytes | None]) -> list[Any | None]:
        """The serializer's decoding of each stored value (one ``try`` for all: the bulk path)."""
        try:
            return self._serializer.loads_many(stored)
        except Exception as exc:
            raise self._damaged(exc) from exc

    def _damaged(self, exc: Exception) -> CorruptedError:
        msg = (
            f"a stored value of state {self._state!r} does not decode with its serializer {self.name!r} "
            f"({type(exc).__name__}: {exc}): the working state, or the checkpoint it was restored from, "
            "is damaged. Remove the instance's working directory (dstl.spark.working-dir, or "
            "state.backend.lmdb.dir) so that it restores from the checkpoint; if the checkpoint is damaged "
            "too, restore an earlier checkpoint or a savepoint"
        )
        return CorruptedError(msg, location=f"state {self._state!r}")
