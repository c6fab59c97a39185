"""The changelog keyed-state backend: delegate + DSTL writer, checkpoint and restore.

Every mutation is applied to the delegate and appended to the DSTL writer under
its key group; state registrations are appended as metadata, so a restore knows
the states without the code that registered them. Materialization (snapshots
that let the log be truncated) runs in :class:`Materializer`; a checkpoint is the
latest snapshot chain plus the log persisted after it.
"""

from __future__ import annotations

import collections
import gc
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dstl.spi import (
    ChangelogHandle,
    Config,
    ConfigError,
    InvalidHandleError,
    KeyGroupRange,
    StateChangelogReader,
    StateChangelogStorage,
    log_id_for,
    storage_for_handle,
    validate_name,
)

from ..delegate import HeapDelegate, StateDelegate
from ..documents import check_fields, parse_json
from ..filesystems import storage_options
from ..keygroups import DEFAULT_MAX_PARALLELISM, key_group_for
from ..materialization import MaterializationRef
from ..options import option_default
from ..serialization import Serializer, serializer_for
from ..state import (
    KeySet,
    ListState,
    MapState,
    ReducingState,
    StateDescriptor,
    StateKind,
    ValueState,
    map_key_bytes,
)
from ..timers import RESERVED_PREFIX, TimerService
from ..ttl import TTL_SUFFIX
from .materializer import Materializer
from .metrics import BackendMetrics
from .records import Op, encode_change, encode_registration
from .replay import apply_change, replay, visit

__all__ = ["BackendSnapshot", "ChangelogKeyedStateBackend", "catch_up_delta", "rebase"]

_REPLACING = frozenset({Op.VALUE_PUT, Op.CLEAR, Op.LIST_SET})  # the entry after them ignores what came before
_MIN_MATERIALIZED_FOR_RATIO = 1 << 20  # below this the log may grow to ratio x 1 MiB before materializing

_STATE_CLASSES = {
    StateKind.VALUE: ValueState,
    StateKind.LIST: ListState,
    StateKind.MAP: MapState,
    StateKind.REDUCING: ReducingState,
}


_MAX_PART_DEPTH = 16  # parts of parts: one level per rescale an instance did not materialize across


