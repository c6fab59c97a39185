"""The materializer against a fake target: it needs only the MaterializationTarget protocol."""

import pytest

from dstl.backend.changelog.materializer import Materializer
from dstl.backend.delegate import HeapDelegate, LmdbDelegate, MappingView
from dstl.spi import KeyGroupRange, StorageError

from .helpers import FakeTarget, stored_state


def _write(target, materializer, key_group, key, entry):
    if entry is None:
        target.delegate.delete("v", key_group, key)
    else:
        target.delegate.put("v", key_group, key, entry)
    materializer.changed("v", key_group, key)


@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_full_incremental_and_bridged_snapshots_of_a_fake_target(tmp_path, kind):
    def delegate(name):
        return HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / name)

    target = FakeTarget(delegate("a"))
    snapshots = (tmp_path / "snap").as_uri()
    materializer = Materializer(target, snapshots, 3, full_every=2)
    for i in range(100):
        _write(target, materializer, i % 8, f"k{i}".encode(), b"%d" % i)
    target.delegate.put("m", 2, b"map", {b"a": b"1"})
    full = materializer.start().result(timeout=30)
    assert full.sqn == 10 and full.entries == 101 and materializer.bridge == ()
    _write(target, materializer, 1, b"k1", b"changed")
    _write(target, materializer, 2, b"k2", None)
    incremental = materializer.start().result(timeout=30)
    assert materializer.chain == (full, incremental) and incremental.entries == 2
    _write(target, materializer, 3, b"k3", b"again")
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
        assert stored_state(copy.delegate) == stored_state(target.delegate)


def test_a_snapshot_outside_the_jobs_directory_is_not_read(tmp_path):
    from dataclasses import replace

    from dstl.spi import InvalidHandleError

    target = FakeTarget(HeapDelegate())
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3)
    target.delegate.put("v", 0, b"k", b"1")
    ref = materializer.start().result(timeout=30)
    with pytest.raises(InvalidHandleError, match="outside job/snapshots/"):
        materializer.load(replace(ref, path="other-job/snapshots/x.snap"))


def _snapshotted(tmp_path, keys):
    """A materializer whose chain holds ``keys`` values of key group 0 (one full snapshot)."""
    target = FakeTarget(HeapDelegate())
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3, full_every=5)
    for i in range(keys):
        _write(target, materializer, 0, f"k{i}".encode(), b"%d" % i)
    materializer.start().result(timeout=30)
    return target, materializer


def test_the_log_of_a_resumed_snapshot_is_read_once(tmp_path):
    """Not full at first, then full by size, then bridged: the resumed log's keys are still read once."""
    target, materializer = _snapshotted(tmp_path, 3)
    reads = []

    def changed_in_resumed_log(sink):
        reads.append(1)
        for i in range(5):  # more than the full snapshot held
            sink("v", 1, f"r{i}".encode())

    materializer.resumed(materializer.chain, changed_in_resumed_log)
    for i in range(5):
        target.delegate.put("v", 1, f"r{i}".encode(), b"%d" % i)
    ref = materializer.start().result(timeout=30)
    assert "-full-" in ref.path and len(materializer.bridge) == 2
    assert materializer.bridge[1].entries == 5  # the bridge holds the resumed log's keys
    assert len(reads) == 1


def test_the_log_of_a_resumed_snapshot_is_read_in_the_background_and_handed_back_on_failure(tmp_path):
    """Reading that log grows with it: start() returns at once; a failed read is tried again next time."""
    import threading

    target, materializer = _snapshotted(tmp_path, 20)
    release, reads = threading.Event(), []

    def changed_in_resumed_log(sink):
        reads.append(threading.current_thread())
        if len(reads) == 1:
            raise OSError("injected: the log could not be read")
        assert release.wait(timeout=30), "start() waited for the log"
        sink("v", 1, b"from the log")

    materializer.resumed(materializer.chain, changed_in_resumed_log)
    target.delegate.put("v", 1, b"from the log", b"x")
    with pytest.raises(StorageError, match="injected: the log could not be read"):
        materializer.start().result(timeout=30)
    assert materializer.failed == 1
    pending = materializer.start()  # reads the log again: its keys were handed back
    assert not pending.done()  # waiting in the background for the log, not in start()
    release.set()
    ref = pending.result(timeout=30)
    assert "-incr-" in ref.path and ref.entries == 1
    assert len(reads) == 2 and threading.current_thread() not in reads


