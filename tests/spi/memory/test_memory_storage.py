"""The memory storage's exact contract (the conformance suite covers it again, generically)."""

import pytest

from dstl.conformance.testing import restricted_handle
from dstl.spi import (
    ChangelogHandle,
    ClosedError,
    CorruptedError,
    FencedError,
    KeyGroupRange,
    StorageError,
    TruncatedError,
    load_storage,
)
from dstl.spi.memory import namespace_objects

KG = KeyGroupRange(0, 4)


@pytest.fixture
def storage(memory_config):
    with load_storage(memory_config, job_id="job") as s:
        yield s


def read_all(storage, handle, key_groups=None):
    return [(c.sqn, c.key_group, c.data) for c in storage.create_reader().read(handle, key_groups)]


def test_boundary_without_appends_does_not_advance(storage):
    w = storage.create_writer("op", KG)
    assert w.initial_sqn() == 0
    assert w.next_sqn() == 0
    assert w.next_sqn() == 0
    w.append(0, b"a")
    assert w.last_appended_sqn() == 0
    assert w.next_sqn() == 1
    assert w.next_sqn() == 1
    w.append(1, b"b")
    w.append(2, b"c")
    assert w.last_appended_sqn() == 1
    assert w.next_sqn() == 2


def test_persist_returns_exactly_changes_from_start(storage):
    w = storage.create_writer("op", KG)
    for sqn in range(5):
        w.append(sqn % 4, f"c{sqn}".encode())
        w.next_sqn()
    first = w.persist(0, 1).result()
    assert [d for _, _, d in read_all(storage, first)] == [b"c0", b"c1", b"c2", b"c3", b"c4"]
    w.append(0, b"c5")
    second = w.persist(3, 2).result()
    assert second.sqn_range.start == 3 and second.sqn_range.end == 6
    assert read_all(storage, second) == [(3, 3, b"c3"), (4, 0, b"c4"), (5, 0, b"c5")]
    # c3, c4 share one object with c0..c2 and were not uploaded again.
    assert second.incremental_size == len(b"c5")
    assert second.size == 3 * 2


def test_persist_closes_open_change_set(storage):
    w = storage.create_writer("op", KG)
    w.append(0, b"x")
    handle = w.persist(0, 1).result()
    assert handle.sqn_range.end == 1
    assert w.next_sqn() == 1


def test_key_group_filter_keeps_meta(storage):
    w = storage.create_writer("op", KG)
    w.append_meta(b"registration")
    w.append(0, b"zero")
    w.append(3, b"three")
    handle = w.persist(0, 1).result()
    assert [d for _, _, d in read_all(storage, handle, KeyGroupRange(3, 4))] == [b"registration", b"three"]


def test_truncation(storage):
    w = storage.create_writer("op", KG)
    w.append(0, b"a" * 1000)
    w.next_sqn()
    w.append(0, b"b" * 1000)
    early = w.persist(0, 1).result()
    held = w.buffered_bytes()
    w.truncate(1)
    assert w.buffered_bytes() < held
    with pytest.raises(TruncatedError):
        w.persist(0, 2)
    later = w.persist(1, 2).result()
    assert [d[:1] for _, _, d in read_all(storage, later)] == [b"b"]
    assert len(read_all(storage, early)) == 2  # earlier handle stays readable


def test_truncate_beyond_next_sqn_is_rejected(storage):
    w = storage.create_writer("op", KG)
    with pytest.raises(ValueError, match="next SQN"):
        w.truncate(5)


def test_fencing(storage, memory_config):
    old = storage.create_writer("op", KG, epoch=1)
    old.append(0, b"old")
    with load_storage(memory_config, job_id="job") as other:
        new = other.create_writer("op", KG, epoch=2)
        with pytest.raises(FencedError):
            old.persist(0, 1).result()
        with pytest.raises(FencedError):
            old.append(0, b"more")
        new.append(0, b"new")
        handle = new.persist(0, 1).result()
        assert [d for _, _, d in read_all(other, handle)] == [b"new"]
        with pytest.raises(FencedError, match="epoch 2 > 1"):
            storage.create_writer("op", KG, epoch=1)


def test_confirm_drops_data_and_reset_reuploads(storage):
    w = storage.create_writer("op", KG)
    w.append(0, b"x" * 100)
    h1 = w.persist(0, 1).result()
    assert h1.incremental_size == 100
    w.confirm(0, 1, 1)
    assert w.buffered_bytes() == 0
    w.append(0, b"y" * 50)
    h2 = w.persist(0, 2).result()
    assert h2.incremental_size == 50
    w.reset(0, 2, 2)  # checkpoint 2 aborted: the unconfirmed SQN 1 is uploaded again
    h3 = w.persist(0, 3).result()
    assert h3.incremental_size == 50
    assert h3.location_dicts[0] == h1.location_dicts[0]
    assert h3.location_dicts[1] != h2.location_dicts[1]


def test_discard_removes_objects(storage, memory_config):
    w = storage.create_writer("op", KG)
    w.append(0, b"x")
    handle = w.persist(0, 1).result()
    assert storage.list_objects()
    storage.discard([handle])
    assert storage.list_objects() == []
    assert storage.metrics.counter("discarded_change_sets") == 1
    with pytest.raises(StorageError, match="discarded"):
        read_all(storage, handle)


def test_fresh_instance_reads_handle_json(storage, memory_config):
    w = storage.create_writer("op", KG)
    w.append(2, b"durable")
    text = w.persist(0, 1).result().to_json()
    with load_storage(memory_config, job_id="other") as fresh:
        handle = ChangelogHandle.from_json(text)
        assert [d for _, _, d in read_all(fresh, handle)] == [b"durable"]


