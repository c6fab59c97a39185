import os
import struct
import zlib

import google_crc32c
import pytest
import zstandard

from dstl.spi import CorruptedError
from dstl.spi.kit import change_set_identity, decode_change_set, encode_change_set, iter_change_sets

CHANGES = [(0, b"alpha"), (5, b""), (-1, b"meta"), (127, bytes(range(256)))]
COMPRESSIBLE = [(kg % 8, b"key-%05d value " % kg * 4) for kg in range(500)]


def _framed(
    body: bytes, flags: int, count: int, log_id: bytes = b"log", *, magic: bytes = b"DSTC", version: int = 1
) -> bytes:
    """A change set framed by hand, from the layout the module documents (the backdoor)."""
    header = struct.pack("<4sBBHQQII", magic, version, flags, len(log_id), 1, 2, count, len(body))
    crc = google_crc32c.extend(google_crc32c.extend(google_crc32c.value(header), log_id), body)
    return header + struct.pack("<I", crc) + log_id + body


def _plain_body(changes) -> bytes:
    return b"".join(struct.pack("<iI", kg, len(data)) + data for kg, data in changes)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_round_trip(codec):
    blob = encode_change_set("op.kg0-128", 3, 42, CHANGES, codec=codec)
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


def test_zstd_stores_compressible_changes_smaller_and_incompressible_ones_plain():
    plain = encode_change_set("log", 0, 0, COMPRESSIBLE, codec="none")
    packed = encode_change_set("log", 0, 0, COMPRESSIBLE, codec="zstd")
    assert len(packed) * 10 < len(plain)
    assert decode_change_set(packed, 0, location="x").changes == COMPRESSIBLE
    noise = [(0, os.urandom(4096))]
    assert len(encode_change_set("log", 0, 0, noise, codec="zstd")) == len(
        encode_change_set("log", 0, 0, noise, codec="none")
    ), "a body that does not shrink is stored plain"


def test_an_unknown_codec_is_refused_by_name():
    with pytest.raises(ValueError) as refused:
        encode_change_set("log", 0, 0, CHANGES, codec="lzma")
    assert str(refused.value) == "unknown change-set codec 'lzma': one of zstd, none"


def test_zlib_bodies_of_earlier_releases_are_still_read():
    blob = _framed(zlib.compress(_plain_body(CHANGES), 1), flags=1, count=len(CHANGES))
    assert decode_change_set(blob, 0, location="x").changes == CHANGES


def test_a_zstd_body_without_a_declared_size_is_refused():
    body = zstandard.ZstdCompressor(write_content_size=False).compress(_plain_body(CHANGES))
    with pytest.raises(CorruptedError, match="declares no usable content size"):
        decode_change_set(_framed(body, flags=2, count=len(CHANGES)), 0, location="x")


def _declaring(frame: bytes, size: int) -> bytes:
    """``frame`` with its Frame_Content_Size field rewritten to ``size`` (RFC 8878, 3.1.1.1)."""
    descriptor = frame[4]
    single_segment = (descriptor >> 5) & 1
    fcs_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
    assert fcs_bytes == 4, "the test frame is expected to use a 4-byte size field"
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    return frame[:at] + struct.pack("<I", size) + frame[at + 4 :]


def test_a_zstd_body_larger_than_it_declares_is_refused():
    """A checksummed frame is not a trusted one: its declared size bounds what is inflated."""
    body = _plain_body([(0, b"\0" * (64 << 20))])
    forged = _declaring(zstandard.ZstdCompressor().compress(body), 1 << 16)
    assert zstandard.frame_content_size(forged) == 1 << 16
    with pytest.raises(CorruptedError, match="undecodable"):
        decode_change_set(_framed(forged, flags=2, count=1), 0, location="x")


def test_a_small_zstd_frame_declaring_gigabytes_is_refused_without_allocating_them():
    import tracemalloc

    forged = _declaring(zstandard.ZstdCompressor().compress(_plain_body([(0, b"\0" * (1 << 20))])), 3 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptedError, match="undecodable"):
            decode_change_set(_framed(forged, flags=2, count=1), 0, location="x")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak} bytes allocated for a frame holding 1 MiB"


# -- refusals, word for word: what a user reads names what is damaged and where -------------------

