"""Delegates: heap and LMDB keep the same state; LMDB is shared by processes one after another."""

import subprocess
import sys
import uuid

import pytest

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.backend.delegate import HeapDelegate, LmdbDelegate, StateDelegate
from dstl.spi import KeyGroupRange, StorageError, load_storage

ALL = KeyGroupRange(0, 128)


@pytest.fixture(params=["heap", "lmdb"])
def make_delegate(request, tmp_path):
    if request.param == "heap":
        return HeapDelegate
    return lambda: LmdbDelegate(tmp_path / f"lmdb-{uuid.uuid4().hex[:6]}")


def test_every_state_kind_on_each_delegate(make_delegate, tmp_path):
    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"d-{uuid.uuid4().hex}"}
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, delegate=make_delegate())
        value, items, pages = backend.value_state("v"), backend.list_state("l"), backend.map_state("m")
        for i in range(50):
            backend.set_current_key(i % 10)
            value.update((value.value() or 0) + i)
            items.add(i)
            pages.put(f"p{i % 3}", i)
        backend.set_current_key(3)
        pages.remove("p0")
        expected = {}
        for k in range(10):
            backend.set_current_key(k)
            expected[k] = (value.value(), items.get(), dict(pages.items()))
        snapshot = backend.checkpoint(1).result(timeout=30)
        backend.close()
        restored = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, delegate=make_delegate())
        restored.restore(BackendSnapshot.from_json(snapshot.to_json()))
        value, items, pages = restored.value_state("v"), restored.list_state("l"), restored.map_state("m")
        for k in range(10):
            restored.set_current_key(k)
            assert (value.value(), items.get(), dict(pages.items())) == expected[k]


def test_lmdb_state_is_opened_by_another_process_without_copying(tmp_path):
    path = tmp_path / "shared"
    delegate = LmdbDelegate(path)
    delegate.put("v", 7, b"key", b"value")
    delegate.put("m", 7, b"key", {b"a": b"1"})
    delegate.close()
    code = (
        "from dstl.backend.delegate import LmdbDelegate\n"
        f"d = LmdbDelegate({str(path)!r})\n"
        "print(d.get('v', 7, b'key'), d.get('m', 7, b'key'), sorted(d.snapshot()))\n"
        "d.put('v', 7, b'key', b'from the second process')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b'value' {b'a': b'1'} ['m', 'v']"
    again = LmdbDelegate(path)
    assert again.get("v", 7, b"key") == b"from the second process"
    assert [k for k, _ in again.entries("v", 7)] == [b"key"]
    again.close()


def test_delegate_chosen_by_config(tmp_path):
    from dstl.spi import ConfigError

    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"d-{uuid.uuid4().hex}"}
    with load_storage(config, job_id="job") as storage:
        lmdb_config = {
            **config,
            "state.backend.delegate": "lmdb",
            "state.backend.lmdb.dir": str(tmp_path / "l"),
        }
        backend = ChangelogKeyedStateBackend.from_config(storage, "op", ALL, lmdb_config)
        assert isinstance(backend.delegate, LmdbDelegate)
        assert backend.delegate.path.endswith("/job/op/kg0-128")
        backend.close()
        with pytest.raises(ConfigError, match="needs state.backend.lmdb.dir"):
            ChangelogKeyedStateBackend.from_config(
                storage, "op2", ALL, {**config, "state.backend.delegate": "lmdb"}
            )
        with pytest.raises(ConfigError, match="heap\\|lmdb"):
            ChangelogKeyedStateBackend.from_config(
                storage, "op3", ALL, {**config, "state.backend.delegate": "rocks"}
            )


def test_write_batch_stores_entries_and_none_removes(make_delegate):
    delegate = make_delegate()
    delegate.put("s", 7, b"old", b"1")
    delegate.put("s", 7, b"kept", b"2")
    delegate.write_batch("s", 7, {b"old": None, b"new": [b"a"], b"back": {b"m": b"v"}})
    delegate.write_batch("s", 8, {b"gone": None})  # removing what is not there
    assert dict(delegate.entries("s", 7)) == {b"kept": b"2", b"new": [b"a"], b"back": {b"m": b"v"}}
    assert dict(delegate.entries("s", 8)) == {}


