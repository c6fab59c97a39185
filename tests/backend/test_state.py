"""Keyed state: collection operations reach one element, never the whole collection."""

import uuid

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.spi import KeyGroupRange, load_storage


def _counting(base):
    class Counting(base):
        """Counts whole-entry reads and writes of collections (what made per-op cost grow)."""

        whole = 0

        def get(self, state, key_group, key):
            entry = super().get(state, key_group, key)
            self.whole += isinstance(entry, (list, dict))
            return entry

        def put(self, state, key_group, key, entry):
            self.whole += isinstance(entry, (list, dict))
            super().put(state, key_group, key, entry)

    return Counting


@pytest.fixture(params=["heap", "lmdb"])
def backend(request, tmp_path):
    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"s-{uuid.uuid4().hex}"}
    delegate = (
        _counting(HeapDelegate)() if request.param == "heap" else _counting(LmdbDelegate)(tmp_path / "lmdb")
    )
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128), delegate=delegate)
        yield backend
        backend.close()


def test_list_and_map_operations_never_read_or_write_the_whole_collection(backend):
    items, pages = backend.list_state("l"), backend.map_state("m")
    backend.set_current_key("k")
    for i in range(500):
        items.add(i)
        pages.put(i, str(i))
    for i in range(0, 500, 2):
        assert pages.get(i) == str(i) and pages.contains(i)
        pages.remove(i)
    pages.remove("absent")
    assert not pages.is_empty() and not pages.contains(0) and pages.get(0) is None
    assert backend.delegate.whole == 0, "an element operation went through the whole collection"
    assert dict(pages.items()) == {i: str(i) for i in range(1, 500, 2)}
    assert items.get() == list(range(500))  # reading the list is the one whole read


def test_map_items_stream_while_the_map_changes(backend):
    pages = backend.map_state("m")
    backend.set_current_key("k")
    for i in range(3000):
        pages.put(i, i)
    for map_key, value in pages.items():
        assert map_key == value
        pages.remove(map_key)
    assert pages.is_empty()
