"""Snapshots encoded by a forked process from a spooled copy: the same object, failures retried."""

import os
import signal

import pytest

from dstl.backend.changelog.materializer import Materializer
from dstl.backend.changelog.snapshot_encoding import NICENESS, SnapshotEncoding
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.backend.materialization import SnapshotWriter
from dstl.spi import StorageError

from .helpers import FakeTarget, stored_state

KEYS = 3_000


@pytest.fixture
def forks(monkeypatch):
    """The pids that forked (a child is never counted: it does not fork again)."""
    calls = []
    real = os.fork

    def counted():
        calls.append(os.getpid())
        return real()

    monkeypatch.setattr(os, "fork", counted)
    return calls


def _filled(tmp_path, name):
    target = FakeTarget(LmdbDelegate(tmp_path / name))
    for i in range(KEYS):
        target.delegate.put("v", i % 8, b"k%05d" % i, b"value %d" % i)
    target.delegate.put("m", 3, b"map", {b"a": b"1", b"b": b"2"})
    return target


def _spools(tmp_path):
    return [entry.name for entry in tmp_path.iterdir() if ".spool-" in entry.name]


def test_snapshots_encoded_apart_are_the_objects_encoded_in_process(tmp_path, forks):
    objects = {}
    for apart_from in (0, 1, 1 << 40):  # in process; apart; a spool below the size: in process
        target = _filled(tmp_path, f"lmdb-{apart_from}")
        snapshots = tmp_path / f"snap-{apart_from}"
        materializer = Materializer(
            target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", apart_from)
        )
        full = materializer.start().result(timeout=60)
        for i in range(0, KEYS, 3):  # a third of the keys: the incremental reads a copy too
            target.delegate.put("v", i % 8, b"k%05d" % i, b"changed %d" % i)
            materializer.changed("v", i % 8, b"k%05d" % i)
        incremental = materializer.start().result(timeout=60)
        materializer.close()
        assert full.entries == KEYS + 1 and "-incr-" in incremental.path and incremental.entries == KEYS // 3
        objects[apart_from] = [(snapshots / ref.path).read_bytes() for ref in (full, incremental)]
        assert [full.size, incremental.size] == [len(data) for data in objects[apart_from]]
        copy = FakeTarget(HeapDelegate())
        for ref in (full, incremental):
            Materializer(copy, snapshots.as_uri(), 3).load(ref)
        assert stored_state(copy.delegate) == stored_state(target.delegate)
        assert _spools(tmp_path) == []  # the copies, and the files encoded in them, went with the views
    assert forks == [os.getpid()] * 2
    assert objects[1] == objects[0] == objects[1 << 40]


@pytest.mark.parametrize("how", ["raises", "killed"])
def test_a_failed_forked_encoder_fails_the_materialization_and_the_next_one_succeeds(
    tmp_path, monkeypatch, forks, how
):
    target = _filled(tmp_path, "lmdb")
    snapshots = tmp_path / "snap"
    materializer = Materializer(target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", 1))
    parent = os.getpid()
    real = SnapshotWriter.add_section
    held = (tmp_path / "held-by-the-parent").open("wb")  # e.g. a lock file, or the socket to Spark

    def broken(self, key_group, entries):
        assert os.getpid() != parent, "the section was encoded in the task's process"
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            os.fstat(held.fileno())
            inherited = "kept"
        except OSError:
            inherited = "closed"
        msg = f"no room (niceness {os.getpriority(os.PRIO_PROCESS, 0)}, the parent's file {inherited})"
        raise OSError(msg)

    monkeypatch.setattr(SnapshotWriter, "add_section", broken)  # the forked child has it too
    expected = "OSError: no room" if how == "raises" else "it ended with exit code -9"
    with pytest.raises(StorageError, match=f"forked snapshot encoder failed: {expected}") as failed:
        materializer.start().result(timeout=60)
    if how == "raises":
        niceness = min(os.getpriority(os.PRIO_PROCESS, 0) + NICENESS, 19)
        assert f"niceness {niceness}, the parent's file closed" in str(failed.value)
    held.close()
    materializer.close()  # the view (and its copy) closes after the future fails
    assert failed.value.retriable and materializer.failures == 1
    assert list(snapshots.rglob("*.snap")) == [] and _spools(tmp_path) == []

    monkeypatch.setattr(SnapshotWriter, "add_section", real)
    ref = materializer.start().result(timeout=60)  # a full one again: the failed one was full
    materializer.close()
    assert materializer.failures == 0 and "-full-" in ref.path and ref.entries == KEYS + 1
    assert [path.name for path in snapshots.rglob("*.snap")] == [ref.path.rsplit("/", 1)[1]]
    assert len(forks) == 2