def test_a_batch_of_values_overwrites_as_one_by_one(make_delegate):
    delegate = make_delegate()
    delegate.put("s", 4, b"a", b"old")
    delegate.put("s", 4, b"keep", b"k")
    delegate.put("t", 4, b"a", b"other state")
    delegate.write_batch("s", 4, {b"a": b"new", b"b": b"2"})  # values only: the bulk path
    assert dict(delegate.entries("s", 4)) == {b"a": b"new", b"b": b"2", b"keep": b"k"}
    assert dict(delegate.entries("t", 4)) == {b"a": b"other state"}


def test_values_are_read_and_written_in_bulk_as_one_by_one(make_delegate):
    delegate = make_delegate()
    delegate.put("v", 3, b"old", b"0")
    delegate.put("v", 9, b"kept", b"k")
    delegate.put("w", 3, b"a", b"other state")
    delegate.put_values("v", [3, 3, 60], [b"old", b"a", b"b"], [b"1", b"2", b"3"])
    assert [delegate.get("v", kg, key) for kg, key in [(3, b"old"), (3, b"a"), (60, b"b"), (9, b"kept")]] == [
        b"1",
        b"2",
        b"3",
        b"k",
    ]
    assert delegate.get("w", 3, b"a") == b"other state"
    found = delegate.get_values("v", [60, 3, 9, 3, 4], [b"b", b"a", b"kept", b"missing", b"a"])
    assert found == [b"3", b"2", b"k", None, None]  # a key is found in its own key group only
    assert delegate.get_values("v", [], []) == []
    with pytest.raises(ValueError):
        delegate.put_values("v", [3, 3], [b"x", b"y"], [b"only one"])
    with pytest.raises(ValueError):
        delegate.get_values("v", [3], [b"x", b"y"])
    assert delegate.get("v", 3, b"x") is None


def test_one_key_set_read_and_written_across_states_finds_each_states_own(make_delegate):
    """A batch binds its keys once (tuples) and uses them for every state: each keeps its own records."""
    delegate = make_delegate()
    groups, keys = (3, 60, 3), (b"a", b"b", b"c")
    assert delegate.get_values("v", groups, keys) == [None, None, None]
    delegate.put_values("w", groups, keys, [b"w1", b"w2", b"w3"])
    delegate.put_values("v", groups, keys, [b"v1", b"v2", b"v3"])
    assert delegate.get_values("w", groups, keys) == [b"w1", b"w2", b"w3"]
    assert delegate.get_values("v", groups, keys) == [b"v1", b"v2", b"v3"]
    assert delegate.get_values("v", (9, 60, 3), keys) == [None, b"v2", b"v3"]  # other groups, same keys
    assert delegate.get("v", 3, b"a") == b"v1" and delegate.get("w", 60, b"b") == b"w2"


def test_lmdb_grows_its_map_instead_of_failing(tmp_path):
    delegate = LmdbDelegate(tmp_path / "grow", map_size=1 << 20)
    value = b"v" * 1000
    for batch in range(8):  # 8 MB of entries in a 1 MB map
        delegate.write_batch("s", batch, {f"k{i}".encode(): value for i in range(1000)})
    delegate.put("s", 99, b"one", value)
    assert delegate.resizes >= 3 and delegate.map_size >= 8 << 20
    assert sum(1 for kg in range(8) for _ in delegate.entries("s", kg)) == 8000
    delegate.close()
    # The next process of the host opens the file with the configured map: it keeps its data.
    reopened = LmdbDelegate(tmp_path / "grow", map_size=1 << 20)
    assert reopened.get("s", 7, b"k999") == value and reopened.map_size >= 8 << 20
    reopened.write_batch("s", 8, {b"more": value})
    reopened.close()


def test_lmdb_on_a_full_disk_is_a_clear_retriable_error(small_tmpfs):
    delegate = LmdbDelegate(small_tmpfs / "state", map_size=64 << 20)
    kept = {f"k{i}".encode(): b"v" * 100 for i in range(100)}
    delegate.write_batch("s", 0, kept)
    with pytest.raises(StorageError, match="cannot be written.*Free space") as caught:
        for batch in range(1, 1000):
            delegate.write_batch("s", batch, {f"k{i}".encode(): b"x" * 2000 for i in range(100)})
    assert caught.value.retriable
    assert dict(delegate.entries("s", 0)) == kept  # committed state untouched
    delegate.close()


