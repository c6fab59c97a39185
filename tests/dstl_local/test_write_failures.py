"""Local storage under write and sync faults: a failed segment is retired, nothing acknowledged is lost."""

import errno
import os
import random

import pytest

from dstl.conformance.testing import persist, read_data
from dstl.spi import KeyGroupRange, StorageError, load_storage

KG = KeyGroupRange(0, 8)


def _crash_and_reopen(storage, config):
    """Simulate a crash: drop the liveness lock without sealing, then open a fresh instance."""
    storage._instance_lock.release()
    return load_storage(config, job_id="job")


def _persist_rounds(writer, rounds, payloads, failures):
    """Append one payload per round and persist everything from SQN 0; returns acknowledged handles."""
    acknowledged = []
    for round_ in range(rounds):
        payload = f"round-{round_}".encode() * 20
        writer.append(round_ % 8, payload)
        payloads.append(payload)
        try:
            acknowledged.append((persist(writer, 0, round_ + 1), list(payloads)))
        except StorageError as exc:
            assert exc.retriable, exc
            failures.append(exc)
    return acknowledged


def _assert_readable(storage, acknowledged):
    for handle, expected in acknowledged:
        assert read_data(storage, handle) == expected


@pytest.mark.parametrize("failing_call", [2, 3])
def test_a_failed_sync_loses_no_acknowledged_persist(tmp_path, monkeypatch, failing_call):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path)}
    real_sync = os.fdatasync
    calls = {"n": 0}

    def flaky_sync(fd):
        calls["n"] += 1
        if calls["n"] == failing_call:
            raise OSError(errno.EIO, "injected EIO")
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", flaky_sync)
    storage = load_storage(config, job_id="job")
    writer = storage.create_writer("op", KG)
    payloads, failures = [], []
    acknowledged = _persist_rounds(writer, 6, payloads, failures)
    assert len(failures) == 1 and "injected EIO" in str(failures[0])
    assert len(acknowledged) == 5
    assert storage.metrics.counter("retired_segments") == 1
    assert storage.metrics.counter("upload_failures") == 1  # the name dashboards alert on
    _assert_readable(storage, acknowledged)
    fresh = _crash_and_reopen(storage, config)
    try:
        _assert_readable(fresh, acknowledged)
    finally:
        fresh.close()


def test_a_short_write_then_enospc_loses_no_acknowledged_persist(tmp_path, monkeypatch):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path)}
    real_write = os.write
    state = {"writes": 0}

    def short_write(fd, data):
        state["writes"] += 1
        if state["writes"] == 3:  # half of the 3rd write lands, then the disk is full
            return real_write(fd, bytes(data)[: len(data) // 2])
        if state["writes"] == 4:
            raise OSError(errno.ENOSPC, "injected ENOSPC")
        return real_write(fd, data)

    storage = load_storage(config, job_id="job")
    writer = storage.create_writer("op", KG)
    monkeypatch.setattr(os, "write", short_write)
    payloads, failures = [], []
    acknowledged = _persist_rounds(writer, 6, payloads, failures)
    monkeypatch.setattr(os, "write", real_write)
    assert len(failures) == 1 and "ENOSPC" in str(failures[0])
    _assert_readable(storage, acknowledged)
    retired = [p for p in storage.segments_dir.glob("*.log.sealed")]
    assert retired, "the failed segment was not sealed"
    fresh = _crash_and_reopen(storage, config)
    try:
        _assert_readable(fresh, acknowledged)
        assert fresh.metrics.counter("quarantined_segments") == 0
    finally:
        fresh.close()


def test_a_full_disk_then_freed_space_loses_nothing(small_tmpfs):
    config = {"dstl.storage": "local", "dstl.local.dir": str(small_tmpfs / "dstl")}
    storage = load_storage(config, job_id="job")
    writer = storage.create_writer("op", KG)
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"\0" * (1024 * 1024 + 512 * 1024))
    acknowledged, payloads = [], []
    failure = None
    for round_ in range(200):
        payload = random.Random(round_).randbytes(20_000)  # incompressible: fills the disk
        writer.append(round_ % 8, payload)
        payloads.append(payload)
        try:
            acknowledged.append((persist(writer, writer.next_sqn() - 1, round_ + 1), [payload]))
        except StorageError as exc:
            failure = exc
            break
    assert failure is not None, "the tmpfs never filled up"
    assert failure.retriable and "No space left" in str(failure)
    assert acknowledged
    filler.unlink()
    # The failed change set and the next ones go to a fresh segment.
    retry = persist(writer, len(acknowledged), 1000)
    assert read_data(storage, retry) == payloads[len(acknowledged) :]
    for extra in range(3):
        payload = f"after-{extra}".encode()
        writer.append(0, payload)
        acknowledged.append((persist(writer, writer.next_sqn() - 1, 1001 + extra), [payload]))
    _assert_readable(storage, acknowledged)
    fresh = _crash_and_reopen(storage, config)
    try:
        _assert_readable(fresh, acknowledged)
        assert read_data(fresh, retry) == payloads[len(acknowledged) - 3 :]
    finally:
        fresh.close()
