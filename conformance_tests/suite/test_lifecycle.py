"""Confirm, reset, discard and leaks: the documented lifecycle of persisted changes."""

from __future__ import annotations

import os
import random

import pytest

from dstl.conformance import requires
from dstl.conformance.testing import change_bytes, persist, read_data, restricted_handle
from dstl.spi import KeyGroupRange
from dstl.spi.names import MAX_NAME_LENGTH

KG = KeyGroupRange(0, 4)


def test_confirmed_changes_are_reused_not_uploaded_again(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"x" * 100)
    first = persist(writer, 0, 1, sut.timeout)
    writer.confirm(first.sqn_range.start, first.sqn_range.end, 1)
    writer.append(1, b"y" * 10)
    second = persist(writer, 0, 2, sut.timeout)
    assert second.incremental_size == 10
    assert second.size == 110
    assert read_data(storage, second) == [b"x" * 100, b"y" * 10]


def test_reset_uploads_unconfirmed_changes_again(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"a" * 50)
    first = persist(writer, 0, 1, sut.timeout)
    writer.confirm(0, first.sqn_range.end, 1)
    writer.append(0, b"b" * 20)
    aborted = persist(writer, 0, 2, sut.timeout)
    writer.reset(0, aborted.sqn_range.end, 2)
    # The caller discards what only the aborted checkpoint referenced.
    aborted_only = _only_new(aborted, first)
    assert aborted_only is not None, "the aborted persist must have uploaded the new change set"
    storage.discard([aborted_only])
    retry = persist(writer, 0, 3, sut.timeout)
    assert retry.incremental_size == 20, "reset change sets must be uploaded again"
    assert read_data(storage, retry) == [b"a" * 50, b"b" * 20]


def _only_new(handle, older):
    """The part of ``handle`` that ``older`` does not share, as a handle (or None)."""
    shared = set(older.locations)
    own = [dict(loc) for loc in handle.locations if loc not in shared]
    return restricted_handle(handle, own) if own else None


def test_discarding_one_log_keeps_other_logs_readable(storage, sut):
    a = storage.create_writer("a", KG)
    b = storage.create_writer("b", KG)
    for index in range(10):
        a.append(index % 4, change_bytes("a", index))
        b.append(index % 4, change_bytes("b", index))
    futures = [a.persist(0, 1), b.persist(0, 1)]
    handle_a, handle_b = (f.result(timeout=sut.timeout) for f in futures)
    storage.discard([handle_a])
    assert read_data(storage, handle_b) == [change_bytes("b", i) for i in range(10)]


def test_discarding_some_change_sets_of_an_upload_keeps_the_others(storage, sut):
    writer = storage.create_writer("op", KG)
    for sqn in range(3):
        writer.append(0, change_bytes("u", sqn))
        writer.next_sqn()
    everything = persist(writer, 0, 1, sut.timeout)  # one upload: may share an object
    later = persist(writer, 2, 2, sut.timeout)  # reuses the upload of change set 2
    storage.discard([restricted_handle(everything, everything.location_dicts[:2])])
    assert read_data(storage, later) == [change_bytes("u", 2)]
    assert read_data(sut.open(), later) == [change_bytes("u", 2)]


def test_close_is_idempotent(sut):
    storage = sut.open()
    writer = storage.create_writer("op", KG)
    writer.close()
    writer.close()
    storage.close()
    storage.close()


@requires("leak_check")
def test_no_objects_remain_after_discard_and_close(sut):
    backdoor = sut.require_backdoor()
    storage = sut.open()
    handles = []
    longest = "o" * (MAX_NAME_LENGTH - len(f".kg{KG.start}-{KG.end}"))  # its log id is as long as names go
    for name in ("op-0", "op-1", longest):
        writer = storage.create_writer(name, KG)
        for round_ in range(4):
            writer.append(round_ % 4, change_bytes(name[:4], round_, 2000))
            handles.append(persist(writer, 0, round_ + 1, sut.timeout))
            writer.confirm(0, handles[-1].sqn_range.end, round_ + 1)
        writer.close()
    assert backdoor.list_objects(storage), "objects must exist before discarding (backdoor sees nothing?)"
    storage.discard(handles)
    storage.close()
    assert backdoor.list_objects(sut.open()) == []


