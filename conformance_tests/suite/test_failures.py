"""Failure behaviour: no hang when the service is gone, no corrupt bytes returned."""

from __future__ import annotations

import time

import pytest

from dstl.conformance import requires
from dstl.conformance.testing import assert_explained, change_bytes, persist, read_changes
from dstl.spi import ChangelogHandle, CorruptedError, KeyGroupRange, SequenceNumberRange, StorageError

KG = KeyGroupRange(0, 4)


@requires("corruption_injection")
def test_corrupted_bytes_are_reported_not_returned(storage, sut):
    backdoor = sut.require_backdoor()
    writer = storage.create_writer("op", KG)
    for index in range(5):
        writer.append(index % 4, change_bytes("c", index, 100))
    handle = persist(writer, 0, 1, sut.timeout)
    backdoor.corrupt(storage, handle)
    fresh = sut.open()
    returned = []
    with pytest.raises(CorruptedError) as info:
        for change in fresh.create_reader().read(handle):
            returned.append(change.data)
    assert not returned, "changes of a corrupted change set were returned before the error"
    assert_explained(info.value)


@requires("failure_injection")
def test_unreachable_service_fails_within_timeout(sut):
    backdoor = sut.require_backdoor()
    overrides, bound = backdoor.unreachable_config(sut.config)
    started = time.monotonic()
    with pytest.raises(StorageError):
        storage = sut.open(overrides=overrides)
        writer = storage.create_writer("op", KG)
        writer.append(0, b"lost")
        writer.persist(0, 1).result(timeout=bound + 30)
    elapsed = time.monotonic() - started
    assert elapsed <= bound, f"failing took {elapsed:.1f}s, more than the configured {bound:.1f}s"


def test_handle_of_another_storage_is_rejected(storage):
    foreign = ChangelogHandle.create(
        storage_id="some-other-storage" if storage.identifier != "some-other-storage" else "x",
        log_id="op.kg0-4",
        key_groups=KG,
        sqn_range=SequenceNumberRange(0, 1),
        locations=[{"object": "a", "offset": 0, "sqn": 0}],
    )
    with pytest.raises((StorageError, ValueError)) as info:
        read_changes(storage, foreign)
    assert_explained(info.value)


def test_handle_pointing_at_nothing_is_an_error_not_empty(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"real")
    real = persist(writer, 0, 1, sut.timeout)
    doc = real.to_dict()
    doc["log_id"] = "ghost.kg0-4"
    with pytest.raises((StorageError, ValueError)) as info:
        read_changes(storage, ChangelogHandle.from_dict(doc))
    assert_explained(info.value)


@requires("sync_failure_injection")
def test_a_failed_sync_loses_nothing_acknowledged_before_or_after(storage, sut):
    """PostgreSQL's fsync lesson: after a failed sync, every acknowledged persist still reads back."""
    backdoor = sut.require_backdoor()
    writer = storage.create_writer("op", KG)
    acknowledged = []
    expected: list[bytes] = []
    failures = 0
    with backdoor.failing_sync(storage) as fired:
        for index in range(8):
            data = change_bytes("sync", index, 300)
            writer.append(index % 4, data)
            expected.append(data)
            try:
                acknowledged.append((persist(writer, 0, index + 1, sut.timeout), list(expected)))
            except StorageError as exc:
                assert exc.retriable, f"a failed sync must be retriable: {exc}"
                failures += 1
    assert fired, "the backdoor injected no sync failure"
    assert failures <= 1 and len(acknowledged) >= 7
    for handle, data in acknowledged:
        assert [d for _, _, d in read_changes(storage, handle)] == data
    fresh = sut.open()
    for handle, data in acknowledged:
        assert [d for _, _, d in read_changes(fresh, handle)] == data
