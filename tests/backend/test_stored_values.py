"""State read back that does not decode: a CorruptedError naming the state and the fix, on every read path."""

import uuid

import msgpack
import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.backend.keyed import StateDescriptor, StateKind
from dstl.backend.keygroups import key_group_for
from dstl.spi import CorruptedError, KeyGroupRange, load_storage

#: What a damaged or forged working copy (or a restored checkpoint) may hold where a state reads.
DAMAGE = {
    "not msgpack": b"\xc1\xc1",
    "a list where a value is": [b"\x01"],
    "a dict where a value is": {b"\xa1x": b"\x01"},
}


@pytest.fixture(params=["heap", "lmdb"])
def backend(request, tmp_path):
    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"s-{uuid.uuid4().hex}"}
    delegate = HeapDelegate() if request.param == "heap" else LmdbDelegate(tmp_path / "lmdb")
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128), delegate=delegate)
        yield backend
        backend.close()


def _damage(backend, state, key, entry):
    backend.delegate.put(state, key_group_for(key, 128), msgpack.packb(key), entry)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("serializer", ["msgpack", "spark"])
def test_a_value_that_does_not_decode_names_its_state_and_the_fix(backend, damage, serializer):
    value = backend.register(StateDescriptor("counts", StateKind.VALUE, serializer))
    backend.set_current_key("good")
    value.update(1)
    _damage(backend, "counts", "bad", DAMAGE[damage])
    reads = [lambda: (backend.set_current_key("bad"), value.value())]
    if damage == "not msgpack" or isinstance(backend.delegate, HeapDelegate):
        reads.append(lambda: value.get_many(backend.key_set(["good", "bad"])))
    else:  # LMDB's bulk read looks up value records only: elements at a value's key are not seen
        assert value.get_many(backend.key_set(["good", "bad"])) == [1, None]
    for read in reads:
        with pytest.raises(CorruptedError, match="stored value of state 'counts' does not decode") as failed:
            read()
        assert "Remove the instance's working directory" in str(failed.value)
    assert value.get_many(backend.key_set(["good"])) == [1]  # the rest of the state reads as before


def test_a_list_or_map_element_that_does_not_decode_names_its_state(backend):
    elements = backend.register(StateDescriptor("seen", StateKind.LIST))
    entries = backend.register(StateDescriptor("by_day", StateKind.MAP))
    _damage(backend, "seen", "bad", [b"\x01", b"\xc1"])
    _damage(backend, "by_day", "bad", {msgpack.packb("mon"): b"\xc1"})
    backend.set_current_key("bad")
    for read, state in [
        (elements.get, "seen"),
        (lambda: elements.get_many(backend.key_set(["bad"])), "seen"),
        (lambda: entries.get("mon"), "by_day"),
        (lambda: list(entries.items()), "by_day"),
    ]:
        with pytest.raises(CorruptedError, match=f"stored value of state '{state}' does not decode"):
            read()
