import pytest

from dstl.spi import CorruptedError, decode_change_set, encode_change_set, iter_change_sets

CHANGES = [(0, b"alpha"), (5, b""), (-1, b"meta"), (127, bytes(range(256)))]


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(compress):
    blob = encode_change_set("op.kg0-128", 3, 42, CHANGES, compress=compress)
    decoded = decode_change_set(blob, 0, location="x")
    assert (decoded.log_id, decoded.epoch, decoded.sqn) == ("op.kg0-128", 3, 42)
    assert decoded.changes == CHANGES
    assert decoded.stored_size == len(blob)


def test_back_to_back():
    blobs = [encode_change_set("l", 0, sqn, [(0, bytes([sqn]))]) for sqn in range(5)]
    assert [d.sqn for d in iter_change_sets(b"".join(blobs), location="x")] == list(range(5))


def test_every_single_bit_flip_is_detected():
    blob = bytearray(encode_change_set("log", 1, 2, [(0, b"abc"), (1, b"defgh")]))
    for index in range(len(blob)):
        for bit in range(8):
            damaged = bytearray(blob)
            damaged[index] ^= 1 << bit
            with pytest.raises(CorruptedError):
                decode_change_set(bytes(damaged), 0, location="obj")


def test_every_truncation_is_detected():
    blob = encode_change_set("log", 1, 2, [(0, b"abc" * 10)])
    for cut in range(len(blob)):
        with pytest.raises(CorruptedError) as info:
            decode_change_set(blob[:cut], 0, location="segment-7")
        assert info.value.location == "segment-7"
        assert info.value.offset == 0


def test_error_names_location_and_offset():
    first = encode_change_set("log", 0, 0, [(0, b"a")])
    second = bytearray(encode_change_set("log", 0, 1, [(0, b"b")]))
    second[-1] ^= 0xFF
    with pytest.raises(CorruptedError, match=rf"s3://bucket/obj at offset {len(first)}"):
        list(iter_change_sets(first + bytes(second), location="s3://bucket/obj"))
