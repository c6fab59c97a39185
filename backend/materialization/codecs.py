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


def decompress(codec: int, stored: bytes, raw_length: int, *, where: str, offset: int) -> bytes:
    """``stored`` decompressed; it must come out exactly ``raw_length`` bytes long.

    :raises CorruptedError: on an unknown codec, undecodable data or another length.
    """
    try:
        if codec == CODEC_IDS["none"]:
            raw = stored
        elif codec == CODEC_IDS["zstd"]:
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_length)
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
    except Exception as exc:  # noqa: BLE001 - every codec error of damaged input is corruption
        msg = f"snapshot section does not decompress: {exc}"
        raise CorruptedError(msg, location=where, offset=offset) from exc
    if len(raw) != raw_length:
        msg = f"snapshot section decompresses to {len(raw)} bytes, its index says {raw_length}"
        raise CorruptedError(msg, location=where, offset=offset)
    return raw
