"""The user's side: a stateful processor and the context that hands out its state.

Close to PySpark's ``transformWithStateInPandas``: :meth:`StatefulProcessor.init`
registers states through the context, :meth:`StatefulProcessor.handle_input_rows`
is called once per key with that key's rows of the micro-batch (pandas) and
returns the rows to emit. State accessed in ``handle_input_rows`` is the current
key's.

The batch API is faster: a processor that overrides
:meth:`StatefulProcessor.handle_batch` gets all of an instance's rows at once,
grouped by key (:class:`~.batch.KeyedBatch`: sorted once, with key offsets),
reads and writes state in bulk (``get_many``/``update_many`` with
``batch.key_set``) and returns its output column-wise: no pandas object and no
Python call per key.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from ..keyed import TTL_SUFFIX, TimeDomain
from ._private.collected import Collected

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from ..changelog import ChangelogKeyedStateBackend
    from ..keyed import KeySet, ListState, MapState, ReducingState, ValueState
    from .batch import KeyedBatch

    #: What a processor returns: a DataFrame, a mapping of column to values, row dicts, or nothing.
    Output: TypeAlias = pd.DataFrame | Mapping[str, Sequence[Any]] | Iterable[dict] | None

__all__ = ["BatchClock", "StateContext", "StatefulProcessor", "TimeMode", "TouchedKeys"]


class TimeMode(enum.Enum):
    """Which clock a query's timers follow (PySpark's ``timeMode``)."""

    NONE = "none"
    PROCESSING = "processing"
    EVENT = "event"

    @classmethod
    def parse(cls, value: str | TimeMode) -> TimeMode:
        """``none``/``processing``/``event``, or PySpark's ``None``/``ProcessingTime``/``EventTime``."""
        if isinstance(value, TimeMode):
            return value
        spelled = str(value).strip().lower().removesuffix("time")
        for mode in cls:
            if spelled == mode.value:
                return mode
        msg = f"time mode {value!r} is none of none, processing, event (or ProcessingTime, EventTime)"
        raise ValueError(msg)


@dataclass(frozen=True)
class BatchClock:
    """A micro-batch's clocks, the same on every instance of the batch.

    :ivar processing_time_ms: the batch's processing time (epoch ms, taken by the driver).
    :ivar watermark_ms: the event-time watermark of the batch (``None`` without event time, or
        before any event time was seen).
    :ivar mode: the clock timers follow.
    :ivar late_watermark_ms: in event time, rows at or below it are late and dropped: Spark's
        rule, the watermark of the batch before (``None``: as ``watermark_ms``).
    """

    processing_time_ms: int
    watermark_ms: int | None = None
    mode: TimeMode = TimeMode.PROCESSING
    late_watermark_ms: int | None = None

    def late_before(self) -> int | None:
        """Rows at or below this event time are late (``None``: none is): only in event time, as on Spark."""
        if self.mode is not TimeMode.EVENT:
            return None
        return self.watermark_ms if self.late_watermark_ms is None else self.late_watermark_ms

    def timer_domain(self) -> TimeDomain | None:
        """The clock timers follow (``None``: the query has no timers)."""
        if self.mode is TimeMode.NONE:
            return None
        return TimeDomain.EVENT if self.mode is TimeMode.EVENT else TimeDomain.PROCESSING

    def fire_up_to(self) -> int | None:
        """Timers with an expiry at or before this fire in the batch (``None``: none fire)."""
        if self.mode is TimeMode.PROCESSING:
            return self.processing_time_ms
        if self.mode is TimeMode.EVENT:
            return self.watermark_ms
        return None


