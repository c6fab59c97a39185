"""Restore replays logs here or in a forked process: same state either way, damage still reported."""

import logging
import os
import time
import uuid
from pathlib import Path

import msgpack
import pytest

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend, child_output, replay
from dstl.backend.changelog.records import (
    decode_change,
    encode_change,
    encode_registration,
    encode_value_puts,
)
from dstl.backend.changelog.replay import SquashedLog
from dstl.backend.keyed import Op
from dstl.spi import META_KEY_GROUP, CorruptedError, KeyGroupRange, load_storage
from tests.backend.test_changelog_backend import populate, read_back

ALL = KeyGroupRange(0, 128)


@pytest.fixture
def forks(monkeypatch):
    """Counts the processes restores fork."""
    calls = []
    real_fork = os.fork

    def counting_fork():
        calls.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counting_fork)
    return calls


def read_all(backend, users):
    """``read_back`` plus keys whose log only appends to what the snapshot holds."""
    items, pages = backend.list_state("items"), backend.map_state("index")
    out = read_back(backend, users)
    for k in range(5):
        backend.set_current_key(f"snap-{k}")
        out[f"snap-{k}"] = (items.get(), dict(pages.items()))
    return out


def checkpoint_over_a_snapshot(storage, snapshot_dir):
    """A checkpoint whose log follows a materialization, with changes that need the snapshot's entry."""
    backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshot_dir)
    items, pages = backend.list_state("items"), backend.map_state("index")
    populate(backend, 20)
    for k in range(5):
        backend.set_current_key(f"snap-{k}")
        items.add(k)
        pages.put("a", k)
    backend.materialize().result(timeout=30)
    for k in range(5):  # list adds and map puts/removes on snapshotted entries, nothing replaces them
        backend.set_current_key(f"snap-{k}")
        items.add(k + 100)
        pages.put("b", k)
        if k % 2:
            pages.remove("a")
    populate(backend, 30)  # 20 keys already in the snapshot, 10 new; every state kind
    expected = read_all(backend, 30)
    snapshot = backend.checkpoint(1).result(timeout=30)
    backend.close()
    assert snapshot.materialized and snapshot.handles
    assert expected["snap-1"] == ([1, 101], {"b": 1}) and expected["snap-2"] == ([2, 102], {"a": 2, "b": 2})
    return snapshot, expected


@pytest.mark.parametrize("fork_from", [0, 1])
def test_forked_and_local_replay_restore_the_same_state(storage_config, tmp_path, forks, fork_from):
    with load_storage(storage_config, job_id="job") as storage:
        snapshot, expected = checkpoint_over_a_snapshot(storage, f"file://{tmp_path}/snap")
        restored = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=1, snapshot_dir=f"file://{tmp_path}/snap", fork_replay_from=fork_from
        )
        restored.restore(snapshot, storage_config)
        assert read_all(restored, 30) == expected
        restored.close()
    assert len(forks) == (1 if fork_from else 0)


def test_logs_below_the_threshold_are_replayed_here(tmp_path, forks):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        snapshot, expected = checkpoint_over_a_snapshot(storage, f"file://{tmp_path}/snap")
        restored = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=1, snapshot_dir=f"file://{tmp_path}/snap", fork_replay_from=1 << 30
        )
        restored.restore(snapshot, config)
        assert read_all(restored, 30) == expected
    assert forks == []


def test_a_damaged_log_fails_a_forked_restore_with_corrupted_error(tmp_path, forks):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        snapshot, _ = checkpoint_over_a_snapshot(storage, f"file://{tmp_path}/snap")
        location = dict(snapshot.handles[0].locations[-1])
        segment = Path(storage.segment_path(str(location["segment"])))
        data = bytearray(segment.read_bytes())
        middle = int(location["offset"]) + int(location["length"]) // 2
        data[middle] ^= 0xFF
        segment.write_bytes(bytes(data))
        restored = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=1, snapshot_dir=f"file://{tmp_path}/snap", fork_replay_from=1
        )
        with pytest.raises(CorruptedError, match="checksum"):
            restored.restore(snapshot, config)
    assert len(forks) == 1  # the child failed; the restore re-read here and named the damage


def test_squashed_log_round_trips_through_its_encoding():
    squashed = SquashedLog(
        registrations=[("totals", "value", "msgpack")],
        batches={("totals", 3): {b"k1": b"v", b"k2": None}},
        unsquashed=[("recent", 5, b"k3", 2, [b"x"])],
    )
    assert SquashedLog.decode(squashed.encode()) == squashed


