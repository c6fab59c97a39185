"""Keyed state: collection operations reach one element, never the whole collection."""

import uuid

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.backend.keygroups import key_group_for
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


def test_value_exists_and_map_keys_and_values_stream(backend):
    value, pages = backend.value_state("v"), backend.map_state("m")
    backend.set_current_key("k")
    assert not value.exists()
    value.update(0)  # a falsy value exists too
    assert value.exists()
    value.clear()
    assert not value.exists()
    for i in range(300):
        pages.put(("p", i), {"n": i})
    assert sorted(pages.keys()) == [("p", i) for i in range(300)]
    assert sorted(v["n"] for v in pages.values()) == list(range(300))
    assert backend.delegate.whole == 0, "keys() or values() read the whole map at once"


def test_map_items_stream_while_the_map_changes(backend):
    pages = backend.map_state("m")
    backend.set_current_key("k")
    for i in range(3000):
        pages.put(i, i)
    for map_key, value in pages.items():
        assert map_key == value
        pages.remove(map_key)
    assert pages.is_empty()


@pytest.mark.parametrize("delegate_kind", ["heap", "lmdb"])
def test_bulk_access_equals_key_by_key_and_restores_the_same(tmp_path, memory_config, delegate_kind):
    """get_many/update_many/add_many/put_many leave the state and the log key-by-key calls leave."""
    import random

    from dstl.backend.changelog import BackendSnapshot

    rng = random.Random(7)

    def make(name, epoch=0):
        delegate = HeapDelegate() if delegate_kind == "heap" else LmdbDelegate(tmp_path / name)
        return ChangelogKeyedStateBackend(
            storage, name, KeyGroupRange(0, 128), delegate=delegate, epoch=epoch
        )

    def states(b):
        total = b.reducing_state("total", lambda a, c: a + c)
        return b.value_state("v"), b.list_state("l"), b.map_state("m"), total

    def contents(b):
        v, lst, m, t = states(b)
        found = {}
        for key in range(60):
            b.set_current_key(key)
            found[key] = (v.value(), lst.get(), dict(m.items()), t.get())
        return found

    with load_storage(memory_config, job_id="job") as storage:
        bulk, single = make("bulk"), make("single")
        for _ in range(5):
            keys = [rng.randrange(60) for _ in range(40)]  # repeats included
            values = [rng.choice([None, rng.randrange(100)]) for _ in keys]
            v, lst, m, t = states(bulk)
            bound = bulk.key_set(keys)
            v.update_many(bound, values)
            lst.add_many(bound, values)
            m.put_many(bound, [k % 3 for k in keys], values)
            t.add_many(bound, [x or 0 for x in values])
            v, lst, m, t = states(single)
            last = {}
            for key, value in zip(keys, values, strict=True):
                last[key] = value
                single.set_current_key(key)
                lst.add(value)
                m.put(key % 3, value)
                t.add(value or 0)
            for key, value in last.items():
                single.set_current_key(key)
                v.update(value)
        assert contents(bulk) == contents(single)
        v, lst, m, t = states(bulk)
        assert v.get_many(range(60)) == [contents(single)[k][0] for k in range(60)]
        assert lst.get_many(range(60)) == [contents(single)[k][1] for k in range(60)]
        assert m.get_many(range(60), [1] * 60) == [contents(single)[k][2].get(1) for k in range(60)]
        assert t.get_many(bulk.key_set(range(60))) == [contents(single)[k][3] for k in range(60)]
        snapshot = bulk.checkpoint(1).result(timeout=30)
        restored = make("restored", epoch=1)
        restored.restore(BackendSnapshot.from_json(snapshot.to_json()))
        assert contents(restored) == contents(single)
        for b in (bulk, single, restored):
            b.close()


def test_keys_said_distinct_are_not_checked_and_a_repeated_one_keeps_its_last_write(tmp_path, memory_config):
    from dataclasses import replace

    from dstl.backend.changelog import BackendSnapshot

    def make(name, epoch=0):
        return ChangelogKeyedStateBackend(
            storage, name, KeyGroupRange(0, 128), delegate=LmdbDelegate(tmp_path / name), epoch=epoch
        )

    with load_storage(memory_config, job_id="job") as storage:
        backend = make("op")
        value, total = backend.value_state("v"), backend.reducing_state("t", lambda a, c: a + c)
        bound = backend.key_set(["a", "b", "a"])
        said = replace(bound, known_distinct=True)  # wrongly: "a" is there twice
        assert not bound.distinct and said.distinct and said == bound
        value.update_many(said, [1, 2, 3])
        total.add_many(said, [1, 2, 3])
        assert value.get_many(["a", "b"]) == [3, 2] and total.get_many(["a", "b"]) == [4, 2]
        restored = make("restored", epoch=1)
        restored.restore(BackendSnapshot.from_json(backend.checkpoint(1).result(timeout=30).to_json()))
        assert restored.value_state("v").get_many(["a", "b"]) == [3, 2]
        assert restored.reducing_state("t", lambda a, c: a + c).get_many(["a", "b"]) == [4, 2]
        backend.close()
        restored.close()


def test_bulk_access_refuses_keys_of_other_instances_and_mismatched_lengths(memory_config):
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 1))
        with pytest.raises(ValueError, match="outside this backend"):
            backend.key_set(range(50))
        value = backend.value_state("v")
        inside = [k for k in range(500) if key_group_for(k, 128) == 0][:2]
        with pytest.raises(ValueError, match="got 1 values for 2 keys"):
            value.update_many(inside, [1])
        backend.close()
