"""The kit's refusals, word for word: what users and storage authors read when something is wrong.

Each message names what was refused, where (the log, the job, the object) and, where there
is one, the way out. The conformance suite checks the type of each refusal on every
storage; these pin the wording the kit and the memory storage give (issue 34: error
messages that name the fix are part of the product). The format's refusals are pinned in
``test_changeset_format.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from dstl.conformance.testing import restricted_handle
from dstl.spi import (
    ChangelogHandle,
    ClosedError,
    CorruptedError,
    FencedError,
    InvalidHandleError,
    InvalidIdentifierError,
    KeyGroupRange,
    ReadOnlyError,
    StorageError,
    TruncatedError,
    load_storage,
)

KG = KeyGroupRange(0, 4)


def refusal(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    """The type and the whole message of what ``call`` raises."""
    with pytest.raises(Exception) as info:  # the caller compares type and text exactly
        result = call()
        if hasattr(result, "__next__"):
            list(result)  # a lazy read refuses when it is consumed
    return info.type, str(info.value)


@pytest.fixture
def storage(memory_config):
    with load_storage(memory_config, job_id="job") as opened:
        yield opened


# -- writers -------------------------------------------------------------------------------


def test_writer_refusals(storage):
    writer = storage.create_writer("op", KG)
    log = writer.log_id
    assert refusal(lambda: writer.append(7, b"x")) == (
        ValueError,
        f"key group 7 is outside this writer's range [0, 4) of log {log!r}",
    )
    assert refusal(lambda: writer.append(0, "text")) == (
        TypeError,
        "state change data must be bytes-like, got str",
    )
    assert refusal(lambda: writer.persist(-1, 0)) == (
        ValueError,
        "start_sqn must be a non-negative int, got -1",
    )
    assert refusal(lambda: writer.persist(0, -2)) == (
        ValueError,
        "checkpoint_id must be a non-negative int, got -2",
    )
    assert refusal(lambda: writer.persist(5, 0)) == (
        ValueError,
        f"start_sqn 5 is beyond the next SQN 0 of log {log!r}",
    )
    writer.append(0, b"a")
    writer.next_sqn()
    writer.append(0, b"b")
    writer.next_sqn()
    assert refusal(lambda: writer.truncate(9)) == (
        ValueError,
        f"cannot truncate log {log!r} before SQN 9: the next SQN is 2",
    )
    writer.truncate(1)
    assert refusal(lambda: writer.persist(0, 0)) == (
        TruncatedError,
        f"cannot persist log {log!r} from SQN 0: changes below 1 were truncated (materialized)",
    )
    writer.close()
    assert refusal(lambda: writer.append(0, b"x")) == (ClosedError, f"writer of log {log!r} is closed")


def test_a_fenced_writer_and_a_stale_epoch_say_which_epoch_won(storage):
    old = storage.create_writer("op", KG, epoch=1)
    storage.create_writer("op", KG, epoch=2)
    log = old.log_id
    old.append(0, b"x")
    with pytest.raises(FencedError):  # the storage's own words: the fence is found where it writes
        old.persist(0, 1).result()
    assert refusal(lambda: old.append(0, b"x")) == (
        FencedError,
        f"writer of log {log!r} (epoch 1) was fenced by a newer writer",
    )
    assert refusal(lambda: storage.create_writer("op", KG, epoch=1)) == (
        FencedError,
        f"log {log!r} already has a writer with epoch 2 > 1",
    )


# -- storages ------------------------------------------------------------------------------


def test_storage_refusals(memory_config):
    with load_storage(memory_config, job_id="job") as storage:
        assert refusal(lambda: storage.create_writer("op", KG, epoch=-1)) == (
            ValueError,
            "epoch must be a non-negative int, got -1",
        )
    assert refusal(lambda: storage.create_writer("op", KG)) == (ClosedError, "memory storage is closed")
    with load_storage({**memory_config, "dstl.read-only": "true"}, job_id="job") as reading:
        assert refusal(lambda: reading.create_writer("op", KG)) == (
            ReadOnlyError,
            "memory storage of job 'job' is open read only (dstl.read-only): it reads handles, "
            "and writes, discards or collects nothing",
        )
    kind, message = refusal(lambda: load_storage(memory_config, job_id="a/b"))
    assert kind is InvalidIdentifierError
    assert message.startswith("job id "), message


# -- readers -------------------------------------------------------------------------------


@pytest.fixture
def persisted(storage) -> ChangelogHandle:
    writer = storage.create_writer("op", KG)
    writer.append(0, b"a")
    return writer.persist(0, 1).result()


def test_reader_refusals(storage, persisted):
    reader = storage.create_reader()
    log = persisted.log_id
    assert refusal(lambda: reader.read(dataclasses.replace(persisted, storage_id="other"))) == (
        StorageError,
        "handle of storage 'other' cannot be read by storage 'memory'",
    )
    bad_offset = [{**persisted.location_dicts[0], "offset": "zero"}]
    assert refusal(lambda: reader.read(restricted_handle(persisted, bad_offset))) == (
        InvalidHandleError,
        f"location of handle of log {log!r}: field 'offset' must be int, got 'zero'",
    )
    unnamed = [{**persisted.location_dicts[0], "object": 5}]
    assert refusal(lambda: reader.read(restricted_handle(persisted, unnamed))) == (
        InvalidHandleError,
        f"location of handle of log {log!r}: field 'object' must be str, got 5",
    )
    empty = [{**persisted.location_dicts[0], "length": 0}]
    assert refusal(lambda: reader.read(restricted_handle(persisted, empty))) == (
        InvalidHandleError,
        f"location of handle of log {log!r}: field 'length' is 0, outside [1, 2147483647]",
    )
    unnumbered = [{**persisted.location_dicts[0], "sqn": "first"}]
    assert refusal(lambda: reader.read(restricted_handle(persisted, unnumbered))) == (
        InvalidHandleError,
        f"location of handle of log {log!r}: field 'sqn' must be int, got 'first'",
    )
    name = persisted.location_dicts[0]["object"]
    storage.discard([persisted])
    assert refusal(lambda: reader.read(persisted)) == (
        StorageError,
        f"object {name!r} of log {log!r} does not exist (was it discarded?)",
    )


def test_a_change_set_of_another_log_is_named_with_both_identities(storage, persisted):
    other = storage.create_writer("other", KG)
    other.append(0, b"b")
    theirs = other.persist(0, 1).result()
    swapped = restricted_handle(persisted, theirs.location_dicts)
    kind, message = refusal(lambda: storage.create_reader().read(swapped))
    assert kind is CorruptedError
    assert message.startswith(
        f"stored change set belongs to log {theirs.log_id!r} epoch 0 SQN 0, not to the handle's log "
        f"{persisted.log_id!r} epoch 0 SQN 0 (memory://"
    ), message


def test_a_discard_of_another_jobs_object_is_refused_by_name(storage, persisted):
    foreign = [{**persisted.location_dicts[0], "object": "someone-else/object-1"}]
    assert refusal(lambda: storage.discard([restricted_handle(persisted, foreign)])) == (
        InvalidHandleError,
        "object location 'someone-else/object-1' does not belong to job 'job' of this storage: "
        "a damaged or foreign handle",
    )