def test_an_lmdb_view_is_consistent_and_given_up_when_the_map_must_grow(tmp_path):
    import threading
    import time

    from dstl.backend.delegate.base import SECTION_ENTRIES
    from dstl.spi import StorageError

    delegate = LmdbDelegate(tmp_path / "view", map_size=1 << 20)
    # Two sections in group 3:
    before = {f"k{i:05d}".encode(): str(i).encode() for i in range(SECTION_ENTRIES + 10)}
    delegate.write_batch("a", 3, before)
    delegate.write_batch("b", 5, {b"x": b"1"})
    view = delegate.view()
    delegate.put("a", 3, b"k00000", b"changed")  # after the view: not in it
    delegate.delete("b", 5, b"x")
    sections = list(view.sections(range(8)))
    assert [(kg, len(entries)) for kg, entries in sections] == [(3, SECTION_ENTRIES), (3, 10), (5, 1)]
    assert {key: entry for _, entries in sections[:2] for _, key, entry in entries} == before
    grown = threading.Event()

    def fill_beyond_the_map():
        delegate.write_batch("c", 7, {f"big{i}".encode(): b"v" * 1000 for i in range(3000)})
        grown.set()

    writer = threading.Thread(target=fill_beyond_the_map)
    writer.start()
    # The write that does not fit gives the open view up: its next read fails, retriably.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            view.get("a", 3, b"k00000")
        except StorageError as exc:
            assert exc.retriable and "map could grow" in str(exc)
            break
        time.sleep(0.01)
    else:
        pytest.fail("the view was not given up")
    assert not grown.wait(0.2), "the map grew while a view was open"
    view.close()
    writer.join(30)
    assert grown.is_set() and delegate.resizes >= 1
    assert delegate.get("a", 3, b"k00000") == b"changed" and delegate.get("b", 5, b"x") is None
    delegate.close()


def test_a_detached_lmdb_view_reads_its_copy_while_the_map_grows(tmp_path):
    import threading

    from dstl.backend.delegate.base import SECTION_ENTRIES

    delegate = LmdbDelegate(tmp_path / "view", map_size=1 << 20)
    before = {f"k{i:05d}".encode(): str(i).encode() for i in range(SECTION_ENTRIES + 10)}
    delegate.write_batch("a", 3, before)
    view = delegate.view()
    delegate.put("a", 3, b"k00000", b"changed")  # after the view: not in it
    view.detach()
    (spool,) = tmp_path.glob("view.spool-*")

    def fill_beyond_the_map():  # a view still on the live file would block it (the map cannot grow)
        for batch in range(8):
            delegate.write_batch("c", batch, {f"big{i}".encode(): b"v" * 1000 for i in range(1000)})

    writer = threading.Thread(target=fill_beyond_the_map, daemon=True)
    writer.start()
    writer.join(30)
    assert not writer.is_alive() and delegate.resizes >= 3
    assert dict(view.entries("a", 3)) == before and view.state_names() == ["a"]  # not given up
    assert [len(entries) for _, entries in view.sections(range(8))] == [SECTION_ENTRIES, 10]
    view.close()
    assert not spool.exists()
    assert delegate.get("a", 3, b"k00000") == b"changed"
    delegate.close()


def test_lmdb_removes_the_copies_a_dead_process_left_and_nothing_else(tmp_path):
    import os
    from pathlib import Path

    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this pid
    stale = tmp_path / f"state.spool-{never}-0a1b2c3d"
    stale.mkdir()
    (stale / "data.mdb").write_bytes(b"left behind")
    live = tmp_path / f"state.spool-{os.getpid()}-0a1b2c3d"
    live.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    link = tmp_path / f"state.spool-{never}-linked"
    link.symlink_to(outside)  # a hostile entry: never followed
    plain = tmp_path / f"state.spool-{never}-file"
    plain.write_bytes(b"f")
    other = tmp_path / f"other.spool-{never}-0a1b2c3d"  # another environment's
    other.mkdir()
    LmdbDelegate(tmp_path / "state").close()
    assert not stale.exists()
    assert live.exists() and link.is_symlink() and (outside / "keep").exists()
    assert plain.exists() and other.exists()


