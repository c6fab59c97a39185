"""Durability: what a completed persist returns is read back intact, in order."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from dstl.conformance import requires
from dstl.conformance._private.subprocesses import child_request, run_child
from dstl.conformance.testing import change_bytes, persist, read_changes, read_data
from dstl.spi import ChangelogHandle, KeyGroupRange, storage_for_handle

KG = KeyGroupRange(0, 16)


def _append_spread(writer, count, data_of, per_change_set):
    """Append ``data_of(i)`` for ``i < count`` over the 16 key groups, ``per_change_set`` per SQN.

    Returns the ``(key_group, data)`` pairs in append order.
    """
    expected = []
    for index in range(count):
        data = data_of(index)
        writer.append(index % 16, data)
        expected.append((index % 16, data))
        if index % per_change_set == per_change_set - 1:
            writer.next_sqn()
    return expected


def test_round_trip_in_append_order(storage, sut):
    writer = storage.create_writer("op", KG)
    expected = _append_spread(writer, 200, lambda index: change_bytes("rt", index), 10)
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    assert [(kg, data) for _, kg, data in read_changes(storage, handle)] == expected


@pytest.mark.parametrize("written_with", ["zstd", "none"])
def test_change_sets_read_alike_whatever_compression_wrote_them(sut, written_with):
    """``dstl.changelog.compression`` changes how change sets are stored, never what is read back.

    A job may change the setting between runs: a storage configured either way reads
    what the other wrote, compressible and incompressible data alike.
    """
    writing = sut.open(overrides={"dstl.changelog.compression": written_with})
    other = "none" if written_with == "zstd" else "zstd"
    reading = sut.open(overrides={"dstl.changelog.compression": other})
    writer = writing.create_writer("op", KG)

    def data_of(index: int) -> bytes:
        return b"compressible %d " % (index % 7) * 40 if index % 3 else os.urandom(200)

    expected = _append_spread(writer, 300, data_of, 50)
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    assert [(kg, data) for _, kg, data in read_changes(reading, handle)] == expected
    assert [(kg, data) for _, kg, data in read_changes(writing, handle)] == expected


def test_last_change_of_every_change_set_is_kept(storage, sut):
    writer = storage.create_writer("op", KG)
    for sqn in range(5):
        for index in range(3):
            writer.append(0, change_bytes(f"s{sqn}", index))
        writer.next_sqn()
    changes = read_changes(storage, persist(writer, 0, 1, sut.timeout))
    assert [data for _, _, data in changes] == [change_bytes(f"s{s}", i) for s in range(5) for i in range(3)]
    assert [sqn for sqn, _, _ in changes] == [s for s in range(5) for _ in range(3)]


def test_round_trip_per_key_group(storage, sut):
    writer = storage.create_writer("op", KG)
    for index in range(160):
        writer.append(index % 16, change_bytes("kg", index))
    handle = persist(writer, 0, 1, sut.timeout)
    for key_group in KG:
        got = read_data(storage, handle, KeyGroupRange(key_group, key_group + 1))
        assert got == [change_bytes("kg", i) for i in range(key_group, 160, 16)]


def test_many_key_groups(storage, sut):
    wide = KeyGroupRange(0, 4096)
    writer = storage.create_writer("wide", wide)
    for key_group in wide:
        writer.append(key_group, key_group.to_bytes(4, "big"))
    handle = persist(writer, 0, 1, sut.timeout)
    assert [(kg, int.from_bytes(d, "big")) for _, kg, d in read_changes(storage, handle)] == [
        (k, k) for k in wide
    ]


def test_empty_persist(storage, sut):
    writer = storage.create_writer("op", KG)
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    assert handle.sqn_range.is_empty
    assert read_changes(storage, handle) == []
    writer.append(3, b"after")
    assert read_data(storage, persist(writer, 0, 2, sut.timeout)) == [b"after"]


@pytest.mark.parametrize("size", [0, 1, 1000, 64 * 1024, 1024 * 1024, 8 * 1024 * 1024])
def test_value_sizes(storage, sut, size):
    writer = storage.create_writer("op", KG)
    payload = bytes((i * 31 + size) % 251 for i in range(min(size, 4096))) * (size // 4096 + 1)
    payload = payload[:size]
    writer.append(5, payload)
    writer.append(6, b"neighbour")
    assert read_data(storage, persist(writer, 0, 1, sut.timeout)) == [payload, b"neighbour"]


def test_meta_records_round_trip(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append_meta(b"register:value-state")
    writer.append(1, b"v")
    changes = read_changes(storage, persist(writer, 0, 1, sut.timeout))
    assert [(kg, d) for _, kg, d in changes] == [(-1, b"register:value-state"), (1, b"v")]


def test_many_writers_on_one_storage(storage, sut):
    writers = [storage.create_writer(f"op-{n}", KeyGroupRange(n * 4, n * 4 + 4)) for n in range(12)]
    for index in range(30):
        for n, writer in enumerate(writers):
            writer.append(n * 4 + index % 4, change_bytes(f"w{n}", index))
    futures = [w.persist(0, 1) for w in writers]
    for n, future in enumerate(futures):
        handle = future.result(timeout=sut.timeout)
        assert read_data(storage, handle) == [change_bytes(f"w{n}", i) for i in range(30)]


def test_concurrent_persists_of_many_writers_share_nothing_they_should_not(storage, sut):
    writers = [storage.create_writer(f"op-{n}", KG) for n in range(8)]
    barrier = threading.Barrier(len(writers))
    handles: dict[int, ChangelogHandle] = {}

    def work(n):
        writers[n].append(n, change_bytes(f"c{n}", 0))
        barrier.wait(timeout=sut.timeout)
        handles[n] = writers[n].persist(0, 1).result(timeout=sut.timeout)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(sut.timeout)
    for n in range(len(writers)):
        assert read_data(storage, handles[n]) == [change_bytes(f"c{n}", 0)]


def test_fresh_instance_reads_from_config_and_handle_json(storage, sut):
    writer = storage.create_writer("op", KG)
    for index in range(20):
        writer.append(index % 16, change_bytes("fresh", index))
    text = persist(writer, 0, 1, sut.timeout).to_json()
    writer.close()
    storage.close()
    handle = ChangelogHandle.from_json(text)
    with storage_for_handle(handle, sut.config, job_id="another-job") as fresh:
        assert read_data(fresh, handle) == [change_bytes("fresh", i) for i in range(20)]


@requires("survives_process_kill")
def test_readable_after_writer_process_sigkill(sut):
    request = child_request(
        sut,
        mode="persist-then-kill",
        operator_id="killed-op",
        key_groups=(0, 8),
        epoch=0,
        count=500,
        size=64,
        tag="k",
    )
    code, events, stderr = run_child(request, sut.subprocess_env(), timeout=sut.timeout * 2)
    assert code == -signal.SIGKILL, f"child did not die by SIGKILL (exit {code}): {stderr[-2000:]}"
    persisted = [e for e in events if e["event"] == "persisted"]
    assert persisted, f"child was killed before its persist completed: {stderr[-2000:]}"
    handle = ChangelogHandle.from_json(persisted[0]["handle"])
    with storage_for_handle(handle, sut.config, job_id=sut.job_id) as fresh:
        assert read_data(fresh, handle) == [change_bytes("k", i, 64) for i in range(500)]


@requires("survives_power_loss")
def test_nothing_acknowledged_is_lost_when_the_power_fails(sut):
    """A persist's future completes only once its data is synced: a host crash keeps it.

    A SIGKILLed process leaves the page cache behind, so only a layer that drops
    what was not synced shows a storage that acknowledges first and syncs later.
    """
    backdoor = sut.require_backdoor()
    acknowledged = []
    with backdoor.power_loss() as cut:
        doomed = sut.open()
        writers = [doomed.create_writer(f"op-{n}", KG) for n in range(3)]
        history: list[list[bytes]] = [[] for _ in writers]
        for checkpoint in range(1, 6):
            for n, writer in enumerate(writers):
                for index in range(4):
                    history[n].append(change_bytes(f"w{n}c{checkpoint}", index, 300))
                    writer.append(index, history[n][-1])
                handle = persist(writer, writer.initial_sqn(), checkpoint, sut.timeout)
                acknowledged.append((handle, list(history[n])))
        writers[0].append(0, b"appended, never persisted")
        writers[1].append(0, b"persist in flight when the power fails")
        writers[1].persist(writers[1].initial_sqn(), 6)
        cut()
        sut.abandon(doomed)  # its host is gone: nothing more of it may reach the disk
    fresh = sut.open()
    for handle, expected in acknowledged:
        assert read_data(fresh, handle) == expected, f"an acknowledged persist of {handle.log_id} lost data"


@requires("survives_power_loss", "sync_failure_injection")
def test_a_sync_that_failed_is_not_made_good_by_a_later_one(sut):
    """PostgreSQL's "fsyncgate": after a failed sync the kernel may have dropped the dirty pages.

    A later sync that succeeds proves nothing about them: a storage that retries the
    sync and acknowledges loses that persist's data when the power fails. Every
    acknowledged persist, before and after the failure, must survive the cut.
    """
    from dstl.spi import StorageError

    backdoor = sut.require_backdoor()
    acknowledged = []
    failures = 0
    with backdoor.power_loss() as cut:
        doomed = sut.open()
        writer = doomed.create_writer("op", KG)
        history: list[bytes] = []

        def checkpoint(number: int) -> None:
            nonlocal failures
            history.append(change_bytes("fsyncgate", number, 300))
            writer.append(number % 4, history[-1])
            try:
                acknowledged.append((persist(writer, 0, number, sut.timeout), list(history)))
            except StorageError as exc:
                assert exc.retriable, f"a failed sync must fail its persist retriably: {exc}"
                failures += 1

        checkpoint(1)  # the storage's files exist and are synced before the fault
        with backdoor.failing_sync(doomed) as fired:
            for number in range(2, 5):
                checkpoint(number)
        for number in range(5, 7):
            checkpoint(number)
        assert fired, "the backdoor injected no sync failure"
        cut()
        sut.abandon(doomed)
    assert failures <= 1 and len(acknowledged) >= 5
    fresh = sut.open()
    for handle, expected in acknowledged:
        assert read_data(fresh, handle) == expected, "an acknowledged persist lost what a failed sync dropped"
