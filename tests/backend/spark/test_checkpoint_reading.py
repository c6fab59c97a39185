"""The handles the change readers read out of a query's retained checkpoints."""

from dataclasses import replace

import pytest

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.checkpoints import CompletedCheckpoint
from dstl.backend.spark._private.checkpoint_reading import logged_handles
from dstl.spi import ChangelogHandle, InvalidHandleError, KeyGroupRange, SequenceNumberRange


def _handle(checkpoint_id: int, sqn: int, uploaded: int = 40) -> ChangelogHandle:
    return ChangelogHandle.create(
        storage_id="local",
        log_id="op.kg0-128",
        key_groups=KeyGroupRange(0, 128),
        sqn_range=SequenceNumberRange(sqn, sqn + 1),
        epoch=checkpoint_id,
        size=40,
        incremental_size=uploaded,
        checkpoint_id=checkpoint_id,
        locations=[{"segment": f"seg-{checkpoint_id}.log", "offset": 0, "length": 40, "sqn": sqn}],
    )


def _checkpoint(checkpoint_id: int, *handles: ChangelogHandle) -> CompletedCheckpoint:
    return CompletedCheckpoint(checkpoint_id, {"op.kg0-128": BackendSnapshot(checkpoint_id, handles)})


def test_a_handle_later_checkpoints_carry_over_is_read_once():
    first, second = _handle(1, 0), _handle(2, 0)
    carried = replace(first, incremental_size=0)  # what a later checkpoint reports of it
    documents = [_checkpoint(1, first), _checkpoint(2, carried, second), _checkpoint(3, carried, second)]
    assert logged_handles(documents, 1, None, "here") == [first, second]
    assert logged_handles(documents, 2, 2, "here") == [second]


def test_a_batch_before_the_retained_log_is_refused():
    documents = [_checkpoint(2, _handle(2, 0)), _checkpoint(3, _handle(2, 0), _handle(3, 0))]
    with pytest.raises(InvalidHandleError, match=r"batch 1 has no retained log.*batches with a log: 2\.\.3"):
        logged_handles(documents, 1, None, "here")
