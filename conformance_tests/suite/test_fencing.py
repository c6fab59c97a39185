"""Fencing: a newer epoch owns the log; the older writer can no longer persist."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstl.conformance import requires
from dstl.conformance._private.subprocesses import child_request, run_child
from dstl.conformance.testing import assert_explained, change_bytes, persist, read_data
from dstl.spi import ChangelogHandle, FencedError, KeyGroupRange, StorageError

KG = KeyGroupRange(0, 4)

pytestmark = requires("fencing")


def _persist_fails_fenced(writer, timeout):
    try:
        future = writer.persist(0, 99)
    except FencedError as exc:
        assert_explained(exc)
        return
    with pytest.raises(FencedError) as info:
        future.result(timeout=timeout)
    assert_explained(info.value)


def test_newer_epoch_fences_older_persist(sut):
    old_storage, new_storage = sut.open(), sut.open()
    old = old_storage.create_writer("op", KG, epoch=1)
    old.append(0, b"old")
    new_storage.create_writer("op", KG, epoch=2)
    _persist_fails_fenced(old, sut.timeout)


def test_newer_epoch_fences_a_writer_that_persisted_before(sut):
    # Storages may skip work on persists that look routine; a takeover must still show.
    old_storage, new_storage = sut.open(), sut.open()
    old = old_storage.create_writer("op", KG, epoch=1)
    for checkpoint in range(1, 5):
        old.append(0, f"old {checkpoint}".encode())
        persist(old, 0, checkpoint, sut.timeout)
    new_storage.create_writer("op", KG, epoch=2)
    old.append(0, b"zombie")
    _persist_fails_fenced(old, sut.timeout)


def test_a_fenced_writer_refuses_everything_after(sut):
    """Once a persist failed fenced, the writer says so on every call, it never writes again."""
    old_storage = sut.open()
    old = old_storage.create_writer("op", KG, epoch=3)
    old.append(0, b"before")
    persist(old, 0, 1, sut.timeout)
    new = sut.open().create_writer("op", KG, epoch=4)
    old.append(0, b"zombie")
    _persist_fails_fenced(old, sut.timeout)
    for call in (lambda: old.append(1, b"more"), lambda: old.append_meta(b"m"), lambda: old.persist(0, 2)):
        with pytest.raises(FencedError, match="fenced"):
            call()
    new.append(2, b"owner")
    assert read_data(sut.open(), persist(new, 0, 1, sut.timeout)) == [b"owner"]


def test_a_writer_of_the_same_epoch_takes_over(sut):
    """Only a lower epoch is refused: a writer recreated with the owner's epoch (a restarted
    attempt) owns the log, and the earlier writer of that epoch can no longer persist."""
    first = sut.open().create_writer("op", KG, epoch=7)
    first.append(0, b"first")
    second_storage = sut.open()
    second = second_storage.create_writer("op", KG, epoch=7)
    second.append(1, b"second")
    assert read_data(second_storage, persist(second, 0, 1, sut.timeout)) == [b"second"]
    _persist_fails_fenced(first, sut.timeout)


def test_fenced_error_is_a_non_retriable_storage_error():
    assert issubclass(FencedError, StorageError)
    assert FencedError("x").retriable is False


def test_nothing_written_after_fencing_is_in_newer_handles(sut):
    old_storage, new_storage = sut.open(), sut.open()
    old = old_storage.create_writer("op", KG, epoch=1)
    new = new_storage.create_writer("op", KG, epoch=2)
    try:
        old.append(1, b"zombie")
    except FencedError:
        pass
    else:
        _persist_fails_fenced(old, sut.timeout)
    new.append(1, b"owner")
    handle = persist(new, 0, 1, sut.timeout)
    assert read_data(new_storage, handle) == [b"owner"]
    assert read_data(old_storage, handle) == [b"owner"]


def test_creating_an_older_epoch_is_refused(sut):
    sut.open().create_writer("op", KG, epoch=5)
    with pytest.raises(FencedError) as info:
        sut.open().create_writer("op", KG, epoch=4)
    assert_explained(info.value)


def test_data_persisted_before_fencing_stays_readable(sut):
    old_storage = sut.open()
    old = old_storage.create_writer("op", KG, epoch=1)
    old.append(0, b"before")
    handle = persist(old, 0, 1, sut.timeout)
    sut.open().create_writer("op", KG, epoch=2)
    assert read_data(sut.open(), handle) == [b"before"]


def test_other_logs_are_not_fenced(sut):
    storage = sut.open()
    other = storage.create_writer("other", KG, epoch=1)
    storage.create_writer("op", KG, epoch=1)
    sut.open().create_writer("op", KG, epoch=2)
    other.append(0, b"unaffected")
    assert read_data(storage, persist(other, 0, 1, sut.timeout)) == [b"unaffected"]


@requires("multi_process")
def test_fencing_across_processes(sut):
    storage = sut.open()
    old = storage.create_writer("shared-op", KG, epoch=1)
    old.append(0, b"parent-before")
    request = child_request(
        sut, mode="take-over", operator_id="shared-op", key_groups=(0, 4), epoch=2, count=10, tag="child"
    )
    code, events, stderr = run_child(request, sut.subprocess_env(), timeout=sut.timeout * 2)
    assert code == 0, stderr[-2000:]
    handle = ChangelogHandle.from_json(next(e for e in events if e["event"] == "persisted")["handle"])
    _persist_fails_fenced(old, sut.timeout)
    assert read_data(storage, handle) == [change_bytes("child", i) for i in range(10)]


#: Epochs where a wrong comparison shows: digit-count boundaries, 32-bit and float
#: limits, and the Spark integration's ``run * 10**12 + task attempt id``.
EPOCH_EDGES = (
    0,
    1,
    9,
    10,
    99,
    100,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**32 + 1,
    10**12 - 1,
    10**12,
    10**12 + 1,
    2 * 10**12 + 7,
    10**13,
    2**53,
    2**53 + 1,
    2**63 - 1,
)
_epochs = st.one_of(st.sampled_from(EPOCH_EDGES), st.integers(0, 2**63 - 1))
_fenced_logs = itertools.count()


@given(order=st.lists(_epochs, min_size=2, max_size=4, unique=True))
@settings(max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_fencing_orders_epochs_of_any_size(sut, order):
    """Writers created in ``order``: a lower epoch than the owner's is refused, a higher one fences it."""
    operator = f"epochs-{next(_fenced_logs)}"
    owner, owner_epoch = None, None
    for epoch in order:
        storage = sut.open()
        if owner_epoch is not None and epoch < owner_epoch:
            with pytest.raises(FencedError):
                storage.create_writer(operator, KG, epoch=epoch)
            continue
        writer = storage.create_writer(operator, KG, epoch=epoch)
        if owner is not None:
            owner.append(0, b"zombie")
            _persist_fails_fenced(owner, sut.timeout)
        owner, owner_epoch = writer, epoch
    assert owner is not None
    owner.append(1, str(owner_epoch).encode())
    handle = persist(owner, 0, 1, sut.timeout)
    assert handle.epoch == owner_epoch
    assert read_data(sut.open(), handle) == [str(owner_epoch).encode()]
    sut.close()


@pytest.mark.parametrize(("older_epoch", "newer_epoch"), [(1, 2), (7, 7)], ids=["new-epoch", "retry"])
def test_two_attempts_of_one_range_never_overwrite_each_other(sut, older_epoch, newer_epoch):
    """A retry or a new epoch persists the same SQNs again: the older handle keeps its own bytes.

    It may instead fail as fenced; it never returns the newer attempt's changes.
    """
    older = sut.open().create_writer("op", KG, epoch=older_epoch)
    older.append(0, b"older attempt")
    older_handle = persist(older, 0, 1, sut.timeout)
    newer_storage = sut.open()
    newer = newer_storage.create_writer("op", KG, epoch=newer_epoch)
    newer.append(0, b"newer attempt")
    newer_handle = persist(newer, 0, 1, sut.timeout)
    assert older_handle.sqn_range == newer_handle.sqn_range
    assert read_data(newer_storage, newer_handle) == [b"newer attempt"]
    try:
        older_data = read_data(sut.open(), older_handle)
    except FencedError as exc:
        assert_explained(exc)
    else:
        assert older_data == [b"older attempt"], "the older attempt's handle returned other bytes"