class _FailingView(MappingView):
    """Yields the first section, then the state can no longer be read."""

    def sections(self, key_groups):
        sections = super().sections(key_groups)
        yield next(sections)
        raise OSError("injected: reading the state failed mid-snapshot")


class _FailingHeap(HeapDelegate):
    """A heap whose views fail after one section while ``failing``."""

    failing = False

    def view(self):
        view = super().view()
        return _FailingView(view._view, on_close=view.close) if self.failing else view


@pytest.mark.parametrize("where", ["file", "s3"])
def test_a_failed_materialization_leaves_no_object(tmp_path, where, request, monkeypatch):
    """Nothing of a failed attempt stays: not the bridge written before it, not a partial snapshot."""
    if where == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        for name, value in {
            "AWS_ENDPOINT_URL": endpoint.url,
            "AWS_ACCESS_KEY_ID": endpoint.access_key,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(name, value)
        snapshots = f"s3://{endpoint.bucket}/m-{tmp_path.name}"
    else:
        snapshots = (tmp_path / "snap").as_uri()
    target = FakeTarget(_FailingHeap())
    materializer = Materializer(target, snapshots, 3, full_every=1)
    for i in range(200):
        _write(target, materializer, i % 8, f"k{i}".encode(), b"%d" % i)
    full = materializer.start().result(timeout=30)
    target.delegate.failing = True
    _write(target, materializer, 3, b"k3", "changed")
    with pytest.raises(StorageError, match="injected"):
        materializer.start().result(timeout=30)  # bridge written, then the full snapshot fails
    import fsspec

    fs, root = fsspec.core.url_to_fs(snapshots)
    left = sorted(p.rsplit("/", 1)[-1] for p in fs.find(root))
    assert left == [full.path.rsplit("/", 1)[-1]], left
    if where == "s3":
        uploads = endpoint.client().list_multipart_uploads(Bucket=endpoint.bucket)
        assert not uploads.get("Uploads"), uploads
    # The next attempt succeeds and holds the change.
    target.delegate.failing = False
    retried = materializer.start().result(timeout=30)
    copy = FakeTarget(HeapDelegate())
    Materializer(copy, snapshots, 3).load(retried)
    assert copy.delegate.get("v", 3, b"k3") == "changed"


@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_an_incremental_holds_the_changed_collections_as_they_were_when_it_started(
    tmp_path, kind, monkeypatch
):
    import threading

    from dstl.backend.changelog import snapshot_encoding as module

    target = FakeTarget(HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / "a"))
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3, full_every=5)
    for i in range(10):
        target.delegate.put("m", 1, b"other%d" % i, {b"x": b"1"})
    materializer.start().result(timeout=30)  # the full snapshot the incremental builds on
    target.delegate.map_put("m", 1, b"k", b"a", b"1")
    materializer.changed("m", 1, b"k")
    mutated = threading.Event()

    class GatedWriter(module.SnapshotWriter):
        def add_section(self, key_group, entries):
            assert mutated.wait(30)
            super().add_section(key_group, entries)

    monkeypatch.setattr(module, "SnapshotWriter", GatedWriter)
    running = materializer.start()
    for i in range(100):  # in place, while the incremental is being written
        target.delegate.map_put("m", 1, b"k", b"%d" % i, b"later")
    target.delegate.map_remove("m", 1, b"k", b"a")
    mutated.set()
    incremental = running.result(timeout=30)
    assert "-incr-" in incremental.path
    copy = FakeTarget(HeapDelegate())
    for ref in materializer.chain:
        Materializer(copy, (tmp_path / "snap").as_uri(), 3).load(ref)
    assert copy.delegate.get("m", 1, b"k") == {b"a": b"1"}
    assert copy.delegate.get("m", 1, b"other9") == {b"x": b"1"}


