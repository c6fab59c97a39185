"""Changelog keyed-state backend: state kinds, checkpoint/restore, rescale, bad input."""

import operator

import pytest

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.backend.keygroups import key_group_for, key_group_range_for_instance
from dstl.spi import ConfigError, InvalidHandleError, KeyGroupRange, load_storage
from tests.backend.helpers import owns_key

ALL = KeyGroupRange(0, 128)


def populate(backend, users):
    totals = backend.value_state("totals")
    recent = backend.list_state("recent")
    pages = backend.map_state("pages")
    best = backend.reducing_state("best", max)
    for n in range(users * 3):
        user = f"user-{n % users}"
        backend.set_current_key(user)
        totals.update((totals.value() or 0) + n)
        recent.add(n)
        if len(recent.get()) > 2:
            recent.update(recent.get()[-2:])
        pages.put(f"p{n % 4}", (pages.get(f"p{n % 4}") or 0) + 1)
        if n % 7 == 0:
            pages.remove("p0")
        best.add(n)
    backend.set_current_key("gone")
    totals.update(1)
    totals.clear()


def read_back(backend, users):
    totals = backend.value_state("totals")
    recent = backend.list_state("recent")
    pages = backend.map_state("pages")
    best = backend.reducing_state("best", max)
    out = {}
    for u in range(users):
        backend.set_current_key(f"user-{u}")
        out[u] = (totals.value(), recent.get(), dict(pages.items()), best.get())
    backend.set_current_key("gone")
    out["gone"] = totals.value()
    return out


def test_checkpoint_and_restore_every_state_kind(storage_config):
    with load_storage(storage_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL)
        populate(backend, 20)
        expected = read_back(backend, 20)
        snapshot = backend.checkpoint(1).result(timeout=30)
        backend.notify_checkpoint_complete(snapshot)
        backend.close()
        text = snapshot.to_json()
    with load_storage(storage_config, job_id="job") as storage:
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1)
        restored.restore(BackendSnapshot.from_json(text), storage_config)
        assert read_back(restored, 20) == expected
        assert expected["gone"] is None and expected[3][3] is not None


@pytest.mark.parametrize("new_parallelism", [2, 8])
def test_rescale_from_4_instances_loses_and_duplicates_nothing(storage_config, new_parallelism):
    keys = [f"k{i}" for i in range(400)]
    with load_storage(storage_config, job_id="job") as storage:
        handles = []
        for index in range(4):
            backend = ChangelogKeyedStateBackend(storage, "op", key_group_range_for_instance(index, 4))
            state = backend.value_state("v")
            for key in keys:
                try:
                    backend.set_current_key(key)
                except ValueError:
                    continue  # another instance owns it
                state.update(key.upper())
            handles.extend(backend.checkpoint(1).result(timeout=30).handles)
            backend.close()
        union = BackendSnapshot(1, tuple(handles))
        found = {}
        for index in range(new_parallelism):
            backend = ChangelogKeyedStateBackend(
                storage, "op", key_group_range_for_instance(index, new_parallelism), epoch=1
            )
            backend.restore(union, storage_config)
            state = backend.value_state("v")
            for key in keys:
                try:
                    backend.set_current_key(key)
                except ValueError:
                    continue
                if state.value() is not None:
                    assert key not in found, f"{key} restored twice"
                    found[key] = state.value()
            backend.close()
    assert found == {key: key.upper() for key in keys}


