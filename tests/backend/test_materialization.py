"""Materialization: snapshot + log after it restores the state; the log is truncated; failures."""

import pytest

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.backend.keygroups import key_group_range_for_instance
from dstl.backend.materialization import write_snapshot
from dstl.spi import CorruptedError, KeyGroupRange, StorageError, load_storage
from tests.backend.helpers import failing_snapshot_store, owns_key, snapshot_bytes

ALL = KeyGroupRange(0, 128)


@pytest.fixture
def setup(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    return config, (tmp_path / "snapshots").as_uri()


def fill(backend, keys, round_):
    state = backend.value_state("v")
    for key in keys:
        backend.set_current_key(key)
        state.update(f"{key}-{round_}")


def materialized_checkpoint(storage, snapshots, keys):
    """A backend holding ``keys``, materialized, then checkpointed; returns (backend, ref, snapshot)."""
    backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots)
    fill(backend, keys, 1)
    ref = backend.materialize().result(timeout=30)
    return backend, ref, backend.checkpoint(1).result(timeout=30)


def values(backend, keys):
    state = backend.value_state("v")
    out = {}
    for key in keys:
        backend.set_current_key(key)
        out[key] = state.value()
    return out


def test_checkpoint_after_materialization_holds_snapshot_plus_later_log(setup):
    config, snapshots = setup
    keys = [f"k{i}" for i in range(300)]
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots)
        fill(backend, keys, 1)
        ref = backend.materialize().result(timeout=30)
        fill(backend, keys[:10], 2)
        snapshot = backend.checkpoint(1).result(timeout=30)
        assert snapshot.materialized == (ref,)
        assert [h.sqn_range.start for h in snapshot.handles] == [ref.sqn]
        held = backend.writer.buffered_bytes()
        backend.notify_checkpoint_complete(snapshot)
        assert backend.writer.buffered_bytes() < held, "the log before the snapshot was not truncated"
        expected = values(backend, keys)
        backend.close()
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
        restored.restore(BackendSnapshot.from_json(snapshot.to_json()), config)
        assert values(restored, keys) == expected
        assert expected["k0"] == "k0-2" and expected["k299"] == "k299-1"


def test_restore_of_some_key_groups_reads_only_their_sections(setup, monkeypatch):
    config, snapshots = setup
    keys = [f"k{i}" for i in range(500)]
    with load_storage(config, job_id="job") as storage:
        backend, ref, snapshot = materialized_checkpoint(storage, snapshots, keys)
        backend.close()
        import fsspec.implementations.local as local_fs

        read = []
        original = local_fs.LocalFileSystem.cat_file

        def counting(self, path, start=None, end=None, **kw):
            data = original(self, path, start=start, end=end, **kw)
            read.append(len(data))
            return data

        monkeypatch.setattr(local_fs.LocalFileSystem, "cat_file", counting)
        quarter = key_group_range_for_instance(0, 4)
        part = ChangelogKeyedStateBackend(storage, "op-part", quarter, snapshot_dir=snapshots)
        part.restore(snapshot, config)
        state = part.value_state("v")
        owned = [k for k in keys if owns_key(part, k)]
        for key in owned:
            part.set_current_key(key)
            assert state.value() == f"{key}-1"
        assert sum(read) < ref.size / 2, (
            f"read {sum(read)} of {ref.size} bytes for a quarter of the key groups"
        )


def test_corrupted_snapshot_is_reported(setup, tmp_path):
    config, snapshots = setup
    with load_storage(config, job_id="job") as storage:
        backend, ref, snapshot = materialized_checkpoint(storage, snapshots, ["a", "b"])
        backend.close()
        path = tmp_path / "snapshots" / ref.path
        original = path.read_bytes()
        for offset, error in ((10, "failed its checksum"), (len(original) - 3, "trailer damaged")):
            raw = bytearray(original)
            raw[offset] ^= 0xFF  # inside the first section / the trailer's end magic
            path.write_bytes(bytes(raw))
            restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
            with pytest.raises(CorruptedError, match=error):
                restored.restore(snapshot, config)
            restored.close()


