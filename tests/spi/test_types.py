import pytest

from dstl.spi import META_KEY_GROUP, KeyGroupRange, SequenceNumberRange, StateChange


def test_key_group_range_is_half_open():
    kg = KeyGroupRange(2, 5)
    assert list(kg) == [2, 3, 4]
    assert 2 in kg and 4 in kg and 5 not in kg and 1 not in kg
    assert len(kg) == 3
    assert META_KEY_GROUP not in kg


@pytest.mark.parametrize("bounds", [(-1, 3), (5, 4)])
def test_key_group_range_rejects_bad_bounds(bounds):
    with pytest.raises(ValueError, match="half-open"):
        KeyGroupRange(*bounds)


def test_key_group_range_rejects_non_ints():
    with pytest.raises(TypeError):
        KeyGroupRange(True, 3)
    with pytest.raises(TypeError):
        KeyGroupRange("0", 3)


def test_intersection_and_containment():
    a, b = KeyGroupRange(0, 10), KeyGroupRange(5, 20)
    assert a.intersection(b) == KeyGroupRange(5, 10)
    assert len(a.intersection(KeyGroupRange(10, 12))) == 0
    assert a.contains_range(KeyGroupRange(3, 10))
    assert not a.contains_range(b)
    assert a.contains_range(KeyGroupRange(50, 50))


def test_sequence_number_range():
    r = SequenceNumberRange(3, 6)
    assert 3 in r and 5 in r and 6 not in r
    assert SequenceNumberRange(4, 4).is_empty
    with pytest.raises(ValueError):
        SequenceNumberRange(-1, 2)


def test_state_change_meta():
    assert StateChange(META_KEY_GROUP, b"x").is_meta
    assert not StateChange(0, b"x").is_meta