def test_an_lmdb_view_whose_copy_fails_stays_on_the_live_file(small_tmpfs):
    delegate = LmdbDelegate(small_tmpfs / "state", map_size=64 << 20)
    kept = {f"k{i}".encode(): b"v" * 1000 for i in range(800)}  # its copy does not fit beside it
    delegate.write_batch("s", 0, kept)
    view = delegate.view()
    view.detach()
    assert not list(small_tmpfs.glob("state.spool-*"))
    assert dict(view.entries("s", 0)) == kept
    view.abandon()  # still the live file's view: given up when the map must grow
    with pytest.raises(StorageError, match="map could grow"):
        view.get("s", 0, b"k1")
    view.close()
    delegate.close()


def test_an_lmdb_view_sections_values_in_blocks_as_the_generic_path_does(tmp_path):
    from dstl.backend.delegate.base import SECTION_ENTRIES, StateView, _sectioned

    delegate = LmdbDelegate(tmp_path / "blocks")
    many = SECTION_ENTRIES * 2 + 7
    # values across block ends, then collections (one bigger than a section) among values
    delegate.write_batch("a", 1, {b"k%06d" % i: b"%d" % i for i in range(many)})
    delegate.write_batch("a", 2, {b"v1": b"x", b"v2": b"y"})
    delegate.put("a", 2, b"v3-list", [b"e%d" % i for i in range(SECTION_ENTRIES + 3)])
    delegate.put("a", 2, b"v4-map", {b"m%d" % i: b"%d" % i for i in range(5)})
    delegate.write_batch("a", 2, {b"v5": b"z"})
    delegate.write_batch("b", 1, {b"k%06d" % i: b"b" for i in range(SECTION_ENTRIES - 1)})  # second state
    delegate.write_batch("c", 3, {b"k%06d" % i: b"c" for i in range(SECTION_ENTRIES)})  # exactly a block
    view = delegate.view()
    states = view.state_names()
    for key_group in (0, 1, 2, 3):
        generic = list(
            _sectioned(key_group, (b for s in states for b in StateView.row_blocks(view, s, key_group)))
        )
        assert list(view.sections([key_group])) == generic
    sections = list(view.sections(range(4)))
    assert [(kg, len(rows)) for kg, rows in sections][:4] == [
        (1, SECTION_ENTRIES),
        (1, SECTION_ENTRIES),
        (1, SECTION_ENTRIES),
        (1, 6),
    ]
    rows_of_2 = [row for kg, rows in sections if kg == 2 for row in rows]
    # in the store's order (shorter keys first); the list's second part continues it
    assert [row[1] for row in rows_of_2] == [b"v1", b"v2", b"v5", b"v4-map", b"v3-list", b"v3-list"]
    rest = [b"e%d" % i for i in range(SECTION_ENTRIES, SECTION_ENTRIES + 3)]
    assert len(rows_of_2[4][2]) == SECTION_ENTRIES and rows_of_2[5][2:] == [rest, 1]
    view.close()
    delegate.close()


def test_a_heap_view_is_copy_on_write_per_key_group():
    delegate = HeapDelegate()
    delegate.write_batch("a", 1, {b"x": 1, b"y": 2})
    delegate.write_batch("a", 2, {b"z": 3})
    view = delegate.view()
    untouched = delegate._data["a"][2]
    delegate.put("a", 1, b"x", "changed")  # copies group 1 once
    copied = delegate._data["a"][1]
    delegate.delete("a", 1, b"y")
    delegate.put("b", 4, b"new", 9)
    assert delegate._data["a"][1] is copied, "a group is copied once per view, not per write"
    assert list(view.sections(range(8))) == [(1, [["a", b"x", 1], ["a", b"y", 2]]), (2, [["a", b"z", 3]])]
    assert delegate._data["a"][2] is untouched, "a group nobody wrote is shared, not copied"
    view.close()
    view.close()  # idempotent
    delegate.put("a", 2, b"z", 4)
    assert delegate._data["a"][2] is untouched, "without an open view, writes go in place"
    assert dict(delegate.entries("a", 1)) == {b"x": "changed"}