@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_an_incremental_beyond_the_tracked_keys_replaces_whole_key_groups(tmp_path, kind):
    """Tombstones of untracked keys are not lost: the group's section replaces what the restore had."""
    target = FakeTarget(HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / "a"))
    snapshots = (tmp_path / "snap").as_uri()
    materializer = Materializer(target, snapshots, 3, full_every=5, max_tracked_keys=20)
    for i in range(400):
        _write(target, materializer, i % 8, b"k%d" % i, b"v")
    materializer.start().result(timeout=30)
    for i in range(0, 80, 2):  # 40 changes in key groups 0, 2, 4, 6: more than 20 are tracked
        _write(target, materializer, i % 8, b"k%d" % i, None if i % 4 == 0 else b"changed")
    _write(target, materializer, 1, b"k1", b"changed")
    incremental = materializer.start().result(timeout=30)
    assert "-incr-" in incremental.path and incremental.entries < 400
    copy = FakeTarget(HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / "b"))
    loader = Materializer(copy, snapshots, 3)
    for ref in materializer.chain:
        loader.load(ref)
    assert stored_state(copy.delegate) == stored_state(target.delegate)
    assert copy.delegate.get("v", 0, b"k0") is None and copy.delegate.get("v", 1, b"k1") == b"changed"


@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_collections_bigger_than_a_section_are_written_and_restored_in_parts(tmp_path, kind):
    from dstl.backend.delegate.base import SECTION_ENTRIES
    from dstl.backend.materialization import read_sections

    def delegate(name):
        return HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / name)

    size = 3 * SECTION_ENTRIES + 5
    target = FakeTarget(delegate("a"))
    snapshots = tmp_path / "snap"
    materializer = Materializer(target, snapshots.as_uri(), 3, full_every=5)
    target.delegate.put("m", 2, b"big", {b"%06d" % i: b"v" for i in range(size)})
    target.delegate.put("v", 2, b"list", [b"%d" % i for i in range(size)])  # a list under "v": any kind
    target.delegate.put("m", 2, b"small", {b"a": b"1"})
    for i in range(100):
        target.delegate.put("v", 4, b"k%d" % i, b"v")
    full = materializer.start().result(timeout=30)
    assert full.entries == 103, "a collection in parts counts once"
    data = (snapshots / full.path).read_bytes()
    _, sections = read_sections(lambda a, b: data[a:b], KeyGroupRange(0, 8), where="t", size=len(data))
    for _, entries in sections:
        elements = sum(1 if isinstance(e[2], bytes) else len(e[2]) for e in entries)
        assert elements <= SECTION_ENTRIES, "a section held more than its bound of elements"
    # An incremental of a changed big map, loaded over the full snapshot's state.
    target.delegate.map_put("m", 2, b"big", b"new", b"x")
    target.delegate.map_remove("m", 2, b"big", b"000000")
    materializer.changed("m", 2, b"big")
    for i in range(10):
        _write(target, materializer, 3, b"pad%d" % i, b"p")
    incremental = materializer.start().result(timeout=30)
    assert "-incr-" in incremental.path
    copy = FakeTarget(delegate("b"))
    loader = Materializer(copy, snapshots.as_uri(), 3)
    for ref in materializer.chain:
        loader.load(ref)
    assert stored_state(copy.delegate) == stored_state(target.delegate)


_BAD_ROWS = (["v", b"k"], ["v", b"k", b"x", 1], ["v", b"k", [b"x"], 2], [7, b"k", b"x"], ["v", "k", b"x"])
_BAD_RUNS = (
    ["v", [b"k"]],  # no entries
    ["v", [b"k"], [b"x"], 2],  # a flag that is not 1
    ["v", [b"k"], [b"x"], 1],  # a continued part that is no collection
    ["v", [b"k"], [b"x", b"y"]],  # more entries than keys
    [7, [b"k"], [b"x"]],  # a state that is no name
    ["v", ["k"], [b"x"]],  # a key that is not bytes
    ["v", b"k", [b"x"]],  # keys that are no list
    "run",
)


