"""Section compression of snapshot objects: the codec ids the format stores, one place.

Each section is compressed on its own, so a restore of some key groups still
reads only their sections. Decompression is bounded by the section's recorded
raw length, so a damaged or forged section cannot expand without limit.
"""

from __future__ import annotations

from collections.abc import Callable

from dstl.spi import CorruptedError

__all__ = ["CODEC_IDS", "CODEC_NAMES", "compressor", "decompress"]

#: Codec name -> id stored in the snapshot's preamble.
CODEC_IDS = {"none": 0, "zstd": 1, "lz4": 2}
CODEC_NAMES = {number: name for name, number in CODEC_IDS.items()}


def compressor(name: str) -> Callable[[bytes], bytes]:
    """The compression function of codec ``name``."""
    if name == "none":
        return bytes
    if name == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=1).compress
    if name == "lz4":
        import lz4.frame

        return lz4.frame.compress
    msg = f"unknown snapshot codec {name!r}: one of {sorted(CODEC_IDS)}"
    raise ValueError(msg)


def _zstd_bounded(stored: bytes, raw_length: int) -> bytes:
    """At most ``raw_length + 1`` bytes of the zstd frame in ``stored``, whatever its header claims.

    ``ZstdDecompressor.decompress`` trusts a frame's declared content size over
    ``max_output_size``, so a forged frame could make it allocate anything; a
    stream read stops at the bound.
    """
    import io

    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored), read_across_frames=False)
    parts, wanted = [], raw_length + 1  # one byte more shows a frame longer than recorded
    while wanted > 0:
        part = reader.read(wanted)
        if not part:
            break
        parts.append(part)
        wanted -= len(part)
    return b"".join(parts)


def decompress(codec: int, stored: bytes, raw_length: int, *, where: str, offset: int) -> bytes:
    """``stored`` decompressed; it must come out exactly ``raw_length`` bytes long.

    :raises CorruptedError: on an unknown codec, undecodable data or another length.
    """
    try:
        if codec == CODEC_IDS["none"]:
            raw = stored
        elif codec == CODEC_IDS["zstd"]:
            raw = _zstd_bounded(stored, raw_length)
        elif codec == CODEC_IDS["lz4"]:
            import lz4.frame

            decompressor = lz4.frame.LZ4FrameDecompressor()
            raw = decompressor.decompress(stored, max_length=raw_length)
            if not decompressor.eof:
                raw = b""  # more than the recorded length: refused below
        else:
            msg = f"snapshot section uses unknown codec id {codec}"
            raise CorruptedError(msg, location=where, offset=offset)
    except CorruptedError:
        raise
    except Exception as exc:
        msg = f"snapshot section does not decompress: {exc}"
        raise CorruptedError(msg, location=where, offset=offset) from exc
    if len(raw) != raw_length:
        msg = f"snapshot section decompresses to {len(raw)} bytes, its index says {raw_length}"
        raise CorruptedError(msg, location=where, offset=offset)
    return raw