def test_repeated_materialization_failures_fail_the_checkpoint(setup, tmp_path):
    config, _ = setup
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, snapshot_dir=(blocker / "snap").as_uri(), max_failures_allowed=2
        )
        fill(backend, ["a"], 1)
        for _ in range(3):
            with pytest.raises(StorageError, match="materialization failed"):
                backend.materialize().result(timeout=30)
        with pytest.raises(StorageError, match="failed 3 times in a row"):
            backend.checkpoint(1)
        backend.close()


def test_materialize_needs_a_snapshot_dir(setup):
    config, _ = setup
    from dstl.spi import ConfigError

    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL)
        with pytest.raises(ConfigError, match="state.checkpoints.dir"):
            backend.materialize()
        backend.close()


def test_backend_from_config_materializes_periodically(setup):
    config, snapshots = setup
    state_config = {
        **config,
        "state.checkpoints.dir": snapshots,
        "state.changelog.materialization.interval": "50ms",
    }
    import time

    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend.from_config(storage, "op", ALL, state_config)
        fill(backend, ["a", "b", "c"], 1)
        snapshots_seen = set()
        for checkpoint_id in range(1, 8):
            time.sleep(0.06)
            snapshot = backend.checkpoint(checkpoint_id).result(timeout=30)
            backend.notify_checkpoint_complete(snapshot)
            snapshots_seen.update(ref.path for ref in snapshot.materialized)
        assert backend.materializer.completed >= 2 and len(snapshots_seen) >= 2
        backend.close()


def test_backend_options_are_declared():
    from dstl.spi import Config, ConfigError

    config = Config(
        {"state.changelog.materialization.interval": "2min", "state.checkpoints.dir": "file:///tmp/x"}
    )
    assert config["state.changelog.materialization.interval"] == 120.0
    assert config["state.changelog.max-failures-allowed"] == 3
    with pytest.raises(ConfigError, match="did you mean 'state.checkpoints.dir'"):
        Config({"state.checkpoint.dir": "x"})


def test_incremental_snapshots_hold_only_changes_and_restore_exactly(setup):
    config, snapshots = setup
    keys = [f"k{i}" for i in range(1000)]
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, snapshot_dir=snapshots, full_materialization_every=3
        )
        fill(backend, keys, 1)
        full = backend.materialize().result(timeout=30)
        fill(backend, keys[:20], 2)
        state = backend.value_state("v")
        backend.set_current_key("k500")
        state.clear()  # a removal: an incremental must carry a tombstone
        incremental = backend.materialize().result(timeout=30)
        assert "-incr-" in incremental.path and "-full-" in full.path
        assert incremental.size < full.size / 10
        fill(backend, keys[20:25], 3)
        second = backend.materialize().result(timeout=30)
        assert backend.materializer.chain == (full, incremental, second)
        fill(backend, keys[:1], 4)
        snapshot = backend.checkpoint(1).result(timeout=30)
        assert snapshot.materialized == (full, incremental, second)
        expected = values(backend, keys)
        assert expected["k500"] is None and expected["k0"] == "k0-4" and expected["k21"] == "k21-3"
        third = backend.materialize().result(timeout=30)  # k = 3 reached: full again
        assert "-full-" in third.path and backend.materializer.chain == (third,)
        backend.close()
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
        restored.restore(BackendSnapshot.from_json(snapshot.to_json()), config)
        assert values(restored, keys) == expected
        restored.close()