def test_bad_input_is_rejected_clearly(storage_config):
    with load_storage(storage_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 64))
        state = backend.value_state("v")
        with pytest.raises(RuntimeError, match="no current key"):
            state.value()
        with pytest.raises(ValueError, match="routed to the wrong instance"):
            for i in range(1000):
                backend.set_current_key(f"key-{i}")
        backend.set_current_key(next(f"k{i}" for i in range(1000) if owns_key(backend, f"k{i}")))
        with pytest.raises(TypeError, match="cannot be stored with msgpack"):
            state.update(object())
        with pytest.raises(ConfigError, match="already registered as value"):
            backend.list_state("v")
        state.update(5)
        snapshot = backend.checkpoint(1).result(timeout=30)
        backend.close()
        restored = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 64), epoch=1)
        restored.restore(snapshot)
        with pytest.raises(ConfigError, match="checkpointed as value state"):
            restored.map_state("v")
    with pytest.raises(InvalidHandleError):
        BackendSnapshot.from_json('{"checkpoint_id": 1, "handles": [{"schema": "evil"}]}')
    with pytest.raises(InvalidHandleError):
        BackendSnapshot.from_json("not json")


def test_reducing_state_needs_a_reduce_function(storage_config):
    from dstl.backend.keyed import StateDescriptor, StateKind

    with load_storage(storage_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL)
        with pytest.raises(ConfigError, match="needs a reduce function"):
            backend.register(StateDescriptor("r", StateKind.REDUCING))
        total = backend.reducing_state("sum", operator.add)
        backend.set_current_key(1)
        total.add(2)
        total.add(3)
        assert total.get() == 5
        backend.close()


def test_squashing_logs_only_the_last_replacing_update_of_a_key(storage_config):
    sizes = {}
    with load_storage(storage_config, job_id="job") as storage:
        for squash in (False, True):
            backend = ChangelogKeyedStateBackend(storage, f"op-{squash}", ALL, squash_updates=squash)
            value, items = backend.value_state("v"), backend.list_state("l")
            for round_ in range(50):
                for key in range(20):
                    backend.set_current_key(key)
                    value.update(round_)
            backend.set_current_key(0)
            items.update([1])  # replacing, squashed...
            items.add(2)  # ...then flushed before this non-replacing change
            snapshot = backend.checkpoint(1).result(timeout=30)
            sizes[squash] = snapshot.handles[-1].size
            backend.close()
            restored = ChangelogKeyedStateBackend(storage, f"op-{squash}", ALL, epoch=1)
            restored.restore(snapshot, storage_config)
            value, items = restored.value_state("v"), restored.list_state("l")
            for key in range(20):
                restored.set_current_key(key)
                assert value.value() == 49
            restored.set_current_key(0)
            assert items.get() == [1, 2]
            restored.close()
    assert sizes[True] * 10 < sizes[False], sizes


@pytest.mark.parametrize("squash", [False, True], ids=["log-every-update", "squash-updates"])
@pytest.mark.parametrize("delegate", ["heap", "lmdb"])
def test_bulk_updates_interleaved_with_per_key_ones_restore_in_order(
    storage_config, tmp_path, squash, delegate
):
    """update_many and add_many after and before per-key updates of the same keys: the last one wins."""
    config = {
        **storage_config,
        "state.backend.delegate": delegate,
        "state.backend.lmdb.dir": str(tmp_path),
        "state.changelog.squash-updates": squash,
    }
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend.from_config(storage, "op", ALL, config, epoch=0)
        value = backend.value_state("v")
        total = backend.reducing_state("r", lambda a, b: a + b)
        for key in range(10):  # per key first
            backend.set_current_key(key)
            value.update(-key)
            total.add(1)
        # bulk: key 3 twice (the last wins), key 4 cleared, keys 20.. new
        value.update_many([3, 4, 3, 5, 20, 21], ["first", None, "last", 5, 20, 21])
        total.add_many([1, 1, 2, 30], [10, 100, 5, 7])
        backend.set_current_key(5)
        value.update("after the bulk")  # per key again, after the bulk put of key 5
        expected_values = {k: -k for k in range(10)} | {
            3: "last",
            4: None,
            5: "after the bulk",
            20: 20,
            21: 21,
        }
        expected = {k: (v, None) for k, v in expected_values.items()}
        for key in range(10):
            expected[key] = (expected_values[key], 1 + {1: 110, 2: 5}.get(key, 0))
        expected[30] = (None, 7)
        assert value.get_many(list(expected)) == [v for v, _ in expected.values()]
        assert total.get_many(list(expected)) == [t for _, t in expected.values()]
        snapshot = backend.checkpoint(1).result(timeout=30)
        backend.close()
        elsewhere = {**config, "state.backend.lmdb.dir": str(tmp_path / "restored")}
        restored = ChangelogKeyedStateBackend.from_config(storage, "op", ALL, elsewhere, epoch=1)
        restored.restore(snapshot, elsewhere)
        value, total = restored.value_state("v"), restored.reducing_state("r", lambda a, b: a + b)
        for key, (v, t) in expected.items():
            restored.set_current_key(key)
            assert (value.value(), total.get()) == (v, t), key
        restored.close()