def test_state_names_skip_from_state_to_state(make_delegate):
    delegate = make_delegate()
    for state in ("b", "a", "long-name", "c"):
        delegate.write_batch(state, 5, {f"k{i}".encode(): b"%d" % i for i in range(50)})
        delegate.write_batch(state, 100, {b"x": b"1"})
    delegate.delete("c", 5, b"k0")
    assert delegate.states() == ["a", "b", "c", "long-name"]


def test_collections_change_an_element_at_a_time_on_each_delegate(make_delegate):
    delegate = make_delegate()
    for i in range(3000):  # several chunks of map items on LMDB
        delegate.map_put("m", 4, b"k", b"%05d" % i, b"v%d" % i)
        delegate.append("l", 4, b"k", b"e%d" % i)
    delegate.map_put("m", 4, b"k", b"00001", b"new")
    delegate.map_remove("m", 4, b"k", b"00002")
    delegate.map_remove("m", 4, b"k", b"absent")
    delegate.map_put("m", 4, b"other", b"x", b"y")  # a neighbour key's entries stay its own
    delegate.append("l", 4, b"k\x00", b"neighbour")
    expected_map = {b"%05d" % i: b"v%d" % i for i in range(3000)} | {b"00001": b"new"}
    del expected_map[b"00002"]
    assert delegate.get("m", 4, b"k") == expected_map
    assert dict(delegate.map_items("m", 4, b"k")) == expected_map
    assert delegate.map_get("m", 4, b"k", b"00001") == b"new"
    assert delegate.map_get("m", 4, b"k", b"00002") is None
    assert delegate.get("l", 4, b"k") == [b"e%d" % i for i in range(3000)]
    assert delegate.get("l", 4, b"k\x00") == [b"neighbour"]
    assert dict(delegate.entries("m", 4)) == {b"k": expected_map, b"other": {b"x": b"y"}}
    delegate.put("l", 4, b"k", [b"only"])  # replacing a list drops its old elements
    assert delegate.get("l", 4, b"k") == [b"only"]
    delegate.append("l", 4, b"k", b"next")
    assert delegate.get("l", 4, b"k") == [b"only", b"next"]
    delegate.map_remove("m", 4, b"other", b"x")  # an emptied map removes the key
    assert delegate.get("m", 4, b"other") is None
    delegate.delete("m", 4, b"k")
    assert delegate.get("m", 4, b"k") is None and list(delegate.map_items("m", 4, b"k")) == []
    assert dict(delegate.entries("l", 4)) == {b"k": [b"only", b"next"], b"k\x00": [b"neighbour"]}


def test_a_view_keeps_collections_as_they_were_while_they_change_in_place(make_delegate):
    delegate = make_delegate()
    delegate.put("l", 1, b"k", [b"a"])
    delegate.put("m", 1, b"k", {b"x": b"1"})
    view = delegate.view()
    delegate.append("l", 1, b"k", b"b")
    delegate.map_put("m", 1, b"k", b"y", b"2")
    delegate.map_remove("m", 1, b"k", b"x")
    delegate.append("l", 1, b"new", b"c")
    assert view.get("l", 1, b"k") == [b"a"] and view.get("m", 1, b"k") == {b"x": b"1"}
    assert view.get("l", 1, b"new") is None
    assert list(view.sections(range(2))) == [(1, [["l", b"k", [b"a"]], ["m", b"k", {b"x": b"1"}]])]
    view.close()
    delegate.append("l", 1, b"k", b"c")
    assert delegate.get("l", 1, b"k") == [b"a", b"b", b"c"] and delegate.get("m", 1, b"k") == {b"y": b"2"}


