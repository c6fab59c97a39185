"""State TTL: expired values are invisible, writes restart the timer, full snapshots drop them."""

import operator

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.spi import ConfigError, KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def _clocked(storage, snapshots, **options):
    """A backend on a clock the test moves, and that clock."""
    clock = Clock()
    backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots, clock=clock, **options)
    return clock, backend


def _ttl_states(backend, ttl=10):
    """A value, a list and a map state, each with ``ttl`` seconds."""
    return (
        backend.value_state("value", ttl=ttl),
        backend.list_state("items", ttl=ttl),
        backend.map_state("pages", ttl=ttl),
    )


@pytest.fixture
def env(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        yield config, storage, (tmp_path / "snapshots").as_uri()


def test_every_kind_expires_after_its_ttl_and_writes_restart_the_timer(env):
    _, storage, snapshots = env
    clock, backend = _clocked(storage, snapshots)
    value, items, pages = _ttl_states(backend)
    total = backend.reducing_state("total", operator.add, ttl=10)
    backend.set_current_key("u")
    value.update("v1")
    items.add("old")
    pages.put("old", 1)
    total.add(5)
    clock.now += 6
    value.update("v2")  # restarts the value's timer
    items.add("new")
    pages.put("new", 2)
    clock.now += 6  # 12 s after the first writes, 6 s after the second
    assert value.value() == "v2"
    assert items.get() == ["new"]
    assert dict(pages.items()) == {"new": 2}
    assert pages.get("old") is None
    assert not pages.contains("old")
    assert total.get() is None
    total.add(3)
    assert total.get() == 3, "an expired value restarts the fold"
    clock.now += 11
    assert value.value() is None
    assert items.get() == []
    assert pages.is_empty()
    backend.close()


def test_full_snapshot_drops_expired_state_and_restore_keeps_the_rest(env):
    config, storage, snapshots = env
    clock, backend = _clocked(storage, snapshots)
    value = backend.value_state("value", ttl=10)
    for n in range(20):
        backend.set_current_key(n)
        value.update(n)
    clock.now += 11
    for n in range(5):
        backend.set_current_key(n)
        value.update(-n)
    ref = backend.materialize().result(timeout=30)
    assert ref.entries == 5, "the 15 expired values are not written to the full snapshot"
    snapshot = backend.checkpoint(1).result(timeout=30)
    backend.close()
    restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots, clock=clock)
    restored.restore(snapshot, config)
    value = restored.value_state("value", ttl=30)  # another duration is allowed
    found = {}
    for n in range(20):
        restored.set_current_key(n)
        found[n] = value.value()
    assert found == {n: (-n if n < 5 else None) for n in range(20)}
    restored.close()


def test_turning_ttl_on_or_off_for_checkpointed_state_is_refused(env):
    config, storage, _ = env
    backend = ChangelogKeyedStateBackend(storage, "op", ALL)
    backend.value_state("with_ttl", ttl=5)
    backend.value_state("without")
    backend.set_current_key("k")
    snapshot = backend.checkpoint(1).result(timeout=30)
    backend.close()
    restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1)
    restored.restore(snapshot, config)
    with pytest.raises(ConfigError, match="'msgpack\\+ttl'.*TTL was on"):
        restored.value_state("without", ttl=5)
    with pytest.raises(ConfigError, match="with_ttl"):
        restored.value_state("with_ttl")
    with pytest.raises(ValueError, match="positive"):
        restored.value_state("bad", ttl=0)
    restored.close()


def test_expired_state_found_on_access_is_removed_from_the_working_state_and_the_log(env):
    config, storage, snapshots = env
    clock, backend = _clocked(storage, snapshots)
    value, items, pages = _ttl_states(backend)
    for n in range(20):
        backend.set_current_key(n)
        value.update(n)
        items.add("old")
        pages.put("old", n)
        pages.put("other", n)
    clock.now += 6
    for n in range(20):
        backend.set_current_key(n)
        items.add("new")
    clock.now += 5  # the first writes expired, the "new" elements did not
    assert value.get_many(range(10)) == [None] * 10
    for n in range(10, 20):
        backend.set_current_key(n)
        assert value.value() is None
    for n in range(20):
        backend.set_current_key(n)
        assert items.get() == ["new"]
        assert pages.get("old") is None
        assert not pages.contains("other")
    assert entry_count(backend.delegate, "value") == 0
    assert entry_count(backend.delegate, "pages") == 0
    assert sum(len(entry) for _, entry in _entries(backend.delegate, "items")) == 20
    assert backend.metrics()["numberOfExpiredEntriesRemoved"] == 20 + 20 + 40
    snapshot = backend.checkpoint(1).result(timeout=30)
    backend.close()
    restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots, clock=clock)
    restored.restore(snapshot, config)  # the removals were logged: the log alone restores without them
    assert entry_count(restored.delegate, "value") == 0 and entry_count(restored.delegate, "pages") == 0
    restored.close()


def _entries(delegate, state):
    return [item for key_group in range(ALL.start, ALL.end) for item in delegate.entries(state, key_group)]


def entry_count(delegate, state):
    return len(_entries(delegate, state))