def test_corruption_is_reported(storage, memory_config):
    w = storage.create_writer("op", KG)
    w.append(0, b"precious")
    handle = w.persist(0, 1).result()
    blob = namespace_objects(memory_config["dstl.memory.namespace"])[handle.location_dicts[0]["object"]]
    blob[-2] ^= 0x01
    with pytest.raises(CorruptedError, match="checksum"):
        read_all(storage, handle)


def test_bad_input(storage):
    w = storage.create_writer("op", KG)
    with pytest.raises(ValueError, match="outside this writer's range"):
        w.append(4, b"x")
    with pytest.raises(TypeError, match="bytes-like"):
        w.append(0, "text")
    with pytest.raises(ValueError, match="non-negative"):
        w.persist(-1, 1)
    with pytest.raises(ValueError):
        storage.create_writer("../escape", KG)
    w.close()
    with pytest.raises(ClosedError):
        w.append(0, b"x")


def test_truncate_and_close_drops_unpersisted(storage):
    w = storage.create_writer("op", KG)
    w.append(0, b"kept")
    handle = w.persist(0, 1).result()
    w.append(0, b"lost")
    w.truncate_and_close(1)
    with pytest.raises(ClosedError):
        w.persist(0, 2)
    assert [d for _, _, d in read_all(storage, handle)] == [b"kept"]


def test_metrics_move(storage):
    w = storage.create_writer("op", KG)
    w.append(0, b"x")
    w.persist(0, 1).result()
    counters = storage.metrics.counters()
    assert counters["appends"] == 1 and counters["persists"] == 1 and counters["uploads"] == 1
    assert counters["uploaded_bytes"] > 0


def test_an_object_is_deleted_only_when_all_its_change_sets_are_discarded(storage):
    w = storage.create_writer("op", KG)
    for sqn in range(3):
        w.append(0, f"cs{sqn}".encode())
        w.next_sqn()
    everything = w.persist(0, 1).result()  # one object, three change sets
    later = w.persist(2, 2).result()  # reuses the same object for change set 2
    assert len(storage.list_objects()) == 1
    first_two = ChangelogHandle.create(
        storage_id="memory",
        log_id=everything.log_id,
        key_groups=KG,
        sqn_range=everything.sqn_range,
        locations=everything.location_dicts[:2],
    )
    storage.discard([first_two])
    assert len(storage.list_objects()) == 1
    assert read_all(storage, later) == [(2, 0, b"cs2")]
    storage.discard([later])
    assert storage.list_objects() == []


def test_a_delayed_upload_that_fails_on_its_worker_fails_the_persist(monkeypatch):
    """Uploads run on worker threads when delayed: a failure there reaches the persist, never a hang."""
    from dstl.spi.memory import MemoryWriter

    def broken(*_args):
        raise OSError("injected: the object store went away")

    config = {
        "dstl.storage": "memory",
        "dstl.memory.namespace": "delayed-failure",
        "dstl.memory.upload-delay": "5ms",
    }
    with load_storage(config, job_id="delayed") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"before")
        assert writer.persist(0, 1).result(timeout=5).sqn_range.end == 1  # delayed, and it lands
        monkeypatch.setattr(MemoryWriter, "_write_object", broken)
        writer.append(0, b"lost")
        with pytest.raises(OSError, match="went away"):
            writer.persist(1, 2).result(timeout=5)


def _relocated(handle, **changes):
    """``handle`` with its first location's fields changed (a forged or damaged handle)."""
    return restricted_handle(handle, [{**handle.location_dicts[0], **changes}])


def test_a_discard_naming_the_wrong_sqn_or_no_header_frees_nothing_and_says_why(storage, caplog):
    """The change set at a location must be the handle's, SQN included; one that is not (or is no
    change set at all) stays, with a warning naming the object, the offset and the reason."""
    w = storage.create_writer("op", KG)
    w.append(0, b"kept")
    handle = w.persist(0, 1).result()
    name = handle.location_dicts[0]["object"]
    storage.discard([_relocated(handle, sqn=5)])
    storage.discard([_relocated(handle, offset=3)])  # inside the change set: no header there
    assert read_all(storage, handle) == [(0, 0, b"kept")]
    assert storage.metrics.counters()["refused_discards"] == 2
    warnings = [r.getMessage() for r in caplog.records if "ignoring the discard" in r.getMessage()]
    assert warnings == [
        f"ignoring the discard of memory://{name} offset 0 by a handle of log {handle.log_id!r}: "
        "it holds SQN 0, not 5 (a damaged or forged handle)",
        f"ignoring the discard of memory://{name} offset 3 by a handle of log {handle.log_id!r}: "
        f"no change-set header (memory://{name} at offset 3) (a damaged or forged handle)",
    ]


def test_a_log_with_the_longest_operator_id_is_freed(storage):
    """The header read before a discard holds the longest log id a name may have."""
    w = storage.create_writer("o" * 190, KG)
    for _ in range(3):
        w.append(0, b"x" * 100)
        w.next_sqn()
    handles = [w.persist(0, 1).result()]  # one object, three change sets
    storage.discard(handles)
    assert storage.metrics.counters().get("refused_discards", 0) == 0
    assert storage.list_objects() == []


def test_a_batch_holds_as_many_bytes_as_its_changes_appended_one_by_one(storage):
    one_by_one, batched = storage.create_writer("a", KG), storage.create_writer("b", KG)
    changes = [(0, b"x" * 10), (1, b"y" * 20), (3, b"z" * 30)]
    for key_group, data in changes:
        one_by_one.append(key_group, data)
    batched.append_all([kg for kg, _ in changes], [data for _, data in changes])
    assert batched.buffered_bytes() == one_by_one.buffered_bytes() >= 60