def test_map_items_may_change_the_map_while_they_stream(make_delegate):
    delegate = make_delegate()
    delegate.put("m", 0, b"k", {b"%05d" % i: b"v" for i in range(2500)})
    seen = []
    for map_key, _ in delegate.map_items("m", 0, b"k"):
        seen.append(map_key)
        delegate.map_remove("m", 0, b"k", map_key)
    assert sorted(seen) == [b"%05d" % i for i in range(2500)]
    assert delegate.get("m", 0, b"k") is None


def test_an_lmdb_key_too_long_is_a_clear_error(tmp_path):
    delegate = LmdbDelegate(tmp_path / "long")
    with pytest.raises(ValueError, match="exceeds the 511 bytes of an LMDB key.*delegate=heap"):
        delegate.map_put("m", 0, b"k" * 200, b"m" * 400, b"v")
    for bulk in (
        lambda: delegate.put_values("v", [0, 1], [b"short", b"k" * 600], [b"1", b"2"]),
        lambda: delegate.get_values("v", [0, 1], [b"short", b"k" * 600]),
        lambda: delegate.write_batch("v", 0, {b"short": b"1", b"k" * 600: b"2"}),  # values: one C call
        lambda: delegate.write_batch("v", 0, {b"short": b"1", b"k" * 600: [b"2"]}),  # with a collection
    ):
        with pytest.raises(ValueError, match=r"the key \(600 bytes\).*exceeds the 511 bytes"):
            bulk()
    # A key beyond what its length prefix holds (a hostile snapshot's) is the same clear error.
    for hostile in (
        lambda: delegate.write_batch("v", 0, {b"k" * 70_000: b"1"}),
        lambda: delegate.put_values("v", [0, 1], [b"short", b"k" * 70_000], [b"1", b"2"]),
        lambda: delegate.get_values("v", [0], [b"k" * 70_000]),
    ):
        with pytest.raises(ValueError, match=r"the key \(70000 bytes\).*exceeds the 511 bytes"):
            hostile()
    assert delegate.get("v", 0, b"short") is None  # the refused bulk writes wrote nothing
    delegate.close()


def test_a_backend_on_an_lmdb_dir_left_by_an_earlier_run_starts_empty(tmp_path):
    config = {
        "dstl.storage": "memory",
        "dstl.memory.namespace": f"d-{uuid.uuid4().hex}",
        "state.backend.delegate": "lmdb",
        "state.backend.lmdb.dir": str(tmp_path / "l"),
    }
    with load_storage(config, job_id="job") as storage:
        first = ChangelogKeyedStateBackend.from_config(storage, "op", ALL, config)
        first.set_current_key("stale")
        first.value_state("v").update(1)
        first.delegate.close()
        second = ChangelogKeyedStateBackend.from_config(storage, "op", ALL, config, epoch=1)
        second.set_current_key("stale")
        assert second.value_state("v").value() is None, "a key of an earlier run leaked into a new backend"
        second.delegate.close()


def test_importing_the_backend_does_not_load_lmdb():
    """The heap is the default delegate: LMDB loads on first use only."""
    import subprocess
    import sys

    probe = "import sys, dstl.backend, dstl.backend.delegate; print('lmdb' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False"


def test_stored_rows_count_values_and_follow_removals(make_delegate):
    delegate = make_delegate()
    assert delegate.stored_rows() == 0
    for index in range(50):
        delegate.put("a", index % 4, f"k{index}".encode(), b"v")
    delegate.put("b", 1, b"k0", b"v")
    assert delegate.stored_rows() == 51
    delegate.delete("a", 0, b"k0")
    delegate.drop_key_group(1)  # 13 of state a and the one of state b
    assert delegate.stored_rows() == 51 - 1 - 14
    # what the base class counts, from a snapshot, agrees
    assert delegate.stored_rows() == StateDelegate.stored_rows(delegate)


def test_lmdb_tells_the_bytes_its_data_takes_and_heap_does_not(tmp_path):
    lmdb_delegate = LmdbDelegate(tmp_path / "lmdb")
    empty = lmdb_delegate.stored_bytes()
    lmdb_delegate.write_batch("s", 3, {f"k{i}".encode(): b"x" * 200 for i in range(2000)})
    assert lmdb_delegate.stored_bytes() > empty + 2000 * 200
    assert HeapDelegate().stored_bytes() is None
