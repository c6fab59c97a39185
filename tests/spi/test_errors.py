"""Error messages say what happened."""

import pytest

from dstl.spi import CorruptedError, FencedError


@pytest.mark.parametrize(
    ("owner", "says"),
    [
        (7, "fenced by a newer writer (epoch 7)"),
        (5, "another writer with the same epoch 5"),
        (1, "found an older epoch (1) owning its log"),
        (None, "owner record is gone, replaced or unreadable"),
    ],
)
def test_fenced_error_names_what_owns_the_log(owner, says):
    message = str(FencedError.by_owner("op.kg0-8", 5, owner))
    assert says in message and "'op.kg0-8'" in message and "epoch 5" in message
    if owner is not None and owner <= 5:
        assert "newer writer" not in message


@pytest.mark.parametrize("message", [None, "", 5])
def test_a_corrupted_error_must_say_what_is_damaged(message):
    with pytest.raises(TypeError, match="message"):
        CorruptedError(message, location="seg-1", offset=7)
    assert str(CorruptedError("checksum mismatch", location="seg-1", offset=7)) == (
        "checksum mismatch (seg-1 at offset 7)"
    )
