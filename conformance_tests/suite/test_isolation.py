"""Jobs sharing one storage, and readers that only read: nobody touches what is not theirs.

Teams put many jobs on one bucket, one directory or one cluster, and tools open a
job's storage only to read its handles. A discard must free only the change sets
its handle really names, orphan collection only its own job's data (judged by the
store's clock, never by a writer's), and a read-only open must create nothing.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path

import pytest

from dstl.conformance import requires
from dstl.conformance.testing import persist, read_data
from dstl.spi import (
    ChangelogHandle,
    DstlError,
    JobConflictError,
    KeyGroupRange,
    ReadOnlyError,
    load_storage,
    storage_for_handle,
)

KG = KeyGroupRange(0, 8)


def _forged(handle: ChangelogHandle, **fields) -> ChangelogHandle:
    doc = json.loads(handle.to_json())
    doc.update(fields)
    return ChangelogHandle.from_json(json.dumps(doc))


def _files(root: Path) -> list[str]:
    """Every path under ``root`` (a database engine may tidy its own journal: names, not sizes)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_handle_naming_another_logs_change_sets_frees_none_of_them(storage, sut):
    victim, thief = storage.create_writer("victim", KG), storage.create_writer("thief", KG)
    victim.append(0, b"the victim's live change set")
    thief.append(1, b"the thief's own")
    live = persist(victim, 0, 1, sut.timeout)
    persist(thief, 0, 1, sut.timeout)
    victim.close()
    thief.close()
    for lie in (
        {"log_id": thief.log_id},  # another log claims the victim's locations
        {"epoch": live.epoch + 1},  # the same log, another writer epoch
    ):
        with contextlib.suppress(DstlError):  # refusing the handle outright is fine too
            storage.discard([_forged(live, **lie)])
    assert read_data(storage, live) == [b"the victim's live change set"]
    assert read_data(sut.open(), live) == [b"the victim's live change set"]


def test_a_handle_relabelling_its_own_change_sets_frees_none_of_them(storage, sut):
    """A handle of the right log and epoch whose locations swap their SQNs frees nothing.

    The header of every change set names its SQN: a discard that checks only the log
    and the epoch frees a change set another handle of the same log still needs (a
    handle edited by hand, or damaged, that names SQN 1 where SQN 0 lies).
    """
    writer = storage.create_writer("op", KG)
    writer.append(0, b"first")
    persist(writer, 0, 1, sut.timeout)
    writer.append(1, b"second")
    live = persist(writer, 0, 2, sut.timeout)
    writer.close()
    locations = json.loads(live.to_json())["locations"]
    sqns = [location.get("sqn") for location in locations]
    if len(locations) != 2 or len(set(sqns)) != 2 or None in sqns:
        pytest.skip("the storage's locations do not name one SQN each")
    swapped = [{**location, "sqn": sqn} for location, sqn in zip(locations, reversed(sqns), strict=True)]
    with contextlib.suppress(DstlError):  # refusing the handle outright is fine too
        storage.discard([_forged(live, locations=swapped)])
    assert read_data(storage, live) == [b"first", b"second"]
    assert read_data(sut.open(), live) == [b"first", b"second"]


def test_logs_whose_ids_prefix_each_other_stay_apart(storage, sut):
    """Discarding (and orphan-collecting) ``op.kg0-4`` leaves ``op.kg0-43`` and ``op.kg0-4.kg0-8`` whole.

    A storage that names a log's objects or files by its id and cleans up by prefix,
    without a separator, takes the longer ids' data with it (key-group ranges make
    such ids: an operator rescaled from 43 key groups to 4, or an operator named so).
    """
    logs = [("op", KeyGroupRange(0, 4)), ("op", KeyGroupRange(0, 43)), ("op.kg0-4", KG)]
    handles = []
    for name, key_groups in logs:
        writer = storage.create_writer(name, key_groups)
        writer.append(0, f"data of {writer.log_id}".encode())
        handles.append((writer.log_id, persist(writer, 0, 1, sut.timeout)))
        writer.close()
    (gone, handle), kept = handles[0], handles[1:]
    assert all(log_id.startswith(gone) for log_id, _ in kept)
    storage.discard([handle])
    for log_id, handle in kept:
        assert read_data(storage, handle) == [f"data of {log_id}".encode()], (
            f"discarding {gone} took {log_id}"
        )
    if "orphan_collection" in sut.capabilities:
        storage.collect_orphans([handle for _, handle in kept], older_than=time.time() + 3600)
        for log_id, handle in kept:
            assert read_data(sut.open(), handle) == [f"data of {log_id}".encode()], f"collected {log_id}"