class StateContext:
    """Hands out keyed state and timers to a processor, and tells it where it runs.

    :ivar batch_id: the micro-batch being processed.
    :ivar key_groups: the key groups of this operator instance.
    :ivar attempt: Spark's task attempt number (0 on the first attempt).
    :ivar clock: the batch's processing time, watermark and time mode.
    """

    def __init__(
        self,
        backend: ChangelogKeyedStateBackend,
        batch_id: int,
        attempt: int,
        key_columns: tuple[str, ...],
        clock: BatchClock | None = None,
        routed_key_groups: np.ndarray | None = None,
    ) -> None:
        self._backend = backend
        #: each input row's key group as Spark's routing computed it (the batch API binds its keys
        #: with them rather than hashing every key again); ``None`` when the rows did not carry them
        self.routed_key_groups = routed_key_groups
        self.batch_id = batch_id
        self.attempt = attempt
        self.key_groups = backend.key_groups
        self.key_columns = key_columns
        self.clock = clock or BatchClock(int(time.time() * 1000))
        self.keys_touched = TouchedKeys()
        #: time spent in steps the task reports (e.g. ``group``), ms
        self.phases_ms: dict[str, float] = {}

    # -- time and timers ---------------------------------------------------------------------------
    def processing_time_ms(self) -> int:
        """The batch's processing time in epoch milliseconds (one value for the whole batch)."""
        return self.clock.processing_time_ms

    def watermark_ms(self) -> int | None:
        """The batch's event-time watermark in epoch ms (``None`` when the query has no event time)."""
        return self.clock.watermark_ms

    def register_timer(self, expiry_ms: int) -> None:
        """Register a timer of the current key at ``expiry_ms`` (the query's time mode's clock).

        It fires in the first batch whose processing time (or watermark, in event
        time) reaches it, through :meth:`StatefulProcessor.handle_expired_timer`.
        """
        self._backend.timers().register(expiry_ms, self._domain())

    def delete_timer(self, expiry_ms: int) -> None:
        """Delete the current key's timer at ``expiry_ms`` (no-op when there is none)."""
        self._backend.timers().delete(expiry_ms, self._domain())

    def list_timers(self) -> list[int]:
        """The current key's timers, earliest first."""
        return self._backend.timers().list(self._domain())

    def restored_serializer(self, name: str) -> str | None:
        """The serializer state ``name`` was checkpointed with (``None``: not in the restored checkpoint)."""
        restored = self._backend.registry.restored.get(name)
        return None if restored is None else restored[1].partition(TTL_SUFFIX)[0]

    def delete_state(self, name: str) -> None:
        """Remove state ``name`` of every key of this instance (PySpark's ``deleteIfExists``)."""
        self._backend.drop_state(name)

    def _domain(self) -> TimeDomain:
        domain = self.clock.timer_domain()
        if domain is None:
            msg = (
                "timers need a time mode: pass time_mode='processing' (or 'event' with an "
                "event_time_column) to transform_with_state"
            )
            raise RuntimeError(msg)
        return domain

    def set_current_key(self, key: Any) -> None:
        """Bind state access to ``key`` (a tuple when the key has several columns)."""
        self._backend.set_current_key(key)
        self.keys_touched.add(key)

    def key_set(
        self, keys: Iterable[Any], *, key_groups: Sequence[int] | None = None, distinct: bool = False
    ) -> KeySet:
        """Bind ``keys`` for bulk state access (a :class:`~.batch.KeyedBatch` has its own, ``key_set``).

        :param key_groups: their key groups when known, used once a sample agrees with their hashes.
        :param distinct: no key is there twice (not checked again; a repeated key's last write wins).
        """
        bound = self._backend.key_set(keys, key_groups=key_groups)
        return replace(bound, known_distinct=True) if distinct else bound

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

    def handle_input_rows(self, key: Any, rows: pd.DataFrame) -> pd.DataFrame | Iterable[dict] | None:
        """Process one key's rows of the micro-batch; return the rows to emit (or ``None``).

        Override it (the per-key API) or :meth:`handle_batch` (the batch API).

        :param key: the key value (a tuple when the key has several columns).
        """
        msg = f"{type(self).__name__} overrides neither handle_input_rows nor handle_batch"
        raise NotImplementedError(msg)

    def handle_batch(self, batch: KeyedBatch, context: StateContext) -> Output:
        """Process all of this instance's rows of the batch, grouped by key; by default, key by key.

        Override it for the batch API: read ``batch.rows`` column-wise with
        ``batch.offsets``, access state in bulk with ``batch.key_set`` (e.g.
        ``state.get_many(batch.key_set)``), and return the output as a DataFrame or a
        mapping of column name to values (one value per output row). Per-key calls
        (``context.set_current_key``) work too.
        """
        collected = Collected()
        for key, rows in batch.per_key():
            context.set_current_key(key)
            collected.add(self.handle_input_rows(key, rows))
        return collected.columns()

    def handle_input_batch(self, rows: pd.DataFrame, context: StateContext) -> Output:
        """All of this instance's rows, ungrouped: groups them (once) and calls :meth:`handle_batch`.

        Override it to group the rows yourself (call ``context.set_current_key``
        before touching state); return the output as :meth:`handle_batch` does, or
        an iterable of row dicts.
        """
        from ._private.grouping import keyed_batch

        return self.handle_batch(keyed_batch(rows, context), context)

    def handle_expired_timer(self, key: Any, expiry_ms: int, context: StateContext) -> Output:
        """A timer of ``key`` fired (it is removed already); returns rows as ``handle_input_rows`` does.

        Called after the batch's input rows, in expiry then key order, with ``key``
        current: the handler reads and writes its state and may register timers
        (one due in this batch fires in it too). By default it emits nothing.
        """
        return None

    def handle_initial_state(self, key: Any, rows: pd.DataFrame, context: StateContext) -> None:
        """Load ``key``'s rows of the query's ``initial_state`` (first batch only, before its rows).

        Override it when the query is started with ``initial_state``.
        """
        msg = f"{type(self).__name__} was given initial_state but does not override handle_initial_state"
        raise NotImplementedError(msg)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called after the instance's rows of the batch were processed (before the checkpoint)."""


class TouchedKeys:
    """The keys a batch touched, counted without a set of a batch's keys (they are distinct already)."""

    def __init__(self) -> None:
        self._batches: list[list[Any]] = []  # each a batch's keys, each key once
        self._more: set[Any] = set()  # keys made current one by one (per-key API, timers)

    def add(self, key: Any) -> None:
        """``key`` was touched (again, maybe)."""
        self._more.add(key)

    def add_distinct(self, keys: list[Any]) -> None:
        """``keys``, each listed once, were touched."""
        self._batches.append(keys)

    def __len__(self) -> int:
        """How many distinct keys were touched."""
        if not self._more and len(self._batches) <= 1:
            return sum(map(len, self._batches))
        return len(self._more.union(*self._batches))


def plain(value: Any) -> Any:
    """Numpy scalars as the Python values the key hash knows (``int``, ``float``, ``str``...)."""
    return value.item() if hasattr(value, "item") else value