@pytest.mark.parametrize(
    "record",
    [
        [0, [1], b"k", b"v"],  # a state id that is not an integer (unhashable)
        [0, "1", b"k", b"v"],  # ... a string that int() would have accepted
        [0, 1, b"k"],  # a value put without its value
        [4, 1, b"k", b"only-the-map-key"],  # a map put without its value
    ],
)
@pytest.mark.parametrize("fork_from", [0, 1])
def test_a_malformed_record_is_reported_as_corrupted(record, fork_from):
    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"bad-{uuid.uuid4().hex}"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", ALL)
        writer.append_meta(encode_registration(1, "totals", "value", "msgpack"))
        writer.append(3, msgpack.packb(record, use_bin_type=True))
        handle = writer.persist(writer.initial_sqn(), 1).result(timeout=10)
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, fork_replay_from=fork_from)
        with pytest.raises(CorruptedError, match="undecodable state change record"):
            restored.restore(BackendSnapshot(1, (handle,)), config)


def test_value_puts_encoded_in_bulk_are_each_put_s_record():
    keys, values = [b"a", b"", b"k" * 300], [b"\x01", b"v" * 70_000, b""]
    records = encode_value_puts(7, keys, values)
    assert records == [
        encode_change(Op.VALUE_PUT, 7, key, value) for key, value in zip(keys, values, strict=True)
    ]
    assert [decode_change(r, where="test") for r in records] == [
        (Op.VALUE_PUT, 7, key, [value]) for key, value in zip(keys, values, strict=True)
    ]
    with pytest.raises(ValueError):
        encode_value_puts(7, keys, values[:2])


def test_a_state_id_bound_anew_mid_log_sends_later_changes_to_its_new_state():
    from dstl.backend.changelog.replay import squash

    handle = type("Handle", (), {"storage_id": "memory", "log_id": "op"})()
    changes = [
        (META_KEY_GROUP, encode_registration(1, "first", "value", "msgpack")),
        (3, encode_change(Op.VALUE_PUT, 1, b"k", b"1")),
        (4, encode_change(Op.VALUE_PUT, 1, b"j", b"2")),
        (META_KEY_GROUP, encode_registration(1, "second", "value", "msgpack")),
        (3, encode_change(Op.VALUE_PUT, 1, b"k", b"3")),
    ]
    squashed = squash([(handle, [(1, changes)])], None)
    assert squashed.batches == {
        ("first", 3): {b"k": b"1"},
        ("first", 4): {b"j": b"2"},
        ("second", 3): {b"k": b"3"},
    }


def _logged(storage, checkpoints: int):
    """A checkpoint whose log is ``checkpoints`` change sets (no snapshot), and the state it holds."""
    backend = ChangelogKeyedStateBackend(storage, "op", ALL)
    for batch in range(checkpoints):
        populate(backend, 10 + batch)
        snapshot = backend.checkpoint(batch).result(timeout=30)
    expected = read_back(backend, 10 + checkpoints)
    backend.close()
    assert sum(len(handle.locations) for handle in snapshot.handles) == checkpoints  # a change set each
    return snapshot, expected


def _restored(storage, snapshot, config):
    restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=99, fork_replay_from=1)
    restored.restore(snapshot, config)
    return restored


@pytest.fixture
def squashed_here(monkeypatch):
    """The squashes this process runs itself (a forked child's are not seen)."""
    calls, real, parent = [], replay.squash, os.getpid()

    def counting(logs, base):
        if os.getpid() == parent:
            calls.append(base is not None)
        return real(logs, base)

    monkeypatch.setattr(replay, "squash", counting)
    return calls


def test_a_forked_squash_that_hangs_is_stopped_and_the_logs_are_squashed_here(
    tmp_path, forks, squashed_here, monkeypatch, caplog
):
    monkeypatch.setattr(child_output, "STALL_SECONDS", 1.0)
    counting, parent = replay.squash, os.getpid()

    def hanging_in_the_child(logs, base):
        if os.getpid() != parent:
            time.sleep(3600)
        return counting(logs, base)

    monkeypatch.setattr(replay, "squash", hanging_in_the_child)
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        snapshot, expected = _logged(storage, 3)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING):
            restored = _restored(storage, snapshot, config)
        assert read_back(restored, 13) == expected
        restored.close()
    assert len(forks) == 1 and squashed_here == [True]  # forked, stopped, squashed here
    assert time.monotonic() - began < 30
    assert "wrote nothing for 1 s" in caplog.text


def test_a_forked_squash_slower_than_the_bound_is_kept_while_it_reports_each_change_set(
    tmp_path, forks, squashed_here, monkeypatch
):
    monkeypatch.setattr(child_output, "STALL_SECONDS", 3.0)
    counting = replay.squash

    def slowly(change_sets):
        for change_set in change_sets:
            time.sleep(0.4)  # 10 change sets: 4 s in all, never 3 s without a word
            yield change_set

    def slow_in_the_child(logs, base):
        return counting(
            [(handle, slowly(change_sets)) for handle, change_sets in logs] if base is None else logs, base
        )

    monkeypatch.setattr(replay, "squash", slow_in_the_child)
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        snapshot, expected = _logged(storage, 10)
        began = time.monotonic()
        restored = _restored(storage, snapshot, config)
        assert time.monotonic() - began > 3.0  # longer than the bound, in all
        assert read_back(restored, 20) == expected
        restored.close()
    assert len(forks) == 1 and squashed_here == []  # the child's result, nothing squashed here