def test_a_backend_that_forgoes_tracking_still_snapshots_every_change(setup):
    """Without tracked keys (a Spark task the driver gave no snapshot), a snapshot replaces every group."""
    config, snapshots = setup
    keys = [f"k{i}" for i in range(500)]
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots)
        fill(backend, keys, 1)
        backend.materialize().result(timeout=30)
        backend.materializer.forgo_tracking()
        fill(backend, keys[:7], 2)
        backend.set_current_key("k300")
        backend.value_state("v").clear()
        ref = backend.materialize().result(timeout=30)
        assert ref.entries == len(keys) - 1, "the snapshot after untracked changes holds every key"
        fill(backend, keys[7:9], 3)  # tracked again after that snapshot began
        incremental = backend.materialize().result(timeout=30)
        assert incremental.entries == 2
        snapshot = backend.checkpoint(1).result(timeout=30)
        expected = values(backend, keys)
        backend.close()
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
        restored.restore(snapshot, config)
        assert values(restored, keys) == expected and expected["k300"] is None
        restored.close()


def test_full_checkpoint_stays_within_twice_the_state_size(setup, capsys):
    config, snapshots = setup
    keys = list(range(10_000))
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, snapshot_dir=snapshots, full_materialization_every=10
        )
        state = backend.value_state("v")
        ratios = []
        for materialization in range(1, 4):
            for round_ in range(100):  # the same 10k keys, 100 times between materializations
                for key in keys:
                    backend.set_current_key(key)
                    state.update(materialization * 1000 + round_)
            backend.materialize().result(timeout=60)
            snapshot = backend.checkpoint(materialization).result(timeout=60)
            backend.notify_checkpoint_complete(snapshot)
            full_checkpoint = sum(ref.size for ref in snapshot.materialized) + sum(
                h.size for h in snapshot.handles
            )
            # The state size: a full snapshot of the state as it is now.
            reference = backend.delegate.snapshot()
            sections = {}
            for name, groups in reference.items():
                for key_group, entries in groups.items():
                    sections.setdefault(key_group, []).extend([name, k, e] for k, e in entries.items())
            state_bytes = len(write_snapshot(sections, {}))
            ratios.append(full_checkpoint / state_bytes)
        backend.close()
    with capsys.disabled():
        print(f"\nfull checkpoint size / state size per materialization: {[round(r, 2) for r in ratios]}")
    assert max(ratios) <= 2.0


def test_keys_of_a_failed_incremental_go_into_the_next_one(setup):
    config, snapshots = setup
    keys = [f"k{i}" for i in range(50)]
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, snapshot_dir=snapshots, full_materialization_every=10
        )
        fill(backend, keys, 1)
        backend.materialize().result(timeout=30)
        fill(backend, keys[:3], 2)
        with failing_snapshot_store(backend), pytest.raises(StorageError, match="injected"):
            backend.materialize().result(timeout=30)
        ref = backend.materialize().result(timeout=30)
        assert ref.entries == 3, "the incremental must hold the keys changed before the failed attempt"
        snapshot = backend.checkpoint(1).result(timeout=30)
        backend.notify_checkpoint_complete(snapshot)
        expected = values(backend, keys)
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
        restored.restore(snapshot, config)
        assert values(restored, keys) == expected
        restored.close()
        backend.close()


def warm_handover(storage, snapshots, keys):
    """A materialized backend changes ``keys[:4]`` and checkpoints; its successor (epoch 1) gets its
    working copy. Returns ``(snapshot, registrations, successor factory)``."""
    first = ChangelogKeyedStateBackend(
        storage, "op", ALL, snapshot_dir=snapshots, full_materialization_every=5
    )
    fill(first, keys, 1)
    first.materialize().result(timeout=30)
    fill(first, keys[:4], 2)
    snapshot = first.checkpoint(1).result(timeout=30)
    registrations, delegate = first.registrations(), first.delegate
    first.close()

    def successor(on_storage):
        return ChangelogKeyedStateBackend(
            on_storage,
            "op",
            ALL,
            epoch=1,
            delegate=delegate,
            snapshot_dir=snapshots,
            full_materialization_every=5,
        )

    return snapshot, registrations, successor


