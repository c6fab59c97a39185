"""Configuration options of the ``local`` storage."""

from __future__ import annotations

from dstl.spi import ConfigOption, OptionType, UnderCheckpoint, parse_size

__all__ = [
    "DIR",
    "FSYNC",
    "LOCAL_OPTIONS",
    "SEGMENT_SIZE",
]

DIR: ConfigOption[str | None] = ConfigOption(
    "dstl.local.dir",
    OptionType.STRING,
    None,
    "Directory on a local disk holding the segment files (one sub-directory per job). Required.",
    under_checkpoint=UnderCheckpoint("dstl-changelog"),
)

SEGMENT_SIZE: ConfigOption[int] = ConfigOption(
    "dstl.local.segment-size",
    OptionType.SIZE,
    parse_size("64mb"),
    "Size at which a segment file is sealed and a new one started.",
    minimum=4096,
)

FSYNC: ConfigOption[bool] = ConfigOption(
    "dstl.local.fsync",
    OptionType.BOOL,
    True,
    "fsync each persist batch (group commit); false trades durability on power loss for speed.",
)

LOCAL_OPTIONS = (
    DIR,
    SEGMENT_SIZE,
    FSYNC,
)