@requires("metadata_check")
def test_metadata_does_not_grow_with_writer_epochs(storage, sut):
    """A job makes a writer per task and batch: metadata must stay bounded by the live logs."""
    backdoor = sut.require_backdoor()
    latest = {}
    counts = {}
    for epoch in range(1, 201):
        for operator in ("a", "b"):
            writer = storage.create_writer(operator, KeyGroupRange(0, 4), epoch=epoch)
            writer.append(0, change_bytes("m", epoch))
            handle = persist(writer, 0, epoch, sut.timeout)
            writer.close()
            if operator in latest:
                storage.discard([latest[operator]])
            latest[operator] = handle
        if epoch in (20, 200):
            counts[epoch] = len(backdoor.list_metadata(storage))
    assert counts[200] <= counts[20] + 2, f"metadata grew with writer epochs: {counts}"


def test_discards_interleaved_with_many_handles_sharing_many_objects(sut):
    """What a shared-state registry does over a job's life, at a volume that makes a storage roll.

    Forty checkpoints of incompressible change sets (well past the smallest object,
    segment or batch size the environment configures) give handles that share
    change sets across many objects. Then, in random order, handles are dropped:
    each time the change sets no remaining handle references are discarded, and
    every remaining handle must read back exactly, through this instance and a new one.
    """
    rng = random.Random(20261125)
    storage = sut.open()
    writer = storage.create_writer("volume", KG)
    change_sets: dict[int, list[bytes]] = {}
    handles = []
    lowest = writer.initial_sqn()
    for checkpoint in range(1, 41):
        for _ in range(rng.randint(1, 3)):
            sqn = writer.next_sqn()
            data = [os.urandom(rng.choice((0, 120, 1500, 6000))) for _ in range(rng.randint(1, 4))]
            for index, item in enumerate(data):
                writer.append((sqn + index) % 4, item)
            change_sets[sqn] = data
        handle = persist(writer, lowest, checkpoint, sut.timeout)
        writer.confirm(handle.sqn_range.start, handle.sqn_range.end, checkpoint)
        handles.append((handle, [d for s in sorted(change_sets) if s >= lowest for d in change_sets[s]]))
        if checkpoint % 6 == 0:  # a materialization: older change sets leave the writer
            lowest = rng.randint(lowest, writer.next_sqn())
            writer.truncate(lowest)
    assert sum(len(d) for data in change_sets.values() for d in data) > 256 * 1024
    rng.shuffle(handles)
    while len(handles) > 3:
        dropped, _ = handles.pop()
        needed = [loc for handle, _ in handles for loc in handle.location_dicts]
        only_dropped = [loc for loc in dropped.location_dicts if loc not in needed]
        if only_dropped:
            storage.discard([restricted_handle(dropped, only_dropped)])
        survivor, expected = handles[rng.randrange(len(handles))]
        assert read_data(storage, survivor) == expected
    fresh = sut.open()
    for handle, expected in handles:
        assert read_data(storage, handle) == expected
        assert read_data(fresh, handle) == expected


def test_confirm_and_reset_cover_exactly_their_half_open_range(storage, sut):
    writer = storage.create_writer("op", KG)
    for sqn in range(3):
        writer.append(sqn, change_bytes("c", sqn, 10))
        writer.next_sqn()
    persist(writer, 0, 1, sut.timeout)
    writer.confirm(0, 1, 1)  # change set 0 only: 1 is the range's end
    writer.reset(1, 2, 1)  # change set 1 only: 2 stays uploaded
    again = persist(writer, 0, 2, sut.timeout)
    assert again.incremental_size == 10, "reset change set 1 is uploaded again, nothing else"
    writer.reset(0, 3, 2)  # the confirmed change set 0 is kept whatever the range
    last = persist(writer, 0, 3, sut.timeout)
    assert last.incremental_size == 20, "every unconfirmed change set again, the confirmed one not"
    assert read_data(storage, last) == [change_bytes("c", s, 10) for s in range(3)]


