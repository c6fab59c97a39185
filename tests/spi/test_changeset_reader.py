"""Readers hand out change sets whole (the restore path) exactly as ``read`` yields them one by one."""

import uuid

import pytest

from dstl.spi import KeyGroupRange, load_storage
from dstl.spi.memory._private.storage import MemoryStorageReader


@pytest.fixture
def storage():
    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"r-{uuid.uuid4().hex}"}
    with load_storage(config, job_id="job") as storage:
        yield storage


def persisted(storage):
    """Three change sets, each with a metadata record and one change per key group."""
    writer = storage.create_writer("log", KeyGroupRange(0, 8))
    for change_set in range(3):
        writer.append_meta(b"meta-%d" % change_set)
        for kg in range(8):
            writer.append(kg, b"change-%d-%d" % (change_set, kg))
        writer.next_sqn()
    return writer.persist(writer.initial_sqn(), 1).result(timeout=10)


def as_sets(changes):
    out = {}
    for change in changes:
        out.setdefault(change.sqn, []).append((change.key_group, change.data))
    return list(out.items())


@pytest.mark.parametrize("key_groups", [None, KeyGroupRange(2, 5)])
def test_read_change_sets_equals_read_grouped_by_sqn(storage, key_groups):
    handle = persisted(storage)
    reader = storage.create_reader()
    expected = as_sets(reader.read(handle, key_groups))
    assert len(expected) == 3 and any(kg == -1 for _, changes in expected for kg, _ in changes)
    assert list(reader.read_change_sets(handle, key_groups)) == expected
    if key_groups is not None:
        assert all(kg == -1 or kg in key_groups for _, changes in expected for kg, _ in changes)


def test_a_reader_that_overrides_read_is_followed_by_read_change_sets(storage):
    class OnlyEvenKeyGroups(MemoryStorageReader):
        def read(self, handle, key_groups=None):
            return (c for c in super().read(handle, key_groups) if c.key_group % 2 == 0)

    handle = persisted(storage)
    reader = OnlyEvenKeyGroups(storage)
    assert not reader.fetches_change_sets
    sets = list(reader.read_change_sets(handle))
    assert sets == as_sets(reader.read(handle)) and all(kg % 2 == 0 for _, c in sets for kg, _ in c)
