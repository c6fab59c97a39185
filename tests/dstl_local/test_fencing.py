"""Epoch files decide which writer owns a log: taken over under a lock, read back as untrusted."""

import os
import stat

import pytest

from dstl.local._private.fencing import EpochFile, OwnerCheck
from dstl.spi import ClosedError, FencedError, StorageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_takeover_writes_the_owner_record_and_a_lower_epoch_is_fenced_naming_both(tmp_path):
    epochs = EpochFile(tmp_path / "op.epoch")
    assert epochs.owner() is None
    epochs.take_over(5, "first")
    assert stat.S_IMODE(os.stat(epochs.path).st_mode) == 0o644 & ~_umask()
    assert epochs.owner() == (5, "first")
    with pytest.raises(FencedError, match=r"log 'op' already has a writer with epoch 5 > 3"):
        epochs.take_over(3, "late")
    epochs.take_over(6, "second")
    assert epochs.path.read_text() == "6 second\n"  # the whole record replaced
    assert EpochFile(tmp_path / "op.epoch").owner() == (6, "second")


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00 binary\n",  # not text
        "１２ token\n".encode(),  # digits, but not ASCII ones: int() would take them
        b"7\n",  # no token
        b"seven token\n",
    ],
    ids=["binary", "unicode-digits", "no-token", "no-epoch"],
)
def test_an_epoch_file_that_is_no_owner_record_stops_a_takeover(tmp_path, content):
    path = tmp_path / "op.epoch"
    path.write_bytes(content)
    with pytest.raises(StorageError, match=r"epoch file .* is damaged .* delete the file"):
        EpochFile(path).take_over(1, "new")
    assert path.read_bytes() == content, "a damaged epoch file was overwritten"
    assert EpochFile(path).owner() is None


def test_an_owner_check_sees_takeovers_and_a_replaced_file_and_refuses_after_close(tmp_path):
    epochs = EpochFile(tmp_path / "op.epoch")
    epochs.take_over(1, "mine")
    check = OwnerCheck(epochs)
    assert check.owner() == (1, "mine")
    epochs.take_over(2, "theirs")  # rewritten in place: the open descriptor sees it
    assert check.owner() == (2, "theirs")
    replacement = tmp_path / "other.epoch"
    replacement.write_text("1 mine\n")
    replacement.replace(epochs.path)  # another file at the path: no owner for this check
    assert check.owner() is None
    check.close()
    check.close()  # idempotent
    with pytest.raises(ClosedError, match=r"the writer of 'op' was closed while its persist waited"):
        check.owner()
