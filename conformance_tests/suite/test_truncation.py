"""Truncation: materialized changes leave the writer and never come back."""

from __future__ import annotations

import time

import pytest

from dstl.conformance import requires
from dstl.conformance.testing import change_bytes, persist, read_data
from dstl.spi import ClosedError, KeyGroupRange, StorageError, TruncatedError

KG = KeyGroupRange(0, 4)


def _older(sut) -> None:
    """Wait until what exists now is older, by the storage's clock, than anything written next.

    Object ages may be counted in whole seconds (S3's Last-Modified); a storage declaring
    ``subsecond_ages`` ages them to the millisecond, so a short wait does.
    """
    time.sleep(0.05 if "subsecond_ages" in sut.capabilities else 1.1)


def _three_change_sets(writer):
    for sqn in range(3):
        writer.append(sqn, change_bytes("t", sqn, 1000))
        writer.next_sqn()


def test_persist_below_truncation_raises(storage, sut):
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    persist(writer, 0, 1, sut.timeout)
    writer.truncate(2)
    with pytest.raises(TruncatedError, match="truncated"):
        writer.persist(1, 2)
    with pytest.raises(TruncatedError, match="truncated"):
        writer.persist(0, 2)


def test_truncated_changes_never_returned_later(storage, sut):
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    persist(writer, 0, 1, sut.timeout)
    writer.truncate(2)
    writer.append(3, change_bytes("t", 3, 1000))
    handle = persist(writer, 2, 2, sut.timeout)
    assert read_data(storage, handle) == [change_bytes("t", 2, 1000), change_bytes("t", 3, 1000)]


def test_truncate_unpersisted_changes(storage, sut):
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    writer.truncate(3)
    writer.append(0, b"new")
    assert read_data(storage, persist(writer, 3, 1, sut.timeout)) == [b"new"]


def test_earlier_handles_stay_readable(storage, sut):
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    early = persist(writer, 0, 1, sut.timeout)
    writer.truncate(3)
    writer.append(0, b"later")
    persist(writer, 3, 2, sut.timeout)
    assert read_data(storage, early) == [change_bytes("t", s, 1000) for s in range(3)]


def test_writer_memory_falls(storage, sut):
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    persist(writer, 0, 1, sut.timeout)
    before = writer.buffered_bytes()
    assert before >= 0
    writer.truncate(3)
    assert writer.buffered_bytes() < before or before == 0
    assert writer.buffered_bytes() == 0


def test_truncate_and_close(storage, sut):
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    handle = persist(writer, 0, 1, sut.timeout)
    writer.append(0, b"never persisted")
    writer.truncate_and_close(3)
    with pytest.raises(ClosedError):
        writer.append(0, b"x")
    with pytest.raises(ClosedError):
        writer.persist(0, 2)
    assert read_data(storage, handle) == [change_bytes("t", s, 1000) for s in range(3)]


@requires("physical_truncation")
def test_discard_frees_stored_changes(sut):
    # Storages may reclaim space per segment or object, at the latest when the
    # writing storage closes; after that the discarded bytes must be gone.
    storage = sut.open()
    writer = storage.create_writer("op", KG)
    _three_change_sets(writer)
    handle = persist(writer, 0, 1, sut.timeout)
    writer.truncate(3)
    storage.discard([handle])
    storage.close()
    with pytest.raises(StorageError):
        read_data(sut.open(), handle)


@requires("orphan_collection")
def test_orphan_collection_keeps_live_handles_and_frees_the_rest(storage, sut):
    """Change data no checkpoint references (failed attempts) is freed; what live handles need stays."""
    kept_writer = storage.create_writer("kept", KG)
    orphan_writer = storage.create_writer("orphan", KG, epoch=1)
    kept_writer.append(0, b"kept")
    kept = persist(kept_writer, 0, 1, sut.timeout)
    orphan_writer.append(1, b"never checkpointed")
    orphan = persist(orphan_writer, 0, 1, sut.timeout)
    orphan_writer.close()  # the attempt failed: nobody will discard its data
    _older(sut)
    cutoff = time.time()
    _older(sut)
    kept_writer.append(0, b"after the cutoff")
    recent = persist(kept_writer, 1, 2, sut.timeout)  # in flight when collection runs
    storage.collect_orphans([kept], older_than=cutoff)
    assert read_data(storage, kept) == [b"kept"]
    assert read_data(storage, recent) == [b"after the cutoff"], "data newer than the cutoff was collected"
    # Storages may keep an orphan while a live change set shares its object or
    # segment; once no live handle needs anything, all of it is freed.
    kept_writer.close()
    _older(sut)
    storage.collect_orphans([], older_than=time.time())
    for handle in (orphan, kept, recent):
        with pytest.raises(StorageError):
            read_data(storage, handle)
    assert sut.require_backdoor().list_objects(storage) == []


@requires("orphan_collection")
def test_a_live_handle_keeps_every_object_its_change_sets_lie_in(storage, sut):
    """A handle whose change sets were uploaded by several persists (objects, segments) keeps all of
    them through orphan collection, not only the one its newest change set lies in."""
    writer = storage.create_writer("spans", KG)
    uploads = [f"upload {n}".encode() for n in range(4)]
    for checkpoint_id, data in enumerate(uploads, start=1):
        writer.append(checkpoint_id - 1, data)
        handle = persist(writer, 0, checkpoint_id, sut.timeout)  # from the start: earlier uploads reused
    _older(sut)  # every object is older than the cutoff below
    storage.collect_orphans([handle], older_than=time.time())
    assert read_data(storage, handle) == uploads
    assert read_data(sut.open(), handle) == uploads


@requires("orphan_collection")
def test_an_object_appended_to_after_the_cutoff_is_aged_by_its_last_append(storage, sut):
    """A storage that appends a log's change sets to one long-lived object (a segment) must judge its
    age by the last append: one that landed after the cutoff may be a persist still in flight."""
    writer = storage.create_writer("appends", KG)
    writer.append(0, b"an attempt whose checkpoint never completed")
    persist(writer, 0, 1, sut.timeout)  # an orphan: no live handle will name it
    _older(sut)
    cutoff = time.time()
    _older(sut)
    writer.append(1, b"in flight when collection runs")
    recent = persist(writer, 1, 2, sut.timeout)
    storage.collect_orphans([], older_than=cutoff)
    assert read_data(storage, recent) == [b"in flight when collection runs"], (
        "an object was aged by its creation, not by the append that landed after the cutoff"
    )


@requires("orphan_collection")
def test_another_instances_collection_never_takes_an_open_writers_object(storage, sut):
    """An instance's open writer keeps writing where it wrote before (an unsealed segment, an open
    object): another instance of the job, collecting everything as old, must leave it usable."""
    writer = storage.create_writer("idle", KG)
    writer.append(0, b"written, then idle")
    persist(writer, 0, 1, sut.timeout)
    _older(sut)
    sut.open().collect_orphans([], older_than=time.time())  # another instance: everything counts as old
    writer.append(1, b"written after the other's collection")
    later = persist(writer, 1, 2, sut.timeout)
    assert read_data(storage, later) == [b"written after the other's collection"]


def test_longest_upload_is_a_duration_in_seconds(storage):
    """What the checkpoint coordinator compares orphan collection's grace with: a number, never negative."""
    longest = storage.longest_upload
    number = isinstance(longest, int | float) and not isinstance(longest, bool)
    assert number, f"longest_upload is {longest!r}, not a number of seconds"
    assert longest >= 0
