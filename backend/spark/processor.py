"""The user's side: a stateful processor and the context that hands out its state.

Close to PySpark's ``transformWithStateInPandas``: :meth:`StatefulProcessor.init`
registers states through the context, :meth:`StatefulProcessor.handle_input_rows`
is called once per key with that key's rows of the micro-batch (pandas) and
returns the rows to emit. State accessed in ``handle_input_rows`` is the current
key's. A processor that would rather see all of an instance's rows at once
overrides :meth:`StatefulProcessor.handle_input_batch` and binds keys itself with
:meth:`StateContext.set_current_key`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from ..changelog import ChangelogKeyedStateBackend
    from ..state import ListState, MapState, ReducingState, ValueState

__all__ = ["StateContext", "StatefulProcessor"]


class StateContext:
    """Hands out keyed state to a processor, and tells it where it runs.

    :ivar batch_id: the micro-batch being processed.
    :ivar key_groups: the key groups of this operator instance.
    :ivar attempt: Spark's task attempt number (0 on the first attempt).
    """

    def __init__(
        self, backend: ChangelogKeyedStateBackend, batch_id: int, attempt: int, key_columns: tuple[str, ...]
    ) -> None:
        self._backend = backend
        self.batch_id = batch_id
        self.attempt = attempt
        self.key_groups = backend.key_groups
        self.key_columns = key_columns
        self.keys_touched: set[Any] = set()

    def set_current_key(self, key: Any) -> None:  # noqa: ANN401
        """Bind state access to ``key`` (a tuple when the key has several columns)."""
        self._backend.set_current_key(key)
        self.keys_touched.add(key)

    def get_value_state(
        self, name: str, *, ttl: float | None = None, serializer: str = "msgpack"
    ) -> ValueState:
        """A value per key (``ttl``: seconds after a write at which it expires)."""
        return self._backend.value_state(name, serializer, ttl=ttl)

    def get_list_state(
        self, name: str, *, ttl: float | None = None, serializer: str = "msgpack"
    ) -> ListState:
        """A list per key."""
        return self._backend.list_state(name, serializer, ttl=ttl)

    def get_map_state(self, name: str, *, ttl: float | None = None, serializer: str = "msgpack") -> MapState:
        """A map per key (map keys are plain data)."""
        return self._backend.map_state(name, serializer, ttl=ttl)

    def get_reducing_state(
        self,
        name: str,
        reduce: Callable[[Any, Any], Any],
        *,
        ttl: float | None = None,
        serializer: str = "msgpack",
    ) -> ReducingState:
        """A value per key folded with ``reduce``."""
        return self._backend.reducing_state(name, reduce, serializer, ttl=ttl)


class StatefulProcessor(ABC):
    """Per-key logic over keyed state; one instance per operator instance and micro-batch.

    Instances are created on executors (the class is shipped by Spark's pickler),
    so keep constructor arguments small and picklable.
    """

    @abstractmethod
    def init(self, context: StateContext) -> None:
        """Register the states this processor uses (called before any rows)."""

    @abstractmethod
    def handle_input_rows(self, key: Any, rows: pd.DataFrame) -> pd.DataFrame | Iterable[dict] | None:  # noqa: ANN401
        """Process one key's rows of the micro-batch; return the rows to emit (or ``None``).

        :param key: the key value (a tuple when the key has several columns).
        """

    def handle_input_batch(self, rows: pd.DataFrame, context: StateContext) -> Iterator[dict]:
        """Process all of this instance's rows of the batch; by default, key by key.

        Override it to process the rows in one pass (call ``context.set_current_key``
        before touching state); return or yield the rows to emit.
        """
        for raw_key, key_rows in rows.groupby(list(context.key_columns), sort=False, dropna=False):
            parts = raw_key if isinstance(raw_key, tuple) else (raw_key,)
            key = plain(parts[0]) if len(parts) == 1 else tuple(plain(p) for p in parts)
            context.set_current_key(key)
            result = self.handle_input_rows(key, key_rows)
            if result is None:
                continue
            if hasattr(result, "to_dict"):  # a pandas DataFrame
                yield from result.to_dict("records")
            else:
                yield from result

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called after the instance's rows of the batch were processed (before the checkpoint)."""


def plain(value: Any) -> Any:  # noqa: ANN401
    """Numpy scalars as the Python values the key hash knows (``int``, ``float``, ``str``...)."""
    return value.item() if hasattr(value, "item") else value