def test_an_escaping_operator_id_creates_nothing_outside_the_lmdb_dir(tmp_path, memory_config):
    from dstl.spi import InvalidIdentifierError

    base = tmp_path / "lmdb" / "a" / "b"
    config = {**memory_config, "state.backend.delegate": "lmdb", "state.backend.lmdb.dir": str(base)}
    with load_storage(config, job_id="job") as storage:
        for operator_id in ("../../../ESCAPED/x", "a."):
            with pytest.raises(InvalidIdentifierError, match=f"operator id {operator_id!r}"):
                ChangelogKeyedStateBackend.from_config(storage, operator_id, KeyGroupRange(0, 128), config)
    assert not (tmp_path / "ESCAPED").exists() and not list(tmp_path.rglob("*.mdb"))


def test_snapshot_parts_round_trip_and_forged_parts_are_refused():
    import json

    import pytest

    from dstl.backend.changelog import BackendSnapshot
    from dstl.spi import InvalidHandleError, KeyGroupRange

    inner = BackendSnapshot(3, ())
    outer = BackendSnapshot(4, (), (), (), ((KeyGroupRange(0, 64), inner), (KeyGroupRange(64, 128), inner)))
    assert BackendSnapshot.from_json(outer.to_json()) == outer
    doc = json.loads(outer.to_json())
    for bad, match in [
        ([{"key_groups": [5, 1], "snapshot": inner.to_dict()}], r"\[start, end\]"),
        ([{"key_groups": [0, True], "snapshot": inner.to_dict()}], r"\[start, end\]"),
        ([{"key_groups": [0, 1]}], "backend snapshot must be a JSON object"),
        ({"key_groups": [0, 1]}, "'parts' must be a list"),
    ]:
        with pytest.raises(InvalidHandleError, match=match):
            BackendSnapshot.from_dict({**doc, "parts": bad})
    deep = inner.to_dict()
    for _ in range(20):
        deep = {"checkpoint_id": 1, "handles": [], "parts": [{"key_groups": [0, 1], "snapshot": deep}]}
    with pytest.raises(InvalidHandleError, match="nest deeper than 16"):
        BackendSnapshot.from_dict(deep)


def test_drop_state_clears_every_key_logged_and_restored_ones_too(memory_config):
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL)
        totals, pages = backend.value_state("totals"), backend.map_state("pages")
        for n in range(50):
            backend.set_current_key(f"user-{n}")
            totals.update(n)
            pages.put("p", n)
        snapshot = backend.checkpoint(1).result()
        backend.close()

        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1)
        restored.restore(snapshot)
        # "totals" was never registered in this run: it is known from the checkpoint
        assert restored.drop_state("totals") == 50
        assert restored.drop_state("never-there") == 0
        with pytest.raises(ConfigError, match="dstl's own"):
            restored.drop_state("__dstl.timers.processing")
        after = restored.checkpoint(2).result()
        restored.close()

        replayed = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=2)
        replayed.restore(after)
        totals, pages = replayed.value_state("totals"), replayed.map_state("pages")
        for n in range(50):
            replayed.set_current_key(f"user-{n}")
            assert totals.value() is None
            assert pages.get("p") == n  # other states are untouched
        replayed.close()


