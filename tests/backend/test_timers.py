"""Timers: keyed state that fires in time then key order, exactly once across crashes and rescales."""

from __future__ import annotations

import uuid

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from dstl.backend import TimeDomain
from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.backend.keygroups import key_group_range_for_instance
from dstl.spi import ConfigError, KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)
KEYS = st.sampled_from(["alice", "bob", "carol", 7, 42, ("eu", 3), "dave", 13])
TIMES = st.integers(0, 40)
DOMAINS = st.sampled_from(list(TimeDomain))


def _order(key) -> bytes:
    return msgpack.packb(key, use_bin_type=True)


class TimerModel(RuleBasedStateMachine):
    """Timer and state operations on 1–3 instances vs a model; watermarks, checkpoints, crashes, rescales.

    Each fire is processed like a batch: the handler's effect (a count per key) is
    state. A crash goes back to the latest checkpoint: timers fired since then are
    registered again and fire again (their effects were rolled back with them),
    those fired before it never fire again.
    """

    def __init__(self, config: dict, workdir, delegate: str) -> None:
        super().__init__()
        self.config = config
        self.workdir = workdir
        self.delegate = delegate
        self.snapshots = (workdir / f"timers-{uuid.uuid4().hex}").as_uri()
        self.storage = load_storage(config, job_id=f"timers-{uuid.uuid4().hex[:8]}")
        self.epoch = 0
        self.timers: dict[TimeDomain, set[tuple[object, int]]] = {d: set() for d in TimeDomain}
        self.fired_counts: dict[object, int] = {}
        self.watermark = 0
        self.values: dict[object, int] = {}
        self.checkpointed: tuple | None = None  # (snapshots by range, model copy)
        self.next_checkpoint = 1
        self.backends: list[ChangelogKeyedStateBackend] = []
        self.opened: list = []

    @initialize(parallelism=st.integers(1, 3))
    def start(self, parallelism):
        self._open(parallelism, None)

    def _open(self, parallelism: int, restored: list[tuple[KeyGroupRange, BackendSnapshot]] | None) -> None:
        self.epoch += 1
        self.backends = []
        for index in range(parallelism):
            backend = ChangelogKeyedStateBackend(
                self.storage,
                "op",
                key_group_range_for_instance(index, parallelism, ALL.end),
                epoch=self.epoch,
                snapshot_dir=self.snapshots,
                delegate=self._delegate(),
            )
            if restored:
                if len(restored) == 1 and restored[0][0] == ALL:
                    backend.restore(restored[0][1], self.config)
                else:
                    backend.restore(BackendSnapshot(0, (), parts=tuple(restored)), self.config)
            self.backends.append(backend)

    def _delegate(self):
        if self.delegate == "heap":
            return None  # the backend's default
        from dstl.backend.delegate import LmdbDelegate

        delegate = LmdbDelegate(self.workdir / f"lmdb-{uuid.uuid4().hex}")
        self.opened.append(delegate)  # closed at teardown: an example must not keep its files open
        return delegate

    def _owner(self, key) -> ChangelogKeyedStateBackend:
        for backend in self.backends:
            try:
                backend.set_current_key(key)
            except ValueError:
                continue
            return backend
        raise AssertionError(f"no instance owns {key!r}")

    @rule(key=KEYS, expiry=TIMES, domain=DOMAINS)
    def register(self, key, expiry, domain):
        self._owner(key).timers().register(expiry, domain)
        self.timers[domain].add((key, expiry))

    @rule(key=KEYS, expiry=TIMES, domain=DOMAINS)
    def delete(self, key, expiry, domain):
        self._owner(key).timers().delete(expiry, domain)
        self.timers[domain].discard((key, expiry))

    @rule(key=KEYS, domain=DOMAINS)
    def listed(self, key, domain):
        listed = self._owner(key).timers().list(domain)
        assert listed == sorted(e for k, e in self.timers[domain] if k == key)

    @rule(up_to=TIMES, domain=DOMAINS, rearm=st.booleans())
    def fire(self, up_to, domain, rearm):
        self._fire(up_to, domain, rearm)

    @rule(by=st.integers(0, 15), rearm=st.booleans())
    def advance_watermark(self, by, rearm):
        """Event time as a query runs it: a watermark that only moves forward (and is checkpointed)."""
        self.watermark += by
        self._fire(self.watermark, TimeDomain.EVENT, rearm)

    @rule(key=KEYS, value=st.integers(-(2**63), 2**64 - 1))
    def write(self, key, value):
        self._owner(key).value_state("v").update(value)
        self.values[key] = value

    @rule()
    def delete_state(self):
        for backend in self.backends:
            backend.drop_state("v")
        self.values = {}

    def _fire(self, up_to, domain, rearm):
        due = {(k, e) for k, e in self.timers[domain] if e <= up_to}
        fired = []
        for backend in self.backends:
            counts = backend.value_state("fired")
            in_order = []
            for key, expiry in backend.timers().fire(up_to, domain):
                in_order.append((expiry, _order(key)))
                fired.append((key, expiry))
                counts.update((counts.value() or 0) + 1)  # the handler writes the key's state
                if rearm and expiry + 50 <= 100:
                    backend.timers().register(expiry + 50, domain)  # not due: fires later
            assert in_order == sorted(in_order), "not in time, then key order"
        assert sorted(fired, key=repr) == sorted(due, key=repr)
        assert len(set(fired)) == len(fired), "a timer fired twice in one pass"
        self.timers[domain] -= due
        for key, expiry in fired:
            self.fired_counts[key] = self.fired_counts.get(key, 0) + 1
            if rearm and expiry + 50 <= 100:
                self.timers[domain].add((key, expiry + 50))

    @rule()
    def checkpoint(self):
        snapshots = []
        for backend in self.backends:
            snapshot = backend.checkpoint(self.next_checkpoint).result(timeout=30)
            backend.notify_checkpoint_complete(snapshot)
            snapshots.append((backend.key_groups, snapshot))
        self.next_checkpoint += 1
        model = (
            {d: set(t) for d, t in self.timers.items()},
            dict(self.fired_counts),
            self.watermark,
            dict(self.values),
        )
        self.checkpointed = (snapshots, model)

    @rule()
    def materialize(self):
        for backend in self.backends:
            backend.materialize().result(timeout=30)

    @rule(parallelism=st.integers(1, 3))
    def crash_and_restore(self, parallelism):
        for backend in self.backends:
            backend.close(wait_for_materialization=False)
        if self.checkpointed is None:
            self.timers = {d: set() for d in TimeDomain}
            self.fired_counts, self.watermark, self.values = {}, 0, {}
            self._open(parallelism, None)
            return
        snapshots, (timers, counts, watermark, values) = self.checkpointed
        self.timers = {d: set(t) for d, t in timers.items()}
        self.fired_counts, self.watermark, self.values = dict(counts), watermark, dict(values)
        self._open(parallelism, snapshots)

    @invariant()
    def fired_state_matches(self):
        for key in {k for k, _ in self.timers[TimeDomain.EVENT] | self.timers[TimeDomain.PROCESSING]} | set(
            self.fired_counts
        ):
            backend = self._owner(key)
            assert backend.value_state("fired").value() == self.fired_counts.get(key)

    @invariant()
    def state_matches(self):
        for key in ["alice", "bob", "carol", 7, 42, ("eu", 3), "dave", 13]:
            assert self._owner(key).value_state("v").value() == self.values.get(key)

    def teardown(self):
        for backend in self.backends:
            backend.close()  # no materialization runs on: the rule waits for each
        for delegate in self.opened:
            delegate.close()
        self.storage.close()