@dataclass(frozen=True)
class BackendSnapshot:
    """A checkpoint of one backend: snapshots plus the changelog after them (JSON, never pickle).

    :ivar parts: after rescaling, until the instance's first full snapshot: the
        snapshots it was restored from, each with the key groups its instance owned.
        A restore takes each part for those key groups only (a part of a rescaled
        instance carries history of key groups it never owned), before ``handles``.
    """

    checkpoint_id: int
    handles: tuple[ChangelogHandle, ...]
    materialized: tuple[MaterializationRef, ...] = ()
    #: The previous snapshot chain plus an incremental at ``materialized[0]``'s SQN: what a
    #: working copy of the previous chain loads instead of the full ``materialized[0]``.
    bridge: tuple[MaterializationRef, ...] = ()
    parts: tuple[tuple[KeyGroupRange, BackendSnapshot], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (see :meth:`from_dict`)."""
        doc: dict[str, Any] = {
            "checkpoint_id": self.checkpoint_id,
            "handles": [h.to_dict() for h in self.handles],
            "materialized": [m.to_dict() for m in self.materialized],
        }
        if self.bridge:
            doc["bridge"] = [m.to_dict() for m in self.bridge]
        if self.parts:
            doc["parts"] = [
                {"key_groups": [owned.start, owned.end], "snapshot": part.to_dict()}
                for owned, part in self.parts
            ]
        return doc

    def to_json(self) -> str:
        """Serialise for the checkpoint metadata."""
        return json.dumps(self.to_dict())

    @property
    def references(self) -> tuple[MaterializationRef, ...]:
        """Every snapshot object this checkpoint keeps alive (its chain and bridge, its parts')."""
        return (*self.materialized, *self.bridge, *(ref for _, part in self.parts for ref in part.references))

    @property
    def all_handles(self) -> tuple[ChangelogHandle, ...]:
        """Every log handle this checkpoint reads, its parts' included."""
        return (*(h for _, part in self.parts for h in part.all_handles), *self.handles)

    @property
    def all_materialized(self) -> tuple[MaterializationRef, ...]:
        """Every snapshot a restore loads, its parts' included."""
        return (*(ref for _, part in self.parts for ref in part.all_materialized), *self.materialized)

    @classmethod
    def from_json(cls, text: str | bytes) -> BackendSnapshot:
        """Parse and validate (untrusted input)."""
        return cls.from_dict(parse_json(text, "backend snapshot"))

    @classmethod
    def from_dict(cls, doc: Any, _depth: int = 0) -> BackendSnapshot:
        """Validate an already parsed document (e.g. inside a checkpoint).

        :raises InvalidHandleError: naming the field.
        """
        doc = check_fields(doc, "backend snapshot", {"checkpoint_id": int, "handles": list})
        if doc["checkpoint_id"] < 0:
            msg = f"backend snapshot field 'checkpoint_id' must be non-negative, got {doc['checkpoint_id']}"
            raise InvalidHandleError(msg)
        refs = {}
        for field in ("materialized", "bridge"):
            value = doc.get(field, [])
            if not isinstance(value, list):
                msg = f"backend snapshot field {field!r} must be a list"
                raise InvalidHandleError(msg)
            refs[field] = tuple(MaterializationRef.from_dict(m) for m in value)
        return cls(
            doc["checkpoint_id"],
            tuple(ChangelogHandle.from_dict(h) for h in doc["handles"]),
            refs["materialized"],
            refs["bridge"] if refs["materialized"] else (),
            _parts_from(doc.get("parts", []), _depth),
        )


def _parts_from(value: Any, depth: int) -> tuple[tuple[KeyGroupRange, BackendSnapshot], ...]:
    """The validated ``parts`` of a snapshot document."""
    if not isinstance(value, list):
        msg = "backend snapshot field 'parts' must be a list"
        raise InvalidHandleError(msg)
    if value and depth >= _MAX_PART_DEPTH:
        msg = f"backend snapshot parts nest deeper than {_MAX_PART_DEPTH} levels (damaged or forged)"
        raise InvalidHandleError(msg)
    parts = []
    for part in value:
        part = check_fields(part, "backend snapshot part", {"key_groups": list})
        bounds = part["key_groups"]
        if len(bounds) != 2 or not all(type(b) is int for b in bounds) or not 0 <= bounds[0] <= bounds[1]:
            msg = f"backend snapshot part 'key_groups' must be [start, end], got {bounds!r:.60}"
            raise InvalidHandleError(msg)
        parts.append((KeyGroupRange(*bounds), BackendSnapshot.from_dict(part.get("snapshot"), depth + 1)))
    return tuple(parts)


def catch_up_delta(held: BackendSnapshot, target: BackendSnapshot) -> BackendSnapshot | None:
    """What ``target`` adds to a state that holds ``held``, or ``None`` when it is no continuation.

    A ``target`` whose chain starts with a new full snapshot continues ``held`` through
    its bridge: the previous chain plus the keys changed up to the full snapshot.
    """
    delta = _chain_delta(held, target)
    if delta is None and target.bridge:
        bridged = (*target.bridge, *target.materialized[1:])
        delta = _chain_delta(held, BackendSnapshot(target.checkpoint_id, target.handles, bridged))
    return delta


def rebase(
    current: BackendSnapshot, materialized_at: BackendSnapshot, rebased: BackendSnapshot
) -> BackendSnapshot | None:
    """``current`` moved onto a snapshot chain that completed after it was taken, or ``None``.

    ``rebased`` is checkpoint ``materialized_at`` as the new chain sees it: the chain
    plus the log from its SQN (see :meth:`ChangelogKeyedStateBackend.checkpoint_materializing`).
    ``current`` must continue ``materialized_at``: the same chain, and its handles
    first, then the ones added since, which stay.
    """
    known = len(materialized_at.handles)
    if current.materialized != materialized_at.materialized or current.parts != materialized_at.parts:
        return None  # materialized otherwise since: another lineage
    if [h.to_json() for h in current.handles[:known]] != [h.to_json() for h in materialized_at.handles]:
        return None
    return BackendSnapshot(
        current.checkpoint_id,
        (*rebased.handles, *current.handles[known:]),
        rebased.materialized,
        rebased.bridge,
        rebased.parts,
    )


def _chain_delta(held: BackendSnapshot, target: BackendSnapshot) -> BackendSnapshot | None:
    known = len(held.materialized)
    if tuple(target.materialized[:known]) != tuple(held.materialized) or held.parts != target.parts:
        return None  # a new full snapshot, or another chain
    extra = tuple(target.materialized[known:])
    held_handles = {handle.to_json() for handle in held.handles}
    target_handles = {handle.to_json() for handle in target.handles}
    if extra:
        if not held.materialized:
            return None  # the first snapshot of a chain is full
        if held_handles & target_handles:
            # The snapshots were taken before some of what held applied (materialized in the
            # background, then rebased): loading them would take those keys back.
            return None
        return BackendSnapshot(target.checkpoint_id, tuple(target.handles), extra)
    if not held_handles <= target_handles:
        return None  # held is not an ancestor (e.g. a lost attempt's log)
    added = tuple(handle for handle in target.handles if handle.to_json() not in held_handles)
    return BackendSnapshot(target.checkpoint_id, added, ())


def _lmdb_delegate(
    cfg: Config, storage: StateChangelogStorage, operator_id: str, key_groups: KeyGroupRange
) -> StateDelegate:
    from ..delegate import LmdbDelegate

    base = cfg["state.backend.lmdb.dir"]
    if not base:
        msg = "state.backend.delegate=lmdb needs state.backend.lmdb.dir: a directory on local disk"
        raise ConfigError(msg)
    job = getattr(storage, "job_id", "job")
    # Validated before anything is created: the names become directories under base.
    log_id_for(operator_id, key_groups)
    path = f"{base}/{validate_name(job, 'job id')}/{operator_id}/kg{key_groups.start}-{key_groups.end}"
    delegate = LmdbDelegate(path, map_size=int(cfg["state.backend.lmdb.map-size"]))
    # A file left by an earlier backend is at no known checkpoint (only the Spark working copy
    # vouches for one, with its stamp): this backend starts empty and restores into it.
    delegate.clear()
    return delegate


@contextmanager
def _bulk_load() -> Iterator[None]:
    """Pause the cyclic garbage collector while a restore creates millions of acyclic objects.

    Its passes scale with every live object of the process; during a bulk load they only
    cost time (nothing created here forms cycles).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _never_called(_a: Any, _b: Any) -> Any:
    msg = "a reducing state known only from the checkpoint cannot be added to: register it with its function"
    raise AssertionError(msg)


class ChangelogKeyedStateBackend:
    """Keyed state of one operator instance over ``key_groups``, logged to a DSTL.

    :param storage: the DSTL storage (shared by the operators of the process).
    :param epoch: the writer epoch (task attempt): a newer one fences this backend.
    :param serializers: the value serializer of a serializer name (read-only tools
        pass one that never unpickles what a checkpoint holds).

    Defaults are the declared options' (``dstl config``); :meth:`from_config` reads
    them from a config. Without ``materialization_interval`` the caller decides when
    to materialize (``max_log_ratio`` still applies with a ``snapshot_dir``).
    """

    def __init__(
        self,
        storage: StateChangelogStorage,
        operator_id: str,
        key_groups: KeyGroupRange,
        *,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        epoch: int = 0,
        delegate: StateDelegate | None = None,
        snapshot_dir: str | None = None,
        max_failures_allowed: int = option_default("state.changelog.max-failures-allowed"),
        materialization_interval: float | None = None,
        full_materialization_every: int = option_default("state.changelog.materialization.full-every"),
        clock: Callable[[], float] = time.time,
        max_log_ratio: float = option_default("state.changelog.materialization.max-log-ratio"),
        squash_updates: bool = option_default("state.changelog.squash-updates"),
        fork_replay_from: int = option_default("state.changelog.restore.fork-replay-from"),
        bridge_full_snapshots: bool = option_default("state.changelog.materialization.bridge"),
        snapshot_compression: str = option_default("state.changelog.materialization.compression"),
        max_tracked_keys: int = option_default("state.changelog.materialization.max-tracked-keys"),
        ttl_cleanup_per_checkpoint: int = option_default("state.ttl.cleanup.keys-per-checkpoint"),
        snapshot_storage_options: Mapping[str, Any] | None = None,
        serializers: Callable[[str], Serializer] = serializer_for,
    ) -> None:
        if not KeyGroupRange(0, max_parallelism).contains_range(key_groups):
            msg = f"key groups {key_groups} exceed max_parallelism {max_parallelism}"
            raise ValueError(msg)
        self.storage = storage
        self.operator_id = operator_id
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.delegate = delegate or HeapDelegate()
        self.writer = storage.create_writer(operator_id, key_groups, epoch=epoch)
        self._log_start = self.writer.initial_sqn()
        self._states: dict[str, Any] = {}
        self._serializers = serializers  # read-only tools decode untrusted pickle by size only
        self._provisional: set[str] = set()  # registered by known_state, not by the caller
        self._timers: TimerService | None = None
        self._expired_queue: collections.deque[tuple[str, int, bytes]] = collections.deque()
        self._ttl_cleanup_per_checkpoint = ttl_cleanup_per_checkpoint
        self._restored_kinds: dict[str, tuple[str, str]] = {}
        self._restored_handles: tuple[ChangelogHandle, ...] = ()
        self._restored_parts: tuple[tuple[KeyGroupRange, BackendSnapshot], ...] = ()
        self._key: tuple[int, bytes] | None = None
        self._restored_refs: tuple[MaterializationRef, ...] = ()
        self._restored_bridge: tuple[MaterializationRef, ...] = ()
        self.materializer = Materializer(
            self,
            snapshot_dir,
            max_failures_allowed,
            full_materialization_every,
            bridge=bridge_full_snapshots,
            codec=snapshot_compression,
            max_tracked_keys=max_tracked_keys,
            storage_options=snapshot_storage_options,
        )
        self._interval = materialization_interval
        self._max_log_ratio = max_log_ratio if snapshot_dir else 0.0
        # Squashing: a change that replaces a key's entry waits here until the next checkpoint,
        # materialization or non-replacing change of that entry; a newer one replaces it.
        self._squash = squash_updates
        self._fork_replay_from = fork_replay_from
        self._pending: dict[tuple[int, int, bytes], bytes] = {}
        self._last_materialization_start = time.monotonic()
        self._truncated_to = self._log_start
        self.clock = clock  # wall clock of state TTL (injectable for tests)
        self._metrics = BackendMetrics()

    @classmethod
    def from_config(
        cls,
        storage: StateChangelogStorage,
        operator_id: str,
        key_groups: KeyGroupRange,
        config: Config | Mapping[str, Any],
        *,
        epoch: int = 0,
        delegate: StateDelegate | None = None,
        periodic_materialization: bool = True,
    ) -> ChangelogKeyedStateBackend:
        """A backend configured by ``state.*`` keys: every caller builds one here, from the options.

        :param periodic_materialization: materialize by ``...interval`` and
            ``...max-log-ratio`` when a snapshot dir is set; ``False`` when the caller
            decides when (the Spark driver plans materializations across instances).
        """
        cfg = Config.of(config)
        snapshot_dir = cfg["state.checkpoints.dir"]
        periodic = periodic_materialization and bool(snapshot_dir)
        if delegate is None and cfg["state.backend.delegate"] == "lmdb":
            delegate = _lmdb_delegate(cfg, storage, operator_id, key_groups)
        return cls(
            storage,
            operator_id,
            key_groups,
            max_parallelism=int(cfg["state.backend.max-parallelism"]),
            epoch=epoch,
            delegate=delegate,
            snapshot_dir=snapshot_dir,
            max_failures_allowed=int(cfg["state.changelog.max-failures-allowed"]),
            full_materialization_every=int(cfg["state.changelog.materialization.full-every"]),
            materialization_interval=float(cfg["state.changelog.materialization.interval"])
            if periodic
            else None,
            max_log_ratio=float(cfg["state.changelog.materialization.max-log-ratio"]) if periodic else 0.0,
            squash_updates=bool(cfg["state.changelog.squash-updates"]),
            fork_replay_from=int(cfg["state.changelog.restore.fork-replay-from"]),
            bridge_full_snapshots=bool(cfg["state.changelog.materialization.bridge"]),
            snapshot_compression=str(cfg["state.changelog.materialization.compression"]),
            max_tracked_keys=int(cfg["state.changelog.materialization.max-tracked-keys"]),
            ttl_cleanup_per_checkpoint=int(cfg["state.ttl.cleanup.keys-per-checkpoint"]),
            snapshot_storage_options=storage_options(cfg),
        )

    # -- keys --------------------------------------------------------------------------------
    def set_current_key(self, key: object) -> None:
        """Bind state access to ``key`` (its key group must belong to this backend)."""
        key_group = key_group_for(key, self.max_parallelism)
        if key_group not in self.key_groups:
            msg = (
                f"key {key!r} is in key group {key_group}, outside this backend's "
                f"[{self.key_groups.start}, {self.key_groups.end}): the row was routed to the wrong instance"
            )
            raise ValueError(msg)
        self._key = (key_group, map_key_bytes(key))

    def key_set(self, keys: Iterable[Any]) -> KeySet:
        """Bind ``keys`` once for bulk state access (``*_many``): their key groups and stored bytes."""
        keys = tuple(keys)
        max_parallelism, start, end = self.max_parallelism, self.key_groups.start, self.key_groups.end
        groups = tuple(key_group_for(key, max_parallelism) for key in keys)
        for key, key_group in zip(keys, groups, strict=True):
            if not start <= key_group < end:
                self.set_current_key(key)  # raises, naming the key and its key group
        return KeySet(keys, groups, tuple(map_key_bytes(key) for key in keys))

    @contextmanager
    def bound_to(self, key_group: int, key: bytes) -> Iterator[None]:
        """Bind state access to a key by its stored bytes for a block (then the previous key again).

        For dstl's own bookkeeping that finds keys in the store (TTL cleanup,
        dropping a state, timers), not for user code: the key group is trusted.
        """
        saved = self._key
        self._key = (key_group, key)
        try:
            yield
        finally:
            self._key = saved

    def _current(self) -> tuple[int, bytes]:
        if self._key is None:
            msg = "no current key: call set_current_key(key) before using keyed state"
            raise RuntimeError(msg)
        return self._key

    def _apply(self, op: Op, state_id: int, state: str, *args: Any) -> None:
        key_group, key = self._current()
        record = encode_change(op, state_id, key, *args)
        # The working state first: a write it refuses (a full disk) must not be in the log either.
        apply_change(self.delegate, state, key_group, key, op, list(args))
        self._log(op, state_id, key_group, key, record)
        self.materializer.changed(state, key_group, key)

    def _log(self, op: Op, state_id: int, key_group: int, key: bytes, record: bytes) -> None:
        """Append ``record`` of an applied change (replacing changes of one entry may be squashed)."""
        if self._squash and op in _REPLACING:
            self._pending[(key_group, state_id, key)] = record
            return
        if self._pending:  # an earlier replacing change of this entry goes first
            earlier = self._pending.pop((key_group, state_id, key), None)
            if earlier is not None:
                self.writer.append(key_group, earlier)
        self.writer.append(key_group, record)

    def _apply_many(
        self, op: Op, state_id: int, state: str, keys: KeySet, args: Iterable[tuple[Any, ...]]
    ) -> None:
        """:meth:`_apply` for each key with its arguments, stored in one batch per key group where it can.

        Each change is logged only once the working state took it: a batch the
        delegate refuses leaves neither state nor log changed for its key group.
        """
        log, changed = self._log, self.materializer.changed
        batches: dict[int, dict[bytes, Any]] = {}
        records: dict[int, list[tuple[bytes, bytes]]] = {}
        for key_group, key, key_args in zip(keys.groups, keys.raw, args, strict=True):
            record = encode_change(op, state_id, key, *key_args)
            if op is Op.VALUE_PUT:
                batch = batches.get(key_group)
                if batch is None:
                    batch = batches[key_group] = {}
                    records[key_group] = []
                batch[key] = key_args[0]
                records[key_group].append((key, record))
            else:
                apply_change(self.delegate, state, key_group, key, op, list(key_args))
                log(op, state_id, key_group, key, record)
                changed(state, key_group, key)
        for key_group, batch in batches.items():
            self.delegate.write_batch(state, key_group, batch)
            for key, record in records[key_group]:
                log(op, state_id, key_group, key, record)
                changed(state, key_group, key)

    # -- registration ----------------------------------------------------------------------------
    def register(self, descriptor: StateDescriptor) -> Any:
        """Register (or return) the state named ``descriptor.name``.

        :raises ConfigError: when a state of that name exists with another kind or
            serializer (now or in the restored checkpoint), or the name is reserved.
        """
        if descriptor.name.startswith(RESERVED_PREFIX):
            msg = f"state names starting with {RESERVED_PREFIX!r} are dstl's own: rename {descriptor.name!r}"
            raise ConfigError(msg)
        return self._register(descriptor)

    def _register(self, descriptor: StateDescriptor) -> Any:
        """:meth:`register` for any name (dstl's own states, e.g. timers, use it too)."""
        existing = self._states.get(descriptor.name)
        same_form = existing is not None and (
            existing.descriptor.kind,
            existing.descriptor.stored_format,
        ) == (
            descriptor.kind,
            descriptor.stored_format,
        )
        if same_form and existing is not None and descriptor.name in self._provisional:
            # the caller's descriptor (its TTL, its reduce function) replaces the provisional one
            self._provisional.discard(descriptor.name)
            state = _STATE_CLASSES[descriptor.kind](
                self, existing._id, descriptor, self._serializers(descriptor.serializer)
            )
            self._states[descriptor.name] = state
            return state
        if existing is not None:
            if (
                existing.descriptor.kind != descriptor.kind
                or existing.descriptor.stored_format != descriptor.stored_format
            ):
                msg = f"state {descriptor.name!r} is already registered as {existing.descriptor.kind.value}"
                raise ConfigError(msg)
            return existing
        restored = self._restored_kinds.get(descriptor.name)
        if restored is not None and restored != (descriptor.kind.value, descriptor.stored_format):
            msg = (
                f"state {descriptor.name!r} was checkpointed as {restored[0]} state with serializer "
                f"{restored[1]!r}; it cannot be restored as {descriptor.kind.value} "
                f"with {descriptor.stored_format!r} (a '+ttl' suffix means TTL was on)"
            )
            raise ConfigError(msg)
        if descriptor.kind is StateKind.REDUCING and descriptor.reduce is None:
            msg = f"reducing state {descriptor.name!r} needs a reduce function"
            raise ConfigError(msg)
        state_id = len(self._states)
        self.writer.append_meta(
            encode_registration(state_id, descriptor.name, descriptor.kind.value, descriptor.stored_format)
        )
        state = _STATE_CLASSES[descriptor.kind](
            self, state_id, descriptor, self._serializers(descriptor.serializer)
        )
        self._states[descriptor.name] = state
        return state

    def known_state(self, name: str) -> Any | None:
        """State ``name`` as registered in this run, or else as the restored checkpoint knows it.

        ``None`` when neither knows it. A state known only from the checkpoint is
        registered provisionally: with TTL, an unbounded one (its length is not
        recorded, so nothing it holds is taken for expired); reducing, one that cannot
        be added to. A later :meth:`register` of the name replaces that descriptor.
        """
        state = self._states.get(name)
        if state is not None:
            return state
        known = self._restored_kinds.get(name)
        if known is None:
            return None
        kind, stored = known
        serializer, ttl_marked, _ = stored.partition(TTL_SUFFIX)
        self._provisional.add(name)
        return self._register(
            StateDescriptor(
                name,
                StateKind(kind),
                serializer,
                reduce=_never_called if kind == StateKind.REDUCING.value else None,
                ttl=math.inf if ttl_marked else None,
            )
        )

    def drop_state(self, name: str) -> int:
        """Remove state ``name`` of every key (PySpark's ``deleteIfExists``); returns the keys cleared.

        Each key's entry is cleared as :meth:`~..state.ValueState.clear` does, logged,
        so a restore or replay drops it too. A name neither registered in this run nor
        in the restored checkpoint clears nothing. The cost is one clear per key that
        holds the state.

        :raises ConfigError: for dstl's own (reserved) names.
        """
        if name.startswith(RESERVED_PREFIX):
            msg = f"state {name!r} is dstl's own and cannot be deleted"
            raise ConfigError(msg)
        state = self.known_state(name)
        if state is None:
            return 0
        cleared = 0
        for key_group in self.key_groups:
            for raw_key in [raw for raw, _ in self.delegate.entries(name, key_group)]:
                with self.bound_to(key_group, raw_key):
                    state.clear()
                cleared += 1
        return cleared

    def timers(self) -> TimerService:
        """The backend's timer service (its timers are state of internal, reserved names)."""
        if self._timers is None:
            self._timers = TimerService(self)
        return self._timers

    def value_state(self, name: str, serializer: str = "msgpack", *, ttl: float | None = None) -> ValueState:
        """A :class:`ValueState` (``ttl``: seconds after a write at which the value expires)."""
        return self.register(StateDescriptor(name, StateKind.VALUE, serializer, ttl=ttl))

    def list_state(self, name: str, serializer: str = "msgpack", *, ttl: float | None = None) -> ListState:
        """A :class:`ListState` (with ``ttl`` each element expires on its own)."""
        return self.register(StateDescriptor(name, StateKind.LIST, serializer, ttl=ttl))

    def map_state(self, name: str, serializer: str = "msgpack", *, ttl: float | None = None) -> MapState:
        """A :class:`MapState` (with ``ttl`` each entry expires on its own)."""
        return self.register(StateDescriptor(name, StateKind.MAP, serializer, ttl=ttl))

    def reducing_state(
        self,
        name: str,
        reduce: Callable[[Any, Any], Any],
        serializer: str = "msgpack",
        *,
        ttl: float | None = None,
    ) -> ReducingState:
        """A :class:`ReducingState` folding with ``reduce`` (an expired value restarts the fold)."""
        return self.register(StateDescriptor(name, StateKind.REDUCING, serializer, reduce, ttl=ttl))

    def ttl_states(self) -> dict[str, tuple[str, float]]:
        """``name -> (kind, ttl seconds)`` of the registered states with TTL."""
        return {
            name: (state.descriptor.kind.value, state.descriptor.ttl)
            for name, state in self._states.items()
            if state.descriptor.ttl is not None
        }

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self, checkpoint_id: int) -> Future[BackendSnapshot]:
        """Persist the log after the last materialization; snapshot = that + the log handle.

        Before this backend's first materialization the restored snapshots and
        handles are part of every checkpoint; afterwards they are not needed.

        :raises StorageError: when materialization failed more than
            ``max_failures_allowed`` times in a row (the log would grow without bound).
        """
        self.materializer.check_health()
        self._remove_expired()
        self.maybe_materialize()
        began = time.perf_counter()
        own = self.materializer.own_latest
        parts: tuple[tuple[KeyGroupRange, BackendSnapshot], ...] = ()
        base: tuple[ChangelogHandle, ...]
        if own is not None:  # materialized by this backend: its log continues from there
            start, refs, base = own.sqn, self.materializer.chain, ()
            bridge = self.materializer.bridge
        else:  # the restored (or resumed) snapshot, its log, then this writer's log
            start, refs = self._log_start, self.materializer.chain or self._restored_refs
            base = self._restored_handles
            bridge = self.materializer.bridge if self.materializer.chain else self._restored_bridge
            parts = () if self.materializer.chain else self._restored_parts
        result: Future[BackendSnapshot] = Future()
        self.flush_pending()
        persisted = self.writer.persist(start, checkpoint_id)

        def done(future: Future[ChangelogHandle]) -> None:
            try:
                snapshot = BackendSnapshot(checkpoint_id, (*base, future.result()), refs, bridge, parts)
                self._metrics.checkpointed(snapshot, time.perf_counter() - began)
                result.set_result(snapshot)
            except BaseException as exc:
                result.set_exception(exc)

        persisted.add_done_callback(done)
        return result

    def checkpoint_materializing(self, checkpoint_id: int) -> tuple[BackendSnapshot, Future[BackendSnapshot]]:
        """Checkpoint now, with a materialization started now that the checkpoint does not wait for.

        Returns the checkpoint (on the chain as it was) and a future of the same
        checkpoint rebased on the new snapshot once that is complete: the new chain
        plus the log from its SQN. A later checkpoint of the same lineage moves onto
        the new chain with :func:`rebase`; until then, nothing references the snapshot.
        """
        pending = self.materializer.start()
        sqn = self.materializer.running_sqn
        checkpoint = self.checkpoint(checkpoint_id).result()
        tail = self.writer.persist(sqn, checkpoint_id)  # change sets uploaded by the checkpoint: reused
        rebased: Future[BackendSnapshot] = Future()
        settling = threading.Lock()  # the two callbacks may run at once, on two threads

        def settle(_: Future) -> None:
            with settling:
                if not (pending.done() and tail.done()) or rebased.done():
                    return
                try:
                    pending.result()
                    chain, bridge = self.materializer.chain, self.materializer.bridge
                    rebased.set_result(BackendSnapshot(checkpoint_id, (tail.result(),), chain, bridge))
                except BaseException as exc:
                    rebased.set_exception(exc)

        wait([tail])  # the writer may close once the tail is persisted (it needs no upload)
        pending.add_done_callback(settle)
        tail.add_done_callback(settle)
        return checkpoint, rebased

    def flush_pending(self) -> None:
        """Append the squashed changes waiting for the next checkpoint (see ``squash_updates``)."""
        pending, self._pending = self._pending, {}
        for (key_group, _, _), record in pending.items():
            self.writer.append(key_group, record)

    def maybe_materialize(self) -> None:
        """Start a background materialization when due (never blocks).

        Due when the interval has passed, or when the log a restore would replay has
        grown beyond ``max_log_ratio`` times the materialized state: workloads that
        churn state (windows) would otherwise keep far more log than state.
        """
        interval_due = (
            self._interval is not None
            and time.monotonic() - self._last_materialization_start >= self._interval
        )
        metrics = self._metrics
        log_due = self._max_log_ratio > 0 and metrics.full_non_materialized > self._max_log_ratio * max(
            metrics.full_materialized, _MIN_MATERIALIZED_FOR_RATIO
        )
        if interval_due or (log_due and not self.materializer.running):
            self._last_materialization_start = time.monotonic()
            self.materializer.start()  # failures surface through check_health()

    def materialize(self) -> Future[MaterializationRef]:
        """Snapshot the working state in the background (at most one at a time)."""
        return self.materializer.start()

    def notify_checkpoint_complete(self, snapshot: BackendSnapshot) -> None:
        """The checkpoint completed: confirm its change sets; truncate the log it materialized."""
        own = [h for h in snapshot.handles if h.log_id == self.writer.log_id and h.epoch == self.writer.epoch]
        for handle in own:
            self.writer.confirm(handle.sqn_range.start, handle.sqn_range.end, snapshot.checkpoint_id)
        for ref in snapshot.materialized:
            if self.materializer.made(ref) and ref.sqn > self._truncated_to:
                self.writer.truncate(ref.sqn)
                self._truncated_to = ref.sqn

    def restore(self, snapshot: BackendSnapshot, config: Config | Mapping[str, Any] | None = None) -> None:
        """Rebuild the working state from ``snapshot``, keeping only this backend's key groups.

        Handles may come from instances with other key-group ranges (rescaling) and
        from another storage (each handle names its own). The snapshot's parts are
        restored first, each for the key groups its instance owned.
        """
        began = time.perf_counter()
        with _bulk_load():
            self._load_scoped(snapshot, config, self.key_groups)
        if self._timers is not None:
            self._timers.invalidate()
        self._restored_parts = tuple(snapshot.parts)
        self._restored_handles = tuple(snapshot.handles)
        self._restored_refs = tuple(snapshot.materialized)
        self._restored_bridge = tuple(snapshot.bridge)
        self._metrics.continued_from(snapshot)
        # The delegate now holds exactly the snapshot: when its chain is this log's own, the next
        # materialization may be incremental on it, as after a warm resume (no forced full snapshot,
        # which would in turn force every other working copy of the instance to restore in full).
        self.materializer.resumed(
            tuple(snapshot.materialized),
            lambda sink: self._changed_keys(tuple(snapshot.handles), config, sink),
            tuple(snapshot.bridge),
        )
        self._metrics.restore_seconds = time.perf_counter() - began

    def _load_scoped(
        self, snapshot: BackendSnapshot, config: Config | Mapping[str, Any] | None, key_groups: KeyGroupRange
    ) -> None:
        """The parts (each for the key groups it owned), then the chain and log, within ``key_groups``."""
        for owned, part in snapshot.parts:
            scope = owned.intersection(key_groups)
            if len(scope):
                self._load_scoped(part, config, scope)
        if snapshot.materialized or snapshot.handles:
            self._load(snapshot, config, key_groups)

    def _load(
        self,
        snapshot: BackendSnapshot,
        config: Config | Mapping[str, Any] | None,
        key_groups: KeyGroupRange | None = None,
    ) -> None:
        """Load ``snapshot``'s key groups ``key_groups`` (default: this backend's) into the delegate."""
        key_groups = key_groups or self.key_groups

        def load_snapshots() -> None:
            for ref in snapshot.materialized:
                for name, (kind, serializer) in self.materializer.load(ref, key_groups).items():
                    self._restored_kinds[name] = (kind, serializer)

        with self._readers(snapshot.handles, config) as sources:
            replay(
                sources,
                key_groups,
                self.delegate,
                self._registered,
                load_snapshots,
                fork_from=self._fork_replay_from,
            )

    def catch_up(
        self,
        held: BackendSnapshot,
        target: BackendSnapshot,
        registrations: Mapping[str, tuple[str, str]],
        config: Config | Mapping[str, Any] | None = None,
    ) -> int | None:
        """Bring a working copy that holds ``held`` up to ``target`` by applying only the difference.

        ``held`` must be an earlier checkpoint of the same lineage (the caller checks
        that it completed). Two cases are cheap: the same snapshot chain, where the
        handles ``target`` adds are replayed; or a chain that grew by incremental
        snapshots, which are loaded over the copy (they hold every key changed since
        the previous snapshot, tombstones included), then ``target``'s log. A new
        full snapshot, another key-group range or a foreign chain is no catch-up.

        :returns: the bytes read, or ``None`` when ``target`` does not follow ``held``
            (the caller restores in full; nothing was changed).
        """
        delta = catch_up_delta(held, target)
        if delta is None:
            return None
        began = time.perf_counter()
        with _bulk_load():
            self._load(delta, config)
        self.resume(target, {**registrations, **self._restored_kinds}, config)
        self._metrics.restore_seconds = time.perf_counter() - began
        return sum(h.size for h in delta.handles) + sum(ref.size for ref in delta.materialized)

    def resume(
        self,
        snapshot: BackendSnapshot,
        registrations: Mapping[str, tuple[str, str]],
        config: Config | Mapping[str, Any] | None = None,
    ) -> None:
        """Continue from ``snapshot`` when the delegate already holds exactly its state (warm path).

        Nothing is read: the caller vouches that the working copy is at ``snapshot``
        (e.g. an on-disk delegate stamped with it). The snapshot's chain stays the base
        of incremental materialization; the keys changed since it are read from the
        log only if an incremental materialization runs.

        :param registrations: ``name -> (kind, serializer)`` of the states in ``snapshot``.
        :param config: opens the storages of handles from another storage (as in :meth:`restore`).
        """
        self._restored_kinds.update(registrations)
        if self._timers is not None:
            self._timers.invalidate()
        self._restored_parts = tuple(snapshot.parts)
        self._restored_handles = tuple(snapshot.handles)
        self._restored_refs = tuple(snapshot.materialized)
        self._restored_bridge = tuple(snapshot.bridge)
        self._metrics.continued_from(snapshot)
        self.materializer.resumed(
            snapshot.materialized,
            lambda sink: self._changed_keys(snapshot.handles, config, sink),
            snapshot.bridge,
        )

    def _changed_keys(
        self,
        handles: tuple[ChangelogHandle, ...],
        config: Config | Mapping[str, Any] | None,
        sink: Callable[[str, int, bytes], None],
    ) -> None:
        """``sink(state, key group, key)`` for every change in ``handles`` (for incrementals after resume)."""
        with self._readers(handles, config) as sources:
            for reader, handle in sources:
                visit(reader, handle, self.key_groups, sink, self._registered)

    @contextmanager
    def _readers(
        self, handles: Iterable[ChangelogHandle], config: Config | Mapping[str, Any] | None
    ) -> Iterator[list[tuple[StateChangelogReader, ChangelogHandle]]]:
        """A reader for each handle, of its own storage: this backend's, or one opened for it.

        Readers and opened storages are closed on exit.
        """
        opened: dict[str, StateChangelogStorage] = {}
        readers: dict[str, StateChangelogReader] = {}
        try:
            pairs = []
            for handle in handles:
                if handle.storage_id not in readers:
                    storage = self.storage
                    if handle.storage_id != storage.identifier:
                        storage = opened[handle.storage_id] = storage_for_handle(
                            handle, config, job_id="restore", read_only=True
                        )
                    readers[handle.storage_id] = storage.create_reader()
                pairs.append((readers[handle.storage_id], handle))
            yield pairs
        finally:
            for reader in readers.values():
                reader.close()
            for storage in opened.values():
                storage.close()

    def _remove_expired(self) -> None:
        """Remove from the working state (logged) what full snapshots found expired, a budget per call.

        A full snapshot leaves expired state out; this brings the working state along,
        at most ``ttl_cleanup_per_checkpoint`` keys per checkpoint so that a mass expiry
        does not stall one batch. Each key is checked again: a write since made it live.
        """
        found = self.materializer.take_expired()
        if found:  # the newest full snapshot's findings replace older ones (still expired: found again)
            self._expired_queue = collections.deque(found)
        queue = self._expired_queue
        if not queue:
            return
        for _ in range(min(len(queue), self._ttl_cleanup_per_checkpoint)):
            name, key_group, key = queue.popleft()
            state = self._states.get(name)
            if state is None or state.descriptor.ttl is None or key_group not in self.key_groups:
                continue  # not registered in this run: the next full snapshot leaves it out again
            with self.bound_to(key_group, key):
                state.remove_expired()

    def expect_expired(self, found: Iterable[tuple[str, int, bytes]]) -> None:
        """Queue keys a full snapshot found expired (e.g. by an earlier task of this instance).

        They are removed from the working state at the next checkpoints, within the
        cleanup budget, each checked again first: they replace what was queued.
        """
        self._expired_queue = collections.deque(found)

    def pending_expired(self) -> list[tuple[str, int, bytes]]:
        """Queued expired keys the cleanup budget has not reached yet."""
        return list(self._expired_queue)

    def _expired(self, entries: int) -> None:
        """A state found ``entries`` expired values or elements and removed them (TTL cleanup)."""
        self._metrics.expired_removed += entries

    def metrics(self) -> dict[str, float]:
        """Flink-named metrics of the latest checkpoint, restore and materializations."""
        return self._metrics.as_dict(self.materializer)

    def _registered(self, name: str, kind: str, serializer: str) -> None:
        self._restored_kinds[name] = (kind, serializer)

    # -- what the materializer needs (MaterializationTarget) ----------------------------------------
    @property
    def job_id(self) -> str:
        """The job the storage was opened for (snapshots go under ``<job>/snapshots/``)."""
        return str(getattr(self.storage, "job_id", "job"))

    @property
    def log_id(self) -> str:
        """The changelog of this backend."""
        return self.writer.log_id

    def begin_materialization(self) -> int:
        """Flush squashed changes and log the registrations; returns the SQN the log continues at.

        Squashed changes belong before the snapshot's SQN; the log after it must
        describe its states by itself.
        """
        self.flush_pending()
        sqn = self.writer.next_sqn()
        self._log_registrations()
        return sqn

    def _log_registrations(self) -> None:
        for state in self._states.values():
            spec = state.descriptor
            record = encode_registration(state._id, spec.name, spec.kind.value, spec.stored_format)
            self.writer.append_meta(record)

    def registrations(self) -> dict[str, tuple[str, str]]:
        """``name -> (kind, serializer)`` of every state known (registered or restored)."""
        known = dict(self._restored_kinds)
        for name, state in self._states.items():
            known[name] = (state.descriptor.kind.value, state.descriptor.stored_format)
        return known

    def close(self, *, wait_for_materialization: bool = True) -> None:
        """Wait for a running materialization, then close the writer (the storage is the caller's).

        :param wait_for_materialization: ``False`` leaves a running materialization to
            finish in the background (it reads a view of the delegate, not the writer).
        """
        if wait_for_materialization:
            self.materializer.close()
        self.writer.close()