def test_resumed_backend_continues_the_chain_incrementally(setup):
    """Warm path: a new backend (new epoch) over the same working copy reads nothing back."""
    config, snapshots = setup
    keys = [f"k{i}" for i in range(100)]
    with load_storage(config, job_id="job") as storage:
        snapshot, registrations, successor = warm_handover(storage, snapshots, keys)
        second = successor(storage)
        second.resume(snapshot, registrations)
        fill(second, keys[4:6], 3)
        ref = second.materialize().result(timeout=30)
        assert ref.entries == 6, "keys changed in the resumed log and in this backend, nothing else"
        snapshot2 = second.checkpoint(2).result(timeout=30)
        assert snapshot2.materialized == (*snapshot.materialized, ref)
        assert [h.epoch for h in snapshot2.handles] == [1], "the old log is covered by the new snapshot"
        expected = values(second, keys)
        second.close()

        third = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=2, snapshot_dir=snapshots)
        third.restore(snapshot2, config)
        assert values(third, keys) == expected
        third.close()


def test_materialization_metrics_use_flink_names(setup):
    config, snapshots = setup
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots)
        fill(backend, ["a", "b", "c"], 1)
        ref = backend.materialize().result(timeout=30)
        with failing_snapshot_store(backend), pytest.raises(StorageError):
            backend.materialize().result(timeout=30)
        fill(backend, ["a"], 2)
        first = backend.checkpoint(1).result(timeout=30)
        metrics = backend.metrics()
        assert metrics["numberOfStartedMaterialization"] == 2
        assert metrics["numberOfCompletedMaterialization"] == 1
        assert metrics["numberOfFailedMaterialization"] == 1
        assert metrics["lastFullSizeOfMaterializedState"] == ref.size > 0
        assert metrics["lastIncSizeOfMaterializedState"] == ref.size
        assert metrics["lastFullSizeOfNonMaterializedState"] == first.handles[-1].size > 0
        assert metrics["lastCheckpointDuration"] > 0
        backend.checkpoint(2).result(timeout=30)
        metrics = backend.metrics()
        assert metrics["lastIncSizeOfMaterializedState"] == 0, "the snapshot was uploaded for checkpoint 1"
        assert metrics["lastIncSizeOfNonMaterializedState"] == 0, "nothing changed since checkpoint 1"
        backend.close()
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
        restored.restore(first, config)
        assert restored.metrics()["lastRestoreDuration"] > 0
        restored.checkpoint(3).result(timeout=30)
        # A restored (or resumed) chain was uploaded before: not counted as this checkpoint's upload.
        assert restored.metrics()["lastIncSizeOfMaterializedState"] == 0
        assert restored.metrics()["lastFullSizeOfMaterializedState"] == ref.size
        restored.close()


def test_resume_after_a_storage_switch_reads_the_old_log_with_its_config(setup, memory_config):
    """Warm path right after a switch: the incremental needs keys from the previous storage's log."""
    config, snapshots = setup
    keys = [f"k{i}" for i in range(100)]
    with load_storage(config, job_id="job") as local, load_storage(memory_config, job_id="job") as memory:
        snapshot, registrations, successor = warm_handover(local, snapshots, keys)
        second = successor(memory)
        second.resume(snapshot, registrations, config)
        ref = second.materialize().result(timeout=30)
        assert ref.entries == 4, "the keys changed in the local log since the snapshot"
        second.close()


def test_log_outgrowing_the_materialized_state_starts_a_materialization(setup):
    config, snapshots = setup
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=snapshots, max_log_ratio=0.05)
        fill(backend, ["a"], 0)
        backend.materialize().result(timeout=30)
        backend.checkpoint(1).result(timeout=30)
        backend.maybe_materialize()
        assert backend.materializer.started == 1, "a log of one change is below the ratio"
        for round_ in range(1, 400):  # ~70 KB of log: beyond 0.05 x max(state, 1 MiB)
            fill(backend, ["a"], f"{round_}-{'x' * 150}")
        backend.checkpoint(2).result(timeout=30)
        backend.maybe_materialize()
        assert backend.materializer.started == 2
        backend.materializer.close()
        assert backend.checkpoint(3).result(timeout=30).handles[-1].size < 1000, "the log restarted after it"
        backend.close()