GOOD = encode_change_set("log", 1, 2, [(0, b"abc")])
DAMAGED = GOOD[:-1] + bytes([GOOD[-1] ^ 1])
ONE = _plain_body([(0, b"a")])
LARGE = [(kg % 8, b"key-%05d value " % kg * 4) for kg in range(2000)]
BODY = _plain_body(LARGE)  # over 64 KiB: zstd writes a 4-byte size field
PACKED = zstandard.ZstdCompressor().compress(BODY)
UNDECODABLE = "change set undecodable after checksum: "
REFUSALS = {
    "empty": (b"", "change set header truncated"),
    "bad magic": (_framed(ONE, 0, 1, magic=b"XXXX"), "bad change-set magic"),
    "newer version": (_framed(ONE, 0, 1, version=9), "unsupported change-set version 9"),
    "cut body": (GOOD[:-2], "change set truncated"),
    "damaged": (DAMAGED, "change-set checksum mismatch"),
    "unknown flags": (_framed(ONE, 0x40, 1), "unknown change-set flags 0x40 (a codec of a newer release?)"),
    "short body": (_framed(b"", 0, 1), "change-set body shorter than its change count"),
    "long change": (
        _framed(struct.pack("<iI", 0, 99) + b"a", 0, 1),
        "change length runs past the change-set body",
    ),
    "trailing": (_framed(ONE + b"zz", 0, 1), "trailing bytes in change-set body"),
    "zstd without size": (
        _framed(zstandard.ZstdCompressor(write_content_size=False).compress(ONE), 2, 1),
        UNDECODABLE + "zstd frame declares no usable content size (-1)",
    ),
    "zstd bomb": (
        _framed(_declaring(PACKED, 1 << 26), 2, len(LARGE)),
        UNDECODABLE + f"zstd frame of {len(PACKED)} bytes declares 67108864: more than 256 times its size, "
        "which no writer stores (a decompression bomb)",
    ),
    "zlib with trailing bytes": (
        _framed(zlib.compress(ONE) + b"!!", 1, 1),
        UNDECODABLE + "2 bytes follow the zlib stream",
    ),
    "zlib cut short": (
        _framed(zlib.compress(ONE * 50)[:-6], 1, 50),
        UNDECODABLE + "zlib stream longer than a change-set body may be, or cut short",
    ),
}


@pytest.mark.parametrize(("data", "message"), REFUSALS.values(), ids=REFUSALS.keys())
def test_each_refusal_says_what_is_damaged_and_where(data, message):
    with pytest.raises(CorruptedError) as refused:
        decode_change_set(data, 0, location="s3://b/o")
    assert str(refused.value) == f"{message} (s3://b/o at offset 0)"


def test_a_refusal_inside_an_object_names_the_offset_in_the_object():
    with pytest.raises(CorruptedError) as refused:
        decode_change_set(DAMAGED, 0, location="seg-3", base_offset=4096)
    assert str(refused.value) == "change-set checksum mismatch (seg-3 at offset 4096)"


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"DSTC", "change set header truncated (seg at offset 8)"),
        (b"\0" * 64, "no change-set header (seg at offset 8)"),
        (GOOD[:38], "change set header truncated in its log id (seg at offset 8)"),
    ],
)
def test_header_checks_say_what_is_missing(head, message):
    with pytest.raises(CorruptedError) as refused:
        change_set_identity(head, location="seg", offset=8)
    assert str(refused.value) == message


def test_an_identity_says_how_it_differs_from_what_a_handle_names():
    identity = change_set_identity(GOOD, location="x")
    assert (identity.log_id, identity.epoch, identity.sqn) == ("log", 1, 2)
    assert identity.differs_from("log", 1, 2) is None
    assert identity.differs_from("log", 1) is None, "a handle recording no SQN is not compared on it"
    assert identity.differs_from("other", 1, 2) == "it belongs to log 'log', not 'other'"
    assert identity.differs_from("log", 3, 2) == "it was written with epoch 1, not 3"
    assert identity.differs_from("log", 1, 7) == "it holds SQN 2, not 7"


def test_an_identity_reads_a_log_id_that_is_not_utf8_without_failing():
    head = _framed(ONE, 0, 1, log_id=b"\xfflog")
    assert change_set_identity(head, location="x").log_id == "\ufffdlog"
    with pytest.raises(CorruptedError) as refused:
        change_set_identity(b"DSTC", location="seg")
    assert str(refused.value) == "change set header truncated (seg at offset 0)"


def test_a_zstd_body_of_two_chunks_reads_back_whole():
    changes = [(kg % 8, b"%07d" % kg * 40) for kg in range(5_000)]  # 1.44 MB: two 1 MiB reads
    blob = encode_change_set("log", 0, 0, changes, codec="zstd")
    assert len(blob) < 1 << 20
    assert decode_change_set(blob, 0, location="x").changes == changes


def test_the_decompression_bomb_bound_is_256_times_the_stored_size():
    at_bound = _framed(_declaring(PACKED, len(PACKED) * 256), 2, len(LARGE))
    with pytest.raises(CorruptedError) as refused:
        decode_change_set(at_bound, 0, location="x")
    assert "decompression bomb" not in str(refused.value), "a frame declaring 256x its size is allowed"
    over = _framed(_declaring(PACKED, len(PACKED) * 256 + 1), 2, len(LARGE))
    with pytest.raises(CorruptedError, match="decompression bomb"):
        decode_change_set(over, 0, location="x")