def test_another_jobs_discards_and_orphan_collection_never_touch_this_jobs_data(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"live data of this job")
    live = persist(writer, 0, 1, sut.timeout)
    writer.close()
    other = sut.open(job_id=f"other-{uuid.uuid4().hex[:8]}")
    with contextlib.suppress(DstlError):  # another job's location: refused
        other.discard([live])
    other.collect_orphans([], older_than=time.time() + 3600)  # everything of its own counts as old
    assert read_data(storage, live) == [b"live data of this job"]
    if sut.backdoor is not None and "leak_check" in sut.capabilities:
        assert sut.backdoor.list_objects(storage), "another job's collection deleted this job's objects"


@requires("orphan_collection")
def test_orphan_collection_judges_age_by_the_store_not_a_writer_clock_an_hour_behind(
    storage, sut, monkeypatch
):
    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - 3600 * 10**9)
    late = storage.create_writer("late", KG)
    late.append(0, b"in flight: its checkpoint is not complete yet")
    in_flight = persist(late, 0, 1, sut.timeout)
    monkeypatch.undo()
    storage.collect_orphans([], older_than=time.time() - 600)  # the coordinator's default grace
    assert read_data(storage, in_flight) == [b"in flight: its checkpoint is not complete yet"]


def test_a_read_only_open_reads_and_creates_nothing(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"read me")
    handle = persist(writer, 0, 1, sut.timeout)
    writer.close()
    places = [p for p in (sut.workdir, sut.environment_dir) if p is not None]
    before = [_files(place) for place in places]
    listing = sut.backdoor is not None and "leak_check" in sut.capabilities
    objects = sut.backdoor.list_objects(storage) if listing else None
    for job_id in (sut.job_id, f"reader-{uuid.uuid4().hex[:8]}"):
        with storage_for_handle(handle, sut.config, job_id=job_id, read_only=True) as reader_only:
            assert read_data(reader_only, handle) == [b"read me"]
            for refused in (
                lambda: reader_only.create_writer("op", KG, epoch=9),
                lambda: reader_only.discard([handle]),
                lambda: reader_only.collect_orphans([], older_than=time.time() + 3600),
            ):
                with pytest.raises(ReadOnlyError):
                    refused()
    with load_storage(sut.config, job_id=f"never-{uuid.uuid4().hex[:8]}", read_only=True):
        pass
    assert [_files(place) for place in places] == before, "a read-only open created or removed files"
    if listing:
        assert sut.backdoor.list_objects(storage) == objects
    assert read_data(storage, handle) == [b"read me"]
    storage.create_writer("op", KG, epoch=1).close()  # the read-only opens claimed no epoch


def test_a_job_id_belongs_to_the_first_job_that_binds_it(sut):
    """Two jobs configured with one job id would discard and collect each other's data: the first
    owner to bind the id keeps it (its restarts bind again), any other owner is refused, naming both,
    and another job id stays free."""
    first, second = sut.open(), sut.open()
    first.bind_job("s3://bucket/checkpoints/query-a")
    second.bind_job("s3://bucket/checkpoints/query-a")  # the same job, restarted elsewhere
    with pytest.raises(JobConflictError) as refused:
        second.bind_job("s3://bucket/checkpoints/query-b")
    assert refused.value.job_id == sut.job_id
    assert refused.value.bound_to == "s3://bucket/checkpoints/query-a"
    assert refused.value.claimed_by == "s3://bucket/checkpoints/query-b"
    sut.open(job_id=f"{sut.job_id}-other").bind_job("s3://bucket/checkpoints/query-b")
