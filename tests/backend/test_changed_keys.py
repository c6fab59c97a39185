"""Changed-key tracking stays within its limit, coarsening to whole key groups."""

import random

import pytest

from dstl.backend.changelog.changed_keys import ChangedKeys


def test_exact_below_the_limit():
    changed = ChangedKeys(limit=10)
    for i in range(10):
        changed.add("s", i % 3, b"k%d" % i)
    changed.add("s", 0, b"k0")  # again: counted once
    assert len(changed) == 10 and not changed.whole
    assert sorted(changed) == sorted(("s", i % 3, b"k%d" % i) for i in range(10))


def test_beyond_the_limit_the_fullest_key_groups_become_whole():
    changed = ChangedKeys(limit=100)
    for i in range(1000):
        changed.add("s", 0 if i % 10 else 1 + i % 7, b"k%d" % i)  # key group 0 takes 90% of the changes
        assert len(changed) <= 100
    assert 0 in changed.whole
    assert all(kg not in changed.whole for kg, _ in [(kg, k) for _, kg, k in changed])
    changed.add("s", 0, b"new")  # a whole group tracks nothing more
    assert changed.keys_in(0) == set()
    assert changed.estimate(keys_per_group=50) == len(changed) + 50 * len(changed.whole)


def test_update_takes_in_keys_and_whole_groups():
    kept, failed = ChangedKeys(limit=1000), ChangedKeys(limit=4)
    kept.add("s", 3, b"a")
    for i in range(10):
        failed.add("s", 3, b"k%d" % i)
    failed.add("t", 5, b"b")
    assert 3 in failed.whole
    kept.update(failed)
    assert kept.whole == {3} and list(kept) == [("t", 5, b"b")]


@pytest.mark.parametrize("order", ["as given", "by key group"])
def test_add_many_tracks_what_add_tracks_one_by_one(order):
    keys = [(i % 5, b"k%d" % (i % 40)) for i in range(120)]  # repeats: counted once
    if order == "by key group":  # a Spark batch's keys come in the store's order: a slice per group
        keys.sort()
    one_by_one, at_once = ChangedKeys(limit=1000), ChangedKeys(limit=1000)
    for key_group, key in keys:
        one_by_one.add("s", key_group, key)
    at_once.add_many("s", [kg for kg, _ in keys], [key for _, key in keys])
    assert sorted(at_once) == sorted(one_by_one) and len(at_once) == len(one_by_one) == 40


def test_add_many_beyond_the_limit_coarsens_and_skips_whole_groups():
    changed = ChangedKeys(limit=10)
    changed.add_many("s", [0] * 30 + [1, 2], [b"k%d" % i for i in range(32)])
    assert (
        changed.whole == {0} and len(changed) == 2 and sorted(changed) == [("s", 1, b"k30"), ("s", 2, b"k31")]
    )
    changed.add_many("s", [0, 0, 3], [b"more", b"k0", b"n"])  # a whole group tracks nothing more
    assert changed.keys_in(0) == set() and len(changed) == 3
    with pytest.raises(ValueError):
        changed.add_many("s", [1, 2], [b"one key"])


def test_the_limit_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        ChangedKeys(0)


def test_batches_larger_than_the_limit_keep_every_change_and_the_bound():
    rng = random.Random(7)
    changed, added = ChangedKeys(limit=500), set()
    for batch in range(12):
        size = rng.choice([50, 400, 2000])
        groups = [rng.randrange(64) for _ in range(size)]
        keys = [b"b%d-%d" % (batch, rng.randrange(size)) for _ in range(size)]  # with repeats
        changed.add_many("s", groups, keys)
        added.update(zip(groups, keys, strict=True))
        assert len(changed) <= changed.limit
        tracked = {(kg, key) for _, kg, key in changed}
        assert all((kg, key) in tracked or kg in changed.whole for kg, key in added)
        assert not any(kg in changed.whole for kg, _ in tracked)


def test_a_batch_larger_than_the_limit_makes_its_fullest_groups_whole_first():
    changed = ChangedKeys(limit=10)
    changed.add_many("s", [0] * 4 + [1] * 3, [b"a%d" % i for i in range(7)])
    changed.add_many("s", [2] * 20 + [1] * 2, [b"b%d" % i for i in range(22)])
    assert changed.whole == {2, 1} and sorted(changed) == [("s", 0, b"a%d" % i) for i in range(4)]
    changed.add_many("s", [1] * 5 + [2] * 30, [b"c%d" % i for i in range(35)])  # all whole: no change
    assert changed.whole == {2, 1} and len(changed) == 4


def test_key_groups_made_whole_forget_their_keys_and_track_no_more():
    changed = ChangedKeys(limit=100)
    changed.add_many("s", [1, 2, 3], [b"a", b"b", b"c"])
    changed.make_whole(range(0, 3))
    assert changed.whole == {0, 1, 2} and list(changed) == [("s", 3, b"c")]
    changed.add_many("s", [0, 1, 2, 2], [b"d", b"e", b"f", b"g"])  # every key in a whole group
    changed.add_many("s", [1, 4], [b"h", b"i"])
    assert sorted(changed) == [("s", 3, b"c"), ("s", 4, b"i")]
    assert changed.estimate(keys_per_group=10) == 2 + 3 * 10


def test_the_keys_by_state_are_the_tracked_keys_grouped():
    changed = ChangedKeys(limit=100)
    changed.add_many("s", [0, 0, 2, 7], [b"a", b"b", b"c", b"d"])
    changed.add("t", 2, b"e")

    def grouped():
        by_state = changed.by_state().items()
        return {state: {kg: sorted(keys) for kg, keys in groups.items()} for state, groups in by_state}

    assert grouped() == {"s": {0: [b"a", b"b"], 2: [b"c"], 7: [b"d"]}, "t": {2: [b"e"]}}
    changed.make_whole([2])
    assert grouped() == {"s": {0: [b"a", b"b"], 7: [b"d"]}} and len(changed) == 3