@pytest.mark.parametrize("delegate", ["heap", "lmdb", "lmdb-encoded-apart"])
def test_a_state_whose_keys_all_expire_shrinks_to_nothing(env, tmp_path, delegate, spawned):
    """No key is read again: a full snapshot finds them expired, the checkpoints after it remove them.

    Encoded apart, the encoder process finds them and hands them back.
    """
    from dstl.backend.delegate import LmdbDelegate

    config, storage, snapshots = env
    clock, backend = _clocked(
        storage,
        snapshots,
        delegate=LmdbDelegate(tmp_path / "lmdb") if delegate != "heap" else None,
        ttl_cleanup_per_checkpoint=3_000,
        encode_apart_from=1 if delegate == "lmdb-encoded-apart" else 0,
    )
    value, items, pages = _ttl_states(backend)
    keys = 2_000
    for n in range(keys):
        backend.set_current_key(n)
        value.update("x" * 50)
        items.add(n)
        pages.put("a", n)
        pages.put("b", n)
    backend.materialize().result(timeout=60)
    snapshot = backend.checkpoint(1).result(timeout=60)
    live = backend.metrics()
    live_size = live["lastFullSizeOfMaterializedState"] + live["lastFullSizeOfNonMaterializedState"]
    clock.now += 11  # every key expires; none is written or read again
    backend.materialize().result(timeout=60)  # full (the last full one is older than the TTL)
    snapshot = backend.checkpoint(2).result(timeout=60)  # 3,000 of the 6,000 (state, key) pairs
    assert sum(entry_count(backend.delegate, state) for state in ("value", "items", "pages")) == 3_000
    snapshot = backend.checkpoint(3).result(timeout=60)  # the rest
    assert all(entry_count(backend.delegate, state) == 0 for state in ("value", "items", "pages"))
    metrics = backend.metrics()
    assert metrics["numberOfExpiredEntriesRemoved"] == keys * (1 + 1 + 2)
    # The removals are logged (a restore must not bring the keys back); the next
    # materialization folds that log into a snapshot of nothing.
    backend.materialize().result(timeout=60)
    snapshot = backend.checkpoint(4).result(timeout=60)
    metrics = backend.metrics()
    full_size = metrics["lastFullSizeOfMaterializedState"] + metrics["lastFullSizeOfNonMaterializedState"]
    assert full_size < 0.05 * live_size, (full_size, live_size)
    backend.close()
    restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots, clock=clock)
    restored.restore(snapshot, config)
    assert all(entry_count(restored.delegate, state) == 0 for state in ("value", "items", "pages"))
    restored.close()
    # the three full snapshots, and the incrementals that read a copy too
    assert len(spawned) >= 3 if delegate == "lmdb-encoded-apart" else not spawned


def test_a_key_written_after_the_snapshot_found_it_expired_is_kept(env):
    _, storage, snapshots = env
    clock, backend = _clocked(storage, snapshots)
    value = backend.value_state("value", ttl=10)
    backend.set_current_key("k")
    value.update(1)
    clock.now += 11
    backend.materialize().result(timeout=30)  # finds "k" expired
    value.update(2)  # written again before the cleanup runs
    backend.checkpoint(1).result(timeout=30)
    assert value.value() == 2
    assert backend.metrics()["numberOfExpiredEntriesRemoved"] == 0
    backend.close()


def test_a_resumed_chain_keeps_its_full_snapshots_ttl_cadence(env):
    """Each Spark task resumes: its first materialization need not be full when the chain's is recent."""
    from dstl.backend.delegate import HeapDelegate

    _, storage, snapshots = env
    delegate = HeapDelegate()
    clock, backend = _clocked(storage, snapshots, delegate=delegate, full_materialization_every=5)
    value = backend.value_state("value", ttl=10)
    for n in range(20):
        backend.set_current_key(f"k{n}")
        value.update(n)
    backend.materialize().result(timeout=30)  # full (the first)
    snapshot = backend.checkpoint(1).result(timeout=30)
    assert snapshot.materialized[0].clock == clock.now
    registrations = backend.registrations()
    backend.close()

    def resumed_materialization(seconds_later, epoch):
        resumed = ChangelogKeyedStateBackend(
            storage,
            "op",
            ALL,
            snapshot_dir=snapshots,
            clock=clock,
            delegate=delegate,
            epoch=epoch,
            full_materialization_every=5,
        )
        resumed.resume(snapshot, registrations)
        resumed.value_state("value", ttl=10)
        clock.now += seconds_later
        resumed.set_current_key("k1")
        resumed.value_state("value", ttl=10).update(-1)
        ref = resumed.materialize().result(timeout=30)
        resumed.close()
        return ref

    assert resumed_materialization(5, epoch=1).clock is None  # incremental: within the TTL
    assert resumed_materialization(10, epoch=2).clock is not None  # full: a TTL went by


def test_a_state_deleted_before_its_registration_keeps_the_ttl_it_is_registered_with(env):
    """drop_state registers a restored state provisionally; the caller's registration then rules."""
    _, storage, snapshots = env
    clock, backend = _clocked(storage, snapshots)
    backend.value_state("seen", ttl=10)
    backend.set_current_key("k")
    backend.value_state("seen", ttl=10).update(1)
    snapshot = backend.checkpoint(1).result(timeout=30)
    backend.close()

    restored = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots, clock=clock, epoch=1)
    restored.restore(snapshot)
    assert restored.drop_state("seen") == 1  # PySpark's deleteIfExists in init, before getValueState
    seen = restored.value_state("seen", ttl=10)
    restored.set_current_key("k")
    seen.update(2)
    clock.now += 11
    assert seen.value() is None  # the registered TTL applies, not the provisional unbounded one
    restored.close()
