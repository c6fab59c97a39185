"""The changelog keyed-state backend: delegate + DSTL writer, checkpoint and restore.

Every mutation is applied to the delegate and appended to the DSTL writer under
its key group; state registrations are appended as metadata, so a restore knows
the states without the code that registered them. Materialization (snapshots
that let the log be truncated) runs in :class:`Materializer`; a checkpoint is the
latest snapshot chain plus the log persisted after it. The backend is the
:class:`~..keyed.KeyedContext` its states and timers are bound to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from dstl.spi import ChangelogHandle, Config, KeyGroupRange, StateChangelogStorage

from ..delegate import HeapDelegate, StateDelegate
from ..keyed import (
    KeySet,
    Op,
    StateDescriptor,
    StateFactories,
    TimerService,
    map_key_bytes,
    map_keys_bytes,
)
from ..keygroups import key_group_for, key_groups_trusting
from ..materialization import MaterializationRef
from ..serialization import Serializer, serializer_for
from .delegates import delegate_for
from .expiry import ExpiryQueue
from .lineage import catch_up_delta, checkpoint_base
from .materializer import ChainPosition, Materializer
from .metrics import BackendMetrics
from .policy import MaterializationPolicy
from .registry import StateRegistry
from .restore import Loader, bulk_load
from .settings import BackendSettings
from .snapshot import BackendSnapshot
from .snapshot_encoding import SnapshotEncoding
from .writes import ChangeWriter

__all__ = ["ChangelogKeyedStateBackend"]

_NOTHING = BackendSnapshot(0, ())  # the base of a backend that continues no checkpoint


class ChangelogKeyedStateBackend(StateFactories):
    """Keyed state of one operator instance over ``key_groups``, logged to a DSTL.

    :param storage: the DSTL storage (shared by the operators of the process).
    :param epoch: the writer epoch (task attempt): a newer one fences this backend.
    :param serializers: the value serializer of a serializer name (read-only tools
        pass one that never unpickles what a checkpoint holds).

    :param settings: the tunables (:class:`BackendSettings`: the declared options'
        defaults); keyword ``overrides`` replace single fields of it.
        :meth:`from_config` reads them from a config. Without ``materialization_interval``
        the caller decides when to materialize (``max_log_ratio`` still applies with a
        ``snapshot_dir``).
    """

    def __init__(
        self,
        storage: StateChangelogStorage,
        operator_id: str,
        key_groups: KeyGroupRange,
        *,
        epoch: int = 0,
        delegate: StateDelegate | None = None,
        clock: Callable[[], float] = time.time,
        serializers: Callable[[str], Serializer] = serializer_for,
        settings: BackendSettings | None = None,
        **overrides: Any,
    ) -> None:
        # One list of tunables (BackendSettings); keyword overrides replace single fields.
        tuned = replace(settings or BackendSettings(), **overrides)
        max_parallelism = tuned.max_parallelism
        if not KeyGroupRange(0, max_parallelism).contains_range(key_groups):
            msg = f"key groups {key_groups} exceed max_parallelism {max_parallelism}"
            raise ValueError(msg)
        self.settings = tuned
        self.storage = storage
        self.operator_id = operator_id
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.delegate = delegate or HeapDelegate()
        self.writer = storage.create_writer(operator_id, key_groups, epoch=epoch)
        self._log_start = self.writer.initial_sqn()
        self.registry = StateRegistry(self, self.writer.append_meta, serializers)
        self._timers: TimerService | None = None
        self._expired = ExpiryQueue(tuned.ttl_cleanup_per_checkpoint)
        self._base = _NOTHING  # the checkpoint this backend continues (restored or resumed)
        self._key: tuple[int, bytes] | None = None
        self.materializer = Materializer(
            self,
            tuned.snapshot_dir,
            tuned.max_failures_allowed,
            tuned.full_materialization_every,
            bridge=tuned.bridge_full_snapshots,
            encoding=SnapshotEncoding.of(tuned),
            max_tracked_keys=tuned.max_tracked_keys,
            storage_options=tuned.snapshot_storage_options,
        )
        self._loader = Loader(
            storage,
            self.delegate,
            self.materializer,
            key_groups,
            self.registry.restored_state,
            tuned.fork_replay_from,
        )
        self._interval = tuned.materialization_interval
        self._policy = MaterializationPolicy(tuned.max_log_ratio if tuned.snapshot_dir else 0.0)
        squash = tuned.squash_updates
        self._writes = ChangeWriter(self.delegate, self.writer, self.materializer, squash=squash)
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
        settings = BackendSettings.from_config(cfg, periodic_materialization=periodic_materialization)
        if delegate is None:
            delegate = delegate_for(cfg, storage, operator_id, key_groups)
        return cls(storage, operator_id, key_groups, epoch=epoch, delegate=delegate, settings=settings)

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

    def key_set(self, keys: Iterable[Any], *, key_groups: Sequence[int] | None = None) -> KeySet:
        """Bind ``keys`` once for bulk state access (``*_many``): their key groups and stored bytes.

        :param key_groups: theirs when known (Spark routed the rows by them): used once a sample agrees.
        """
        keys = tuple(keys)
        max_parallelism, start, end = self.max_parallelism, self.key_groups.start, self.key_groups.end
        groups = key_groups_trusting(keys, key_groups, max_parallelism)
        if groups and not start <= min(groups) <= max(groups) < end:  # raises, naming the first such key
            self.set_current_key(next(k for k, g in zip(keys, groups, strict=True) if not start <= g < end))
        return KeySet(keys, groups, map_keys_bytes(keys))

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

    def current_key(self) -> tuple[int, bytes]:
        """``(key group, stored key bytes)`` of the bound key."""
        if self._key is None:
            msg = "no current key: call set_current_key(key) before using keyed state"
            raise RuntimeError(msg)
        return self._key

    def log_change(self, op: Op, state_id: int, state: str, *args: Any) -> None:
        """Apply ``op`` to the current key's entry of ``state``, then log it."""
        key_group, key = self.current_key()
        self._writes.apply(op, state_id, state, key_group, key, args)

    def log_changes(
        self, op: Op, state_id: int, state: str, keys: KeySet, args: Iterable[tuple[Any, ...]]
    ) -> None:
        """:meth:`log_change` for each key with its arguments (one batch per key group where it can)."""
        self._writes.apply_many(op, state_id, state, keys, args)

    def log_values(self, state_id: int, state: str, keys: KeySet, values: Sequence[bytes]) -> None:
        """Set the stored value of each key (each once) of ``state``, then log it: one write for all."""
        self._writes.put_values(state_id, state, keys, values)

    # -- registration ----------------------------------------------------------------------------
    def register(self, descriptor: StateDescriptor) -> Any:
        """Register (or return) the state named ``descriptor.name``.

        :raises ConfigError: when a state of that name exists with another kind or
            serializer (now or in the restored checkpoint), or the name is reserved.
        """
        return self.registry.register(descriptor)

    def register_internal(self, descriptor: StateDescriptor) -> Any:
        """Register one of dstl's own states (reserved names only, e.g. timers')."""
        return self.registry.register_internal(descriptor)

    def known_state(self, name: str) -> Any | None:
        """State ``name`` as registered in this run, or else as the restored checkpoint knows it.

        ``None`` when neither knows it. A state known only from the checkpoint is
        registered provisionally (see :meth:`StateRegistry.known`); a later
        :meth:`register` of the name replaces that descriptor.
        """
        return self.registry.known(name)

    def drop_state(self, name: str) -> int:
        """Remove state ``name`` of every key (PySpark's ``deleteIfExists``); returns the keys cleared.

        Each key's entry is cleared as :meth:`~..state.ValueState.clear` does, logged,
        so a restore or replay drops it too. A name neither registered in this run nor
        in the restored checkpoint clears nothing. The cost is one clear per key that
        holds the state.

        :raises ConfigError: for dstl's own (reserved) names.
        """
        return self.registry.drop(name, self.delegate, self.bound_to)

    def timers(self) -> TimerService:
        """The backend's timer service (its timers are state of internal, reserved names)."""
        if self._timers is None:
            self._timers = TimerService(self)
        return self._timers

    def ttl_states(self) -> dict[str, tuple[str, float]]:
        """``name -> (kind, ttl seconds)`` of the registered states with TTL."""
        return self.registry.ttl_states()

    def registrations(self) -> dict[str, tuple[str, str]]:
        """``name -> (kind, serializer)`` of every state known (registered or restored)."""
        return self.registry.registrations()

    def count_expired(self, entries: int) -> None:
        """A state found ``entries`` expired values or elements and removed them (TTL cleanup)."""
        self._metrics.expired_removed += entries

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self, checkpoint_id: int) -> Future[BackendSnapshot]:
        """Persist the log after the last materialization; snapshot = that + the log handle.

        Before this backend's first materialization the restored snapshots and
        handles are part of every checkpoint; afterwards they are not needed.

        :raises StorageError: when materialization failed more than
            ``max_failures_allowed`` times in a row (the log would grow without bound).
        """
        return self._checkpoint(checkpoint_id, None)

    def _checkpoint(self, checkpoint_id: int, position: ChainPosition | None) -> Future[BackendSnapshot]:
        """:meth:`checkpoint` on ``position`` (``None``: the chain as it is once due work started)."""
        self.materializer.check_health()
        self._remove_expired()
        self.maybe_materialize()
        began = time.perf_counter()
        # the chain read at one moment: a materialization completing meanwhile must not put this log's
        # start on one chain and its references on the next (the log would replay what the snapshot holds)
        position = position or self.materializer.position()
        start, refs, base, bridge, parts = checkpoint_base(position, self._base, self._log_start)
        result: Future[BackendSnapshot] = Future()
        self.flush_pending()
        persisted = self.writer.persist(start, checkpoint_id)
        changes = self._writes.take_counts()

        def done(future: Future[ChangelogHandle]) -> None:
            try:
                snapshot = BackendSnapshot(checkpoint_id, (*base, future.result()), refs, bridge, parts)
                self._metrics.checkpointed(snapshot, time.perf_counter() - began, changes)
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
        position = self.materializer.position()  # the chain as it was: not the one being made now
        pending = self.materializer.start()
        sqn = self.materializer.running_sqn
        checkpoint = self._checkpoint(checkpoint_id, position).result()
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
        self._writes.flush()

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
        log_due = self._policy.log_outgrew(metrics.full_non_materialized, metrics.full_materialized)
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

    # -- restore -------------------------------------------------------------------------------
    def restore(self, snapshot: BackendSnapshot, config: Config | Mapping[str, Any] | None = None) -> None:
        """Rebuild the working state from ``snapshot``, keeping only this backend's key groups.

        Handles may come from instances with other key-group ranges (rescaling) and
        from another storage (each handle names its own). The snapshot's parts are
        restored first, each for the key groups its instance owned.
        """
        began = time.perf_counter()
        with bulk_load():
            self._loader.load(snapshot, config)
        self._continue_from(snapshot, config)
        self._metrics.restore_seconds = time.perf_counter() - began

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
        began, read_before = time.perf_counter(), self.materializer.read_bytes
        with bulk_load():
            self._loader.load(delta, config)
        self.resume(target, {**registrations, **self.registry.restored}, config)
        self._metrics.restore_seconds = time.perf_counter() - began
        return sum(h.size for h in delta.handles) + self.materializer.read_bytes - read_before

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
        self.registry.restored.update(registrations)
        self._continue_from(snapshot, config)

    def _continue_from(self, snapshot: BackendSnapshot, config: Config | Mapping[str, Any] | None) -> None:
        """The delegate holds exactly ``snapshot``: it becomes this backend's base.

        When its chain is this log's own, the next materialization may be incremental
        on it (no forced full snapshot, which would in turn force every other working
        copy of the instance to restore in full); the keys changed since are read from
        its log only if an incremental materialization runs.
        """
        if self._timers is not None:
            self._timers.invalidate()
        self._base = snapshot
        self._metrics.continued_from(snapshot)
        self.materializer.resumed(
            snapshot.materialized,
            lambda sink: self._loader.changed_keys(snapshot.handles, config, sink),
            snapshot.bridge,
        )

    # -- TTL cleanup -----------------------------------------------------------------------------
    def _remove_expired(self) -> None:
        """Remove (logged) what full snapshots found expired, within the cleanup budget."""
        found = self.materializer.take_expired()
        self._expired.remove_due(found, self.registry.get, self.bound_to, self.key_groups)

    def expect_expired(self, found: Iterable[tuple[str, int, bytes]]) -> None:
        """Queue keys a full snapshot found expired (e.g. by an earlier task), replacing the queue."""
        self._expired.replace(found)

    def pending_expired(self) -> list[tuple[str, int, bytes]]:
        """Queued expired keys the cleanup budget has not reached yet."""
        return self._expired.pending()

    def metrics(self) -> dict[str, float]:
        """Flink-named metrics of the latest checkpoint, restore and materializations."""
        return self._metrics.as_dict(self.materializer)

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
        self.registry.log_registrations()
        return sqn

    def close(self, *, wait_for_materialization: bool = True) -> None:
        """Wait for a running materialization, then close the writer (the storage is the caller's).

        :param wait_for_materialization: ``False`` leaves a running materialization to
            finish in the background (it reads a view of the delegate, not the writer).
        """
        if wait_for_materialization:
            self.materializer.close()
        self.writer.close()