def _v1_bytes(sections, meta=b'{"sqn": 1}'):
    """A version-1 snapshot (index before the sections), as older releases wrote them."""
    import struct

    from google_crc32c import value as _crc

    head = 20 + len(meta) + 16 * len(sections)
    index, bodies = b"", b""
    for key_group, body in sections:
        index += struct.pack("<iQI", key_group, head + len(bodies), len(body) + 4)
        bodies += body + struct.pack("<I", _crc(body))
    header = struct.pack("<4sB3xIII", b"DSTM", 1, len(meta), len(sections), _crc(meta + index))
    return header + meta + index + bodies


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
def test_every_codec_round_trips_and_reads_only_the_sections_asked_for(codec):
    from dstl.backend.materialization.format import read_sections, write_snapshot
    from dstl.spi import KeyGroupRange

    sections = {
        kg: [["s", f"k{kg}-{i}".encode(), {"n": i, "pad": "x" * 50}] for i in range(300)] for kg in range(8)
    }
    data = write_snapshot(sections, {"sqn": 4}, codec)
    if codec != "none":
        assert len(data) < len(write_snapshot(sections, {"sqn": 4})) / 2
    reads = []

    def read_range(start, end):
        reads.append(end - start)
        return data[start:end]

    meta, found = read_sections(read_range, KeyGroupRange(2, 4), where="snap", size=len(data))
    assert meta == {"sqn": 4} and dict(found) == {2: sections[2], 3: sections[3]}
    assert sum(reads) < len(data) / 2


def test_hostile_snapshot_headers_and_sections_are_corrupted_errors():
    import msgpack

    from dstl.backend.materialization.format import read_sections, write_snapshot
    from dstl.spi import CorruptedError, KeyGroupRange

    def read(data, size=None):
        return read_sections(
            lambda start, end: data[start:end],
            KeyGroupRange(0, 8),
            where="snap",
            size=len(data) if size is None else size,
        )

    body = msgpack.packb([["s", b"k", 1]], use_bin_type=True)  # a row-shaped (version 2) section
    runs = msgpack.packb([["s", [b"k"], [1]]], use_bin_type=True)
    assert snapshot_bytes([(3, runs)], version=3) == write_snapshot({3: [["s", b"k", 1]]}, {"sqn": 1})
    assert list(read(snapshot_bytes([(3, body)]))[1]) == [(3, [["s", b"k", 1]])]  # version 2 is still read
    with pytest.raises(CorruptedError, match="format version 4: this dstl reads 1 to 3"):
        read(snapshot_bytes([(3, runs)], version=4))
    with pytest.raises(CorruptedError, match="not a dstl snapshot"):
        read(b"XXXX" + snapshot_bytes([(3, runs)], version=3)[4:])
    with pytest.raises(CorruptedError, match="claims 4294967295 sections"):
        read(snapshot_bytes([(3, body)], count=0xFFFFFFFF))
    with pytest.raises(CorruptedError, match="trailer does not describe"):
        read(snapshot_bytes([(3, body)], count=2))
    with pytest.raises(CorruptedError, match="cannot hold a trailer"):
        read(snapshot_bytes([(3, body)]), size=10)
    with pytest.raises(CorruptedError, match="shorter than its reference"):
        read(snapshot_bytes([(3, body)])[:-3], size=len(snapshot_bytes([(3, body)])))
    # A section whose checksum is right but whose body is not msgpack entries.
    _, sections = read(snapshot_bytes([(3, b"\xc1\xc1\xc1")]))
    with pytest.raises(CorruptedError, match="does not decode"):
        list(sections)
    # Compressed sections: a bomb, data that is no zstd frame, an unknown codec.
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))  # its header declares 64 MiB
    _, sections = read(snapshot_bytes([(3, bomb, 100)], codec=1))
    with pytest.raises(CorruptedError, match="decompresses to 101 bytes, its index says 100"):
        list(sections)  # read up to the bound, never the 64 MiB the frame claims
    _, sections = read(snapshot_bytes([(3, body)], codec=1))
    with pytest.raises(CorruptedError, match="does not decompress"):
        list(sections)
    with pytest.raises(CorruptedError, match="unknown codec id 9"):
        read(snapshot_bytes([(3, body)], codec=9))
    _, sections = read(snapshot_bytes([(3, body, 1 << 30)]))
    with pytest.raises(CorruptedError, match="claims 1073741824 bytes"):
        list(sections)
    # Snapshots of older releases (version 1) still restore.
    meta, sections = read(_v1_bytes([(2, body), (9, body)]))
    assert meta == {"sqn": 1} and list(sections) == [(2, [["s", b"k", 1]])]