@pytest.mark.parametrize(
    ("version", "section", "problem"),
    [
        *((2, [bad], "malformed entry") for bad in _BAD_ROWS),
        *((3, [bad], "malformed run") for bad in _BAD_RUNS),
        (3, {"s": 1}, "is not a list"),
    ],
)
def test_malformed_snapshot_entries_and_runs_are_corruption(tmp_path, version, section, problem):
    import msgpack

    from dstl.backend.materialization import MaterializationRef
    from dstl.spi import CorruptedError

    from .helpers import snapshot_bytes

    target = FakeTarget(HeapDelegate())
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3)
    data = snapshot_bytes([(1, msgpack.packb(section, use_bin_type=True))], version=version)
    path = tmp_path / "snap" / "job" / "snapshots" / "bad.snap"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    ref = MaterializationRef("job/snapshots/bad.snap", KeyGroupRange(0, 8), 1, len(data), 1)
    with pytest.raises(CorruptedError, match=problem):
        materializer.load(ref)


@pytest.mark.parametrize("kind", ["heap", "lmdb"])
def test_a_section_loads_state_by_state_as_entry_by_entry(tmp_path, kind):
    from dstl.backend.changelog.sections import load_section

    delegate = HeapDelegate() if kind == "heap" else LmdbDelegate(tmp_path / "l")
    delegate.put("a", 5, b"old", b"0")
    # Runs of states, a key repeated (the later entry wins, as the per-entry loop has it), a collection.
    section = [
        ["a", b"k1", b"1"],
        ["a", b"k2", b"2"],
        ["b", b"k1", [b"x"]],
        ["a", b"k1", b"3"],
        ["a", b"old", b"4"],
    ]
    load_section(delegate, 5, section, "test")
    assert dict(delegate.entries("a", 5)) == {b"k1": b"3", b"k2": b"2", b"old": b"4"}
    assert dict(delegate.entries("b", 5)) == {b"k1": [b"x"]}
    # A continued part goes entry by entry: it extends what the section wrote before it.
    load_section(delegate, 5, [["b", b"k1", [b"y"], 1], ["a", b"k3", b"5"]], "test")
    assert delegate.get("b", 5, b"k1") == [b"x", b"y"]
    assert delegate.get("a", 5, b"k3") == b"5"


def test_a_malformed_entry_among_many_is_corruption(tmp_path):
    from dstl.backend.changelog.sections import load_section
    from dstl.spi import CorruptedError

    good = [["v", b"k%d" % i, b"x"] for i in range(1000)]
    for bad in (["v", "k", b"x"], [7, b"k", b"x"], ["v", b"k"], "entry", ["v", b"k", b"x", 2]):
        with pytest.raises(CorruptedError, match="malformed entry"):
            load_section(HeapDelegate(), 1, [*good[:500], bad, *good[500:]], "test")


def test_a_version_2_snapshot_of_rows_still_restores(tmp_path):
    import msgpack

    from dstl.backend.materialization import MaterializationRef

    from .helpers import snapshot_bytes

    rows = [["v", b"a", b"1"], ["v", b"b", b"2"], ["l", b"c", [b"x"]], ["l", b"c", [b"y"], 1]]
    data = snapshot_bytes([(1, msgpack.packb(rows, use_bin_type=True))], version=2)
    path = tmp_path / "snap" / "job" / "snapshots" / "old.snap"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    target = FakeTarget(HeapDelegate())
    Materializer(target, (tmp_path / "snap").as_uri(), 3).load(
        MaterializationRef("job/snapshots/old.snap", KeyGroupRange(0, 8), 1, len(data), 3)
    )
    assert dict(target.delegate.entries("v", 1)) == {b"a": b"1", b"b": b"2"}
    assert target.delegate.get("l", 1, b"c") == [b"x", b"y"]
