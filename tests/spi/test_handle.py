import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstl.spi import ChangelogHandle, InvalidHandleError, KeyGroupRange, SequenceNumberRange
from dstl.spi.handle import MAX_HANDLE_JSON_BYTES


def make_handle(**overrides):
    fields = dict(
        storage_id="local",
        log_id="op-1.kg0-128",
        key_groups=KeyGroupRange(0, 128),
        sqn_range=SequenceNumberRange(3, 9),
        epoch=2,
        size=100,
        incremental_size=40,
        checkpoint_id=7,
        locations=[{"segment": "seg-000001.log", "offset": 12, "length": 88, "sqn": 3}],
    )
    fields.update(overrides)
    return ChangelogHandle.create(**fields)


def doc(**overrides):
    d = make_handle().to_dict()
    d.update(overrides)
    return d


def test_round_trip():
    handle = make_handle()
    again = ChangelogHandle.from_json(handle.to_json())
    assert again == handle
    assert again.to_json() == handle.to_json()
    assert json.loads(handle.to_json())["version"] == 1


locations = st.lists(
    st.fixed_dictionaries(
        {
            "object": st.from_regex(r"[a-z0-9]{1,8}(/[a-z0-9._-]{1,8}){0,3}", fullmatch=True).filter(
                lambda s: all(p not in (".", "..") for p in s.split("/"))
            ),
            "offset": st.integers(0, 2**40),
            "sqn": st.integers(0, 2**31),
            "flag": st.booleans() | st.none(),
        }
    ),
    max_size=5,
)


@given(
    start=st.integers(0, 1000),
    length=st.integers(0, 1000),
    kg_start=st.integers(0, 100),
    kg_len=st.integers(0, 100),
    locs=locations,
    size=st.integers(0, 2**40),
)
def test_round_trip_property(start, length, kg_start, kg_len, locs, size):
    handle = make_handle(
        sqn_range=SequenceNumberRange(start, start + length),
        key_groups=KeyGroupRange(kg_start, kg_start + kg_len),
        locations=locs,
        size=size,
        incremental_size=size // 2,
    )
    assert ChangelogHandle.from_json(handle.to_json()) == handle


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "must be an object"),
        (doc(schema="other"), "not a dstl changelog handle"),
        (doc(version=2), "unsupported handle schema version 2"),
        (doc(version="1"), "unsupported handle schema version"),
        (doc(sqn_range=[5, 2]), "invalid range"),
        (doc(sqn_range=[-1, 2]), "invalid range"),
        (doc(key_groups=[0]), "two integers"),
        (doc(key_groups=["0", 5]), "two integers"),
        (doc(size=-1), "non-negative"),
        (doc(size=1.5), "non-negative"),
        (doc(epoch=True), "non-negative"),
        (doc(incremental_size=1000), "exceeds size"),
        (doc(storage_id=5), "must be a string"),
        (doc(log_id="../../etc"), "not a safe name"),
        (doc(locations={}), "must be a list"),
        (doc(locations=[["a"]]), "must be an object"),
        (doc(locations=[{"segment": "../../etc/passwd"}]), "safe relative path"),
        (doc(locations=[{"segment": "/etc/passwd"}]), "safe relative path"),
        (doc(locations=[{"segment": "a/./b"}]), "safe relative path"),
        (doc(locations=[{"segment": "C:\\\\x"}]), "safe relative path"),
        (doc(locations=[{"segment": "s3://bucket/key"}]), "safe relative path"),
        (doc(locations=[{"segment": "a\x00b"}]), "safe relative path"),
        (doc(locations=[{"segment": "a\x7fb"}]), "safe relative path"),
        (doc(locations=[{"segment": "a\nb"}]), "safe relative path"),
        (doc(locations=[{"offset": -5}]), "must not be negative"),
        (doc(locations=[{"offset": 1.5}]), "must be a string"),
        (doc(locations=[{"nested": {"a": 1}}]), "must be a string"),
        (doc(locations=[{"not an identifier": 1}]), "invalid key"),
        (doc(extra=1), "unknown handle fields"),
    ],
)
def test_hostile_documents_are_rejected(document, message):
    with pytest.raises(InvalidHandleError, match=message):
        ChangelogHandle.from_json(json.dumps(document))


def test_malformed_json():
    with pytest.raises(InvalidHandleError, match="not valid JSON"):
        ChangelogHandle.from_json("{not json")


def test_duplicate_keys_rejected():
    text = make_handle().to_json()
    text = text[:-1] + ',"epoch":9}'
    with pytest.raises(InvalidHandleError, match="duplicate key"):
        ChangelogHandle.from_json(text)


def test_deeply_nested_json_rejected():
    with pytest.raises(InvalidHandleError):
        ChangelogHandle.from_json("[" * 100_000 + "]" * 100_000)


def test_oversized_json_rejected_before_parsing():
    with pytest.raises(InvalidHandleError, match="above the limit"):
        ChangelogHandle.from_json(" " * (MAX_HANDLE_JSON_BYTES + 1))


def test_handle_is_immutable_and_never_pickled_in_json():
    handle = make_handle()
    with pytest.raises(AttributeError):
        handle.size = 3  # type: ignore[misc]
    assert "pickle" not in handle.to_json()
    assert isinstance(json.loads(handle.to_json()), dict)


@pytest.mark.parametrize("value", [None, 5, [], {}, 1.5])
def test_from_json_of_a_non_text_value_is_an_invalid_handle_error(value):
    with pytest.raises(InvalidHandleError, match="must be text or bytes"):
        ChangelogHandle.from_json(value)


def test_reads_names_the_changes_and_leaves_the_accounting_out():
    handle = make_handle()
    carried = make_handle(incremental_size=0, checkpoint_id=9)  # a later checkpoint carries it over
    assert carried.reads == handle.reads and hash(carried.reads) == hash(handle.reads)
    for other in (
        make_handle(epoch=3),
        make_handle(log_id="op-2.kg0-128"),
        make_handle(sqn_range=SequenceNumberRange(3, 8)),
        make_handle(key_groups=KeyGroupRange(0, 64)),
        make_handle(locations=[{"segment": "seg-000002.log", "offset": 12, "length": 88, "sqn": 3}]),
        make_handle(storage_id="filesystem"),
    ):
        assert other.reads != handle.reads
