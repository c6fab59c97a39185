"""Record layout: one change set = one or more chunk records with identifying headers.

A data partition also holds claim markers (``dstl.claim`` header, no chunk
header), which readers skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dstl.spi.kit.changeset_reader import LocationField

#: What a handle's location holds: the records ``first..last`` of ``topic[partition]``
#: (besides ``sqn``); ``writer`` tells apart attempts of the same epoch.
LOCATION_FIELDS = {
    "topic": LocationField(str),
    "partition": LocationField(int, 0, (1 << 31) - 1),
    "first": LocationField(int),
    "last": LocationField(int),
    "writer": LocationField(str, required=False),
}

HEADER_LOG = "dstl.log"
HEADER_EPOCH = "dstl.epoch"
HEADER_WRITER = "dstl.writer"
HEADER_SQN = "dstl.sqn"
HEADER_CHUNK = "dstl.chunk"  # "<index>/<count>"
HEADER_CLAIM = "dstl.claim"  # on claim markers, which carry no chunk header (readers skip them)


def chunks(blob: bytes, size: int) -> list[bytes]:
    """``blob`` cut into pieces of at most ``size`` bytes (at least one piece)."""
    return [blob[i : i + size] for i in range(0, len(blob), size)] or [b""]


def headers(
    log_id: str, epoch: int, writer: str, sqn: int, index: int, count: int
) -> list[tuple[str, bytes]]:
    """Headers of chunk ``index`` of ``count`` of change set ``sqn``."""
    return [
        (HEADER_LOG, log_id.encode()),
        (HEADER_EPOCH, str(epoch).encode()),
        (HEADER_WRITER, writer.encode()),
        (HEADER_SQN, str(sqn).encode()),
        (HEADER_CHUNK, f"{index}/{count}".encode()),
    ]


def claim_headers(log_id: str, epoch: int, writer: str) -> list[tuple[str, bytes]]:
    """Headers of the marker a claim leaves in its log's data partition."""
    return [
        (HEADER_LOG, log_id.encode()),
        (HEADER_EPOCH, str(epoch).encode()),
        (HEADER_CLAIM, writer.encode()),
    ]


@dataclass(frozen=True)
class ChunkId:
    """What a record's headers say it is."""

    log_id: str
    epoch: int
    writer: str
    sqn: int
    index: int
    count: int

    @classmethod
    def parse(cls, raw: Any) -> ChunkId | None:
        """Parse record headers; ``None`` for records that are not dstl chunks (any other form too)."""
        pairs = raw.items() if isinstance(raw, dict) else (raw or [])
        values = {k: v for k, v in pairs if isinstance(v, bytes)}
        try:
            index, _, count = values[HEADER_CHUNK].decode().partition("/")
            return cls(
                values[HEADER_LOG].decode(),
                int(values[HEADER_EPOCH]),
                values[HEADER_WRITER].decode(),
                int(values[HEADER_SQN]),
                int(index),
                int(count),
            )
        except (KeyError, ValueError, UnicodeDecodeError):
            return None