def test_confirm_and_reset_never_free_what_is_not_persisted(storage, sut):
    """A range may reach past what its checkpoint persisted: those change sets stay, data and all."""
    writer = storage.create_writer("op", KG)
    writer.append(0, change_bytes("p", 0, 10))
    writer.next_sqn()
    persist(writer, 0, 1, sut.timeout)  # change set 0
    for sqn in (1, 2):  # closed, never persisted
        writer.append(sqn, change_bytes("p", sqn, 10))
        writer.next_sqn()
    writer.append(3, change_bytes("p", 3, 10))  # still open
    writer.confirm(0, 3, 1)
    writer.reset(0, 3, 1)
    handle = persist(writer, 0, 2, sut.timeout)
    assert read_data(storage, handle) == [change_bytes("p", s, 10) for s in range(4)]
    assert handle.incremental_size == 30, "the confirmed change set 0 is reused, 1 to 3 are uploaded now"


def test_buffered_bytes_follow_what_the_writer_holds(storage, sut):
    writer = storage.create_writer("op", KG)
    for sqn in range(4):
        writer.append(sqn, change_bytes("b", sqn, 100))
        writer.next_sqn()
    assert writer.buffered_bytes() >= 400, "appended data is held until persisted"
    handle = persist(writer, 0, 1, sut.timeout)
    writer.confirm(0, 2, 1)
    assert 0 <= writer.buffered_bytes() <= 400
    writer.truncate(2)  # change sets 0 and 1: confirmed before, dropped now
    assert 0 <= writer.buffered_bytes() <= 200
    writer.confirm(2, handle.sqn_range.end, 1)
    writer.truncate(handle.sqn_range.end)
    assert writer.buffered_bytes() == 0
    writer.append(0, b"o" * 50)  # an open change set is held too
    assert writer.buffered_bytes() >= 50
    writer.close()
    assert writer.buffered_bytes() == 0, "a closed writer holds nothing"


def test_truncation_stops_at_what_exists(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"a")
    open_sqn = writer.last_appended_sqn()
    writer.truncate(open_sqn)  # keeps the open change set open
    writer.append(1, b"b")
    assert writer.last_appended_sqn() == open_sqn, "truncating at the open change set closed it"
    with pytest.raises(ValueError, match="truncate"):
        writer.truncate(open_sqn + 2)  # beyond even the open change set
    writer.truncate(open_sqn + 1)  # the open change set too: materialized with the rest
    assert writer.next_sqn() == open_sqn + 1
    with pytest.raises(ValueError, match="truncate"):
        writer.truncate(open_sqn + 2)  # nothing is open now: the next SQN is the limit
    writer.append(2, b"c")
    handle = persist(writer, open_sqn + 1, 1, sut.timeout)
    assert read_data(storage, handle) == [b"c"]


def test_a_writer_says_which_log_key_groups_and_epoch_it_writes(storage, sut):
    writer = storage.create_writer("op", KG, epoch=11)
    assert (writer.key_groups, writer.epoch) == (KG, 11)
    writer.append(0, b"x")
    handle = persist(writer, 0, 1, sut.timeout)
    assert (handle.log_id, handle.key_groups, handle.epoch) == (writer.log_id, KG, 11)
    assert storage.create_writer("op2", KG).log_id != writer.log_id


def test_one_writer_per_checkpoint_never_confirms_truncates_or_resets(storage, sut):
    """An engine whose writer lives one checkpoint (Spark: one task) uses only create, append, persist, close.

    Each checkpoint's writer has a newer epoch and starts its own SQNs; its handle reads
    back exactly its own changes, the older handles theirs, and discarding the older
    ones (what the engine does instead of ``truncate``) leaves the newer readable.
    """
    handles, expected = [], []
    for checkpoint in range(1, 6):
        writer = storage.create_writer("op", KG, epoch=checkpoint)
        data = [change_bytes(f"c{checkpoint}", index) for index in range(3)]
        for index, item in enumerate(data):
            writer.append(index % 4, item)
        handles.append(persist(writer, writer.initial_sqn(), checkpoint, sut.timeout))
        expected.append(data)
        writer.close()
    for handle, data in zip(handles, expected, strict=True):
        assert read_data(storage, handle) == data, "a handle must read its own writer's changes only"
    storage.discard(handles[:3])
    for handle, data in zip(handles[3:], expected[3:], strict=True):
        assert read_data(storage, handle) == data, "discarding older checkpoints' logs kept the newer ones"
