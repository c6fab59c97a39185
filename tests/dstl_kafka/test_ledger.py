"""The partition ledger: which offsets may hide a claim marker."""

import threading

from dstl.kafka._private.ledger import PartitionLedger


def test_own_offsets_in_a_row_follow_without_asking():
    ledger = PartitionLedger()
    for offset in range(5):
        ledger.delivered(offset)
    assert ledger.follows(4)
    assert ledger.highest == 4


def test_a_foreign_offset_is_a_gap_until_covered():
    ledger = PartitionLedger()
    for offset in (0, 1, 3, 4):  # 2 came from someone else
        ledger.delivered(offset)
    assert not ledger.follows(4)
    assert not ledger.follows(4)  # asking again does not paper over it
    ledger.cover(2)
    assert ledger.follows(4)


def test_nothing_is_known_below_the_first_own_offset_of_a_used_partition():
    ledger = PartitionLedger()
    ledger.delivered(100)
    assert not ledger.follows(100)
    ledger.cover(99)
    assert ledger.follows(100)


def test_cover_below_the_covered_offset_changes_nothing_and_drops_old_offsets():
    ledger = PartitionLedger()
    ledger.cover(10)
    ledger.delivered(7)  # a late report below the covered offset is not kept
    ledger.cover(5)
    ledger.delivered(11)
    assert ledger.follows(11)
    assert not ledger.follows(12)


def test_reports_from_many_threads_are_all_counted():
    ledger = PartitionLedger()
    threads = [
        threading.Thread(target=lambda start=start: [ledger.delivered(o) for o in range(start, 10_000, 4)])
        for start in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.follows(9_999)
    assert ledger.highest == 9_999
