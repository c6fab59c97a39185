"""The writer SPI's defaults: what a storage that implements only the abstract methods gets."""

from __future__ import annotations

import array

import pytest

from dstl.spi import KeyGroupRange, StateChangelogWriter


class AppendsOnly(StateChangelogWriter):
    """A writer that records its appends (the rest is never called here)."""

    def __init__(self) -> None:
        self.appended: list[tuple[int, bytes]] = []

    log_id = "op.kg4-8"  # type: ignore[assignment]  # a plain attribute stands for the property
    key_groups = KeyGroupRange(4, 8)  # type: ignore[assignment]
    epoch = 0  # type: ignore[assignment]

    def append(self, key_group: int, data: bytes) -> None:
        self.appended.append((key_group, bytes(data)))

    def append_meta(self, data: bytes) -> None:
        raise NotImplementedError

    def initial_sqn(self) -> int:
        raise NotImplementedError

    def next_sqn(self) -> int:
        raise NotImplementedError

    def last_appended_sqn(self) -> int | None:
        raise NotImplementedError

    def persist(self, start_sqn, checkpoint_id):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def truncate(self, before_sqn: int) -> None:
        raise NotImplementedError

    def confirm(self, start_sqn: int, end_sqn: int, checkpoint_id: int) -> None:
        raise NotImplementedError

    def reset(self, start_sqn: int, end_sqn: int, checkpoint_id: int) -> None:
        raise NotImplementedError

    def truncate_and_close(self, from_sqn: int) -> None:
        raise NotImplementedError

    def buffered_bytes(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def test_the_default_append_all_appends_each_change_in_order():
    writer = AppendsOnly()
    numbers = array.array("h", [1, 2])
    writer.append_all([4, 7, 4], [b"a", numbers, memoryview(b"c")])
    writer.append_all([], [])
    assert writer.appended == [(4, b"a"), (7, numbers.tobytes()), (4, b"c")]


@pytest.mark.parametrize(
    ("key_groups", "data", "error", "words"),
    [
        (
            [4, 8],
            [b"a", b"b"],
            ValueError,
            r"key group 8 is outside this writer's range \[4, 8\) of log 'op.kg4-8'",
        ),
        ([3], [b"a"], ValueError, r"key group 3 is outside"),
        ([4, 5.0], [b"a", b"b"], ValueError, r"key group 5.0 is outside"),
        ([4, 5], [b"a", "text"], TypeError, "state change data must be bytes-like, got str"),
        ([4, 5], [b"a", 7], TypeError, "bytes-like, got int"),
        ([4], [b"a", b"b"], ValueError, "append_all got 1 key groups for 2 changes"),
    ],
)
def test_the_default_append_all_refuses_a_bad_batch_before_appending_any(key_groups, data, error, words):
    writer = AppendsOnly()
    with pytest.raises(error, match=words):
        writer.append_all(key_groups, data)
    assert writer.appended == []
