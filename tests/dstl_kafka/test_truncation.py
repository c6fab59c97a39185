"""kafka physical truncation: what may be deleted, and the DeleteRecords probe against a real broker."""

import logging

from dstl.conformance.testing import persist, read_data
from dstl.kafka._private.truncation import live_floors, truncation_offsets
from dstl.spi import ChangelogHandle, KeyGroupRange, SequenceNumberRange, load_storage

KG = KeyGroupRange(0, 4)


def handle(topic: str, *spans: tuple[int, int, int]) -> ChangelogHandle:
    """A kafka handle with one location per ``(partition, first, last)``."""
    return ChangelogHandle.create(
        storage_id="kafka",
        log_id="op",
        key_groups=KG,
        sqn_range=SequenceNumberRange(0, len(spans)),
        epoch=1,
        locations=(
            {"topic": topic, "partition": p, "first": first, "last": last, "sqn": i}
            for i, (p, first, last) in enumerate(spans)
        ),
    )


def test_live_floors_take_the_smallest_first_offset_of_this_topic_only():
    live = [
        handle("t.job", (0, 40, 41), (1, 7, 9)),
        handle("t.job", (0, 12, 20)),
        handle("t.other", (0, 1, 2)),  # another topic: not ours to protect or to delete
    ]
    assert live_floors("t.job", live, "kafka") == {0: 12, 1: 7}
    foreign = ChangelogHandle.create(
        storage_id="local", log_id="op", key_groups=KG, sqn_range=SequenceNumberRange(0, 0)
    )
    assert live_floors("t.job", [foreign], "kafka") == {}


def test_truncation_stops_at_the_first_live_record_and_at_the_in_flight_cutoff():
    floors = {0: 12, 1: 7}
    cutoffs = {0: 30, 1: 5, 2: 50, 3: 9}
    lows = {0: 0, 1: 0, 2: 50, 3: 2}
    # 0: a live handle starts at 12; 1: an attempt in flight wrote at 5; 2: nothing
    # older than the low watermark; 3: no live handle, everything below the cutoff goes.
    # 4: the broker gave no cutoff, so an attempt in flight may be anywhere: untouched.
    assert truncation_offsets(5, floors, cutoffs, lows) == {0: 12, 1: 5, 3: 9}


def test_nothing_is_deleted_below_the_low_watermark_or_without_a_cutoff():
    assert truncation_offsets(2, {0: 3}, {0: 10, 1: 4}, {0: 3, 1: 4}) == {}
    assert truncation_offsets(1, {}, {}, {}) == {}


def test_a_broker_without_delete_records_is_probed_once_and_loses_nothing(kafka_config, caplog):
    """Tansu closes the connection on DeleteRecords: retention is said once, live data stays readable."""
    with load_storage(kafka_config, job_id="truncate") as storage:
        kept = storage.create_writer("kept", KG)
        kept.append(0, b"live")
        live = persist(kept, 0, 1)
        orphan = storage.create_writer("orphan", KG)
        orphan.append(1, b"never checkpointed")
        persist(orphan, 0, 1)
        with caplog.at_level(logging.WARNING, logger="dstl.kafka"):
            assert storage.collect_orphans([live], older_than=float("inf")) == 0
            assert storage.collect_orphans([live], older_than=float("inf")) == 0
        refusals = [r for r in caplog.records if "refused DeleteRecords" in r.getMessage()]
        assert len(refusals) == 1, caplog.text
        assert "retention" in refusals[0].getMessage()
        assert storage.metrics.counter("truncated_partitions") == 0
        assert read_data(storage, live) == [b"live"]
