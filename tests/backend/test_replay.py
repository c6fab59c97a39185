"""Restore replays logs here or in a forked process: same state either way, damage still reported."""

import os
import uuid
from pathlib import Path

import msgpack
import pytest

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
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
