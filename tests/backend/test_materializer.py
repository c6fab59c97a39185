"""The materializer against a fake target: it needs only the MaterializationTarget protocol."""

import pytest

from dstl.backend.changelog.materializer import Materializer
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.spi import KeyGroupRange


class FakeTarget:
    """Working state and a log position, nothing else of a backend."""

    def __init__(self, delegate):
        self.job_id = "job"
        self.operator_id = "op"
        self.log_id = "op.kg0-8"
        self.key_groups = KeyGroupRange(0, 8)
        self.delegate = delegate
        self.sqn = 0

    def begin_materialization(self):
        self.sqn += 10
        return self.sqn

    def registrations(self):
        return {"v": ("value", "msgpack"), "m": ("map", "msgpack")}

    def ttl_states(self):
        return {}

    def clock(self):
        return 0.0


def _write(target, materializer, key_group, key, entry):
    if entry is None:
        target.delegate.delete("v", key_group, key)
    else:
        target.delegate.put("v", key_group, key, entry)
    materializer.changed("v", key_group, key)


def _state(delegate):
    return {
        (state, kg, key): entry
        for state in ("v", "m")
        for kg in range(8)
        for key, entry in delegate.entries(state, kg)
    }


@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_full_incremental_and_bridged_snapshots_of_a_fake_target(tmp_path, kind):
    def delegate(name):
        return HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / name)

    target = FakeTarget(delegate("a"))
    snapshots = (tmp_path / "snap").as_uri()
    materializer = Materializer(target, snapshots, 3, full_every=2, codec="zstd")
    for i in range(100):
        _write(target, materializer, i % 8, f"k{i}".encode(), i)
    target.delegate.put("m", 2, b"map", {b"a": b"1"})
    full = materializer.start().result(timeout=30)
    assert full.sqn == 10 and full.entries == 101 and materializer.bridge == ()
    _write(target, materializer, 1, b"k1", "changed")
    _write(target, materializer, 2, b"k2", None)
    incremental = materializer.start().result(timeout=30)
    assert materializer.chain == (full, incremental) and incremental.entries == 2
    _write(target, materializer, 3, b"k3", "again")
    second_full = materializer.start().result(timeout=30)  # the chain is full_every long
    assert materializer.chain == (second_full,)
    bridge = materializer.bridge
    assert bridge[:2] == (full, incremental) and bridge[2].entries == 1 and bridge[2].sqn == second_full.sqn

    # Loading the full snapshot, or the old chain and its bridge, gives the same state.
    for refs in ((second_full,), bridge):
        copy = FakeTarget(delegate(f"copy-{len(refs)}"))
        loader = Materializer(copy, snapshots, 3)
        for ref in refs:
            assert loader.load(ref) == target.registrations()
        assert _state(copy.delegate) == _state(target.delegate)


def test_a_snapshot_outside_the_jobs_directory_is_not_read(tmp_path):
    from dataclasses import replace

    from dstl.spi import InvalidHandleError

    target = FakeTarget(HeapDelegate())
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3)
    target.delegate.put("v", 0, b"k", 1)
    ref = materializer.start().result(timeout=30)
    with pytest.raises(InvalidHandleError, match="outside job/snapshots/"):
        materializer.load(replace(ref, path="other-job/snapshots/x.snap"))