@pytest.mark.parametrize("batched", [False, True])
def test_an_update_the_full_working_disk_refuses_is_in_neither_state_nor_log(
    small_tmpfs, memory_config, batched
):
    from dstl.backend.delegate import LmdbDelegate
    from dstl.spi import StorageError

    with load_storage(memory_config, job_id="job") as storage:
        delegate = LmdbDelegate(small_tmpfs / "state", map_size=64 << 20)
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, delegate=delegate)
        state = backend.value_state("blob")
        stored, refused = {}, None
        for n in range(2_000):
            keys, value = [f"k{n}-{i}" for i in range(8)], f"{n}".encode() * 1000
            try:
                if batched:
                    state.update_many(keys, [value] * len(keys))
                else:
                    for key in keys:
                        backend.set_current_key(key)
                        state.update(value)
                        stored[key] = value
            except StorageError as exc:
                refused = exc
                break
            stored.update(dict.fromkeys(keys, value))
        assert refused is not None, "the tmpfs never filled up"
        snapshot = backend.checkpoint(1).result(timeout=30)
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1)
        restored.restore(snapshot, memory_config)
        every_key = [f"k{m}-{i}" for m in range(n + 1) for i in range(8)]
        in_state = dict(zip(every_key, state.get_many(every_key), strict=True))
        in_log = dict(zip(every_key, restored.value_state("blob").get_many(every_key), strict=True))
        assert {k: v for k, v in in_state.items() if v is not None} == stored
        assert in_log == in_state  # the refused update is in neither
        backend.close()
        restored.close()
        delegate.close()


def test_a_restore_reads_a_key_group_only_from_the_newest_snapshot_holding_it_whole(
    memory_config, tmp_path, monkeypatch
):
    from dstl.backend.changelog import materializer as materializer_module

    loaded: list[tuple[str, int]] = []
    load_runs = materializer_module.load_runs

    def counting(delegate, key_group, entries, where):
        loaded.append((where, key_group))
        load_runs(delegate, key_group, entries, where)

    monkeypatch.setattr(materializer_module, "load_runs", counting)
    snapshot_dir = (tmp_path / "snap").as_uri()
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, snapshot_dir=snapshot_dir, max_tracked_keys=20
        )
        totals = backend.value_state("totals")
        expected = {}

        def write(keys, value):
            for key in keys:
                backend.set_current_key(key)
                totals.update(value)
                expected[key] = value

        write([f"k{i}" for i in range(400)], 1)
        backend.materialize().result(timeout=30)  # full
        write([f"k{i}" for i in range(0, 240, 4)], 2)  # 60 keys, beyond 20: key groups made whole
        backend.materialize().result(timeout=30)
        write(["k1", "k2", "k3"], 3)  # tracked one by one
        backend.materialize().result(timeout=30)
        write(["k5"], 4)  # in the log only
        snapshot = backend.checkpoint(1).result(timeout=30)
        backend.close()
        full, whole_groups, tracked = snapshot.materialized
        assert "-full-" in full.path and "-incr-" in whole_groups.path and "-incr-" in tracked.path
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshot_dir)
        replaced = restored.materializer.open(whole_groups).replaced
        assert replaced and not restored.materializer.open(tracked).replaced
        read_before = restored.materializer.read_bytes
        restored.restore(snapshot, memory_config)
        read = restored.materializer.read_bytes - read_before  # what the restore read of the snapshots
        assert 0 < read < sum(ref.size for ref in snapshot.materialized)
        restored_totals = restored.value_state("totals")
        for key, value in expected.items():
            restored.set_current_key(key)
            assert restored_totals.value() == value, key
    read_from = {
        ref.path: {kg for where, kg in loaded if where.endswith(ref.path)} for ref in snapshot.materialized
    }
    assert replaced <= read_from[whole_groups.path]  # each whole group from the incremental holding it...
    assert not replaced & read_from[full.path]  # ...and not from the full snapshot before it
    assert read_from[full.path] | replaced == {key_group_for(key) for key in expected}