def test_a_snapshot_may_hold_more_sections_than_key_groups():
    """Large key groups span several sections: a big state outgrows MAX_KEY_GROUPS sections."""
    import io

    from dstl.backend.keygroups import MAX_KEY_GROUPS
    from dstl.backend.materialization import SnapshotWriter, read_sections
    from dstl.spi import KeyGroupRange

    buffer = io.BytesIO()
    writer = SnapshotWriter(buffer, "zstd")
    sections = MAX_KEY_GROUPS + 100
    for i in range(sections):
        writer.add_section(i * 2 // sections, [["s", b"k%d" % i, i]])
    size = writer.finish({"sqn": 1})
    data = buffer.getvalue()
    _, found = read_sections(lambda start, end: data[start:end], KeyGroupRange(0, 2), where="big", size=size)
    assert sum(len(entries) for _, entries in found) == sections


def test_a_full_snapshots_ttl_clock_travels_with_its_reference():
    from dstl.backend.materialization import MaterializationRef
    from dstl.spi import InvalidHandleError, KeyGroupRange

    full = MaterializationRef("job/snapshots/a.snap", KeyGroupRange(0, 8), 10, 100, 5, clock=1_700_000_000.5)
    assert MaterializationRef.from_dict(full.to_dict()) == full
    incremental = MaterializationRef("job/snapshots/b.snap", KeyGroupRange(0, 8), 12, 10, 1)
    assert "clock" not in incremental.to_dict()  # documents stay as earlier releases wrote them
    for forged in ("soon", True, float("nan"), float("inf")):
        with pytest.raises(InvalidHandleError, match="clock"):
            MaterializationRef.from_dict({**full.to_dict(), "clock": forged})


def test_runs_group_consecutive_entries_of_a_state_and_give_the_rows_back():
    from dstl.backend.materialization import checked_runs
    from dstl.backend.materialization.runs import as_runs, rows_of

    rows = [
        ["a", b"1", b"x"],
        ["a", b"2", [b"l"]],
        ["a", b"2", [b"m"], 1],  # a part continuing the list: a run of its own
        ["b", b"1", {b"k": b"v"}],
        ["a", b"3", b"y"],
    ]
    runs = as_runs(rows)
    assert runs == [
        ["a", [b"1", b"2"], [b"x", [b"l"]]],
        ["a", [b"2"], [[b"m"]], 1],
        ["b", [b"1"], [{b"k": b"v"}]],
        ["a", [b"3"], [b"y"]],
    ]
    assert rows_of(runs, 0, "test") == rows and as_runs([]) == []
    with pytest.raises(CorruptedError, match="key group 4 is not a list of runs"):
        list(checked_runs(5, 4, "test"))