@pytest.mark.parametrize("delegate", ["heap", "lmdb"])
def test_timers_equal_the_model_across_crashes_and_rescales(tmp_path, delegate):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    run_state_machine_as_test(
        lambda: TimerModel(config, tmp_path, delegate),
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )


def test_timer_state_names_are_reserved(tmp_path):
    with load_storage({"dstl.storage": "local", "dstl.local.dir": str(tmp_path)}, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL)
        with pytest.raises(ConfigError, match="dstl's own"):
            backend.map_state("__dstl.timers.event")
        backend.set_current_key("k")
        with pytest.raises(TypeError, match="epoch milliseconds"):
            backend.timers().register(1.5)
        backend.close()


def test_a_fresh_backend_on_lmdb_fires_by_seeking_not_by_reading_every_timer(tmp_path, monkeypatch):
    """A Spark task is a fresh backend over its working copy: finding due timers must not scan them all."""
    from dstl.backend.delegate import LmdbDelegate

    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        delegate = LmdbDelegate(tmp_path / "lmdb")
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, delegate=delegate)
        keys = [f"user-{n}" for n in range(3_000)]
        for n, key in enumerate(keys):
            backend.set_current_key(key)
            backend.timers().register(1_000 + n // 500, TimeDomain.EVENT)  # 500 keys share each expiry
            backend.timers().register(1 << 40, TimeDomain.EVENT)
        snapshot = backend.checkpoint(1).result(timeout=30)
        registrations = backend.registrations()
        backend.close()

        fresh = ChangelogKeyedStateBackend(storage, "op", ALL, delegate=delegate, epoch=1)
        fresh.resume(snapshot, registrations)

        def no_scan(state, key_group):
            raise AssertionError(f"read every entry of {state} in key group {key_group}")

        monkeypatch.setattr(delegate, "entries", no_scan)
        timers = fresh.timers()
        assert timers.next_expiry(TimeDomain.EVENT) == 1_000
        fired = list(timers.fire(1_001, TimeDomain.EVENT))
        # time, then key (stored bytes) order, across key groups
        expected = sorted(((1_000 + n // 500, _order(key)), key) for n, key in enumerate(keys) if n < 1_000)
        assert [(expiry, key) for key, expiry in fired] == [(t, key) for (t, _), key in expected]
        assert timers.next_expiry(TimeDomain.EVENT) == 1_002
        fresh.set_current_key("user-0")
        assert timers.list(TimeDomain.EVENT) == [1 << 40]
        fresh.close()


@pytest.mark.parametrize("delegate", ["heap", "lmdb"])
def test_a_timer_registered_while_timers_fire_fires_in_the_next_call_even_when_due(tmp_path, delegate):
    """Spark's rule: a batch fires the timers registered before it began firing (the example the
    model's state machine once found: expiry 0 re-armed at 50 while firing up to 50)."""
    from dstl.backend.delegate import HeapDelegate, LmdbDelegate

    store = HeapDelegate() if delegate == "heap" else LmdbDelegate(tmp_path / "lmdb")
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, delegate=store)
        timers = backend.timers()
        for key in ("alice", "bob"):
            backend.set_current_key(key)
            timers.register(0, TimeDomain.EVENT)
        backend.set_current_key("carol")
        timers.register(50, TimeDomain.EVENT)  # registered before: due in this call
        fired = []
        for key, expiry in timers.fire(50, TimeDomain.EVENT):
            fired.append((key, expiry))
            if expiry == 0:
                timers.register(50, TimeDomain.EVENT)  # re-armed at exactly the bound
                timers.register(20, TimeDomain.EVENT)  # and before it
        assert sorted(fired) == [("alice", 0), ("bob", 0), ("carol", 50)]
        assert sorted(timers.fire(50, TimeDomain.EVENT)) == [
            ("alice", 20), ("alice", 50), ("bob", 20), ("bob", 50)
        ]
        assert list(timers.fire(50, TimeDomain.EVENT)) == []
        backend.close()
