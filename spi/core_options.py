"""Options that belong to dstl itself rather than to one storage."""

from __future__ import annotations

from typing import Any

from .kit.changeset_format import CHANGE_SET_CODECS
from .options import ConfigOption, OptionType

__all__ = [
    "COMPRESSION_OPTION",
    "CORE_OPTIONS",
    "DEFAULT_STORAGE",
    "READ_ONLY_KEY",
    "READ_ONLY_OPTION",
    "STORAGE_OPTION",
]

DEFAULT_STORAGE = "local"
#: The key that opens a storage read only (:func:`~dstl.spi.load_storage` ``read_only=True`` sets it).
READ_ONLY_KEY = "dstl.read-only"

STORAGE_OPTION: ConfigOption[str] = ConfigOption(
    "dstl.storage",
    OptionType.STRING,
    DEFAULT_STORAGE,
    "Identifier of the changelog storage: local, filesystem, kafka, memory or a plugin's.",
    aliases=("state.changelog.storage",),
)

COMPRESSION_OPTION: ConfigOption[str] = ConfigOption(
    "dstl.changelog.compression",
    OptionType.ENUM,
    CHANGE_SET_CODECS[0],
    "Compression of each change set a writer stores (a body is stored compressed only when that "
    "makes it smaller); readers understand every codec, whatever this says.",
    choices=CHANGE_SET_CODECS,
)

READ_ONLY_OPTION: ConfigOption[bool] = ConfigOption(
    READ_ONLY_KEY,
    OptionType.BOOL,
    False,
    "Open the storage only to read handles: it creates nothing (no directories, topics, locks, epoch "
    "claims or owner records) and refuses writers, discards and orphan collection. Read-only tools "
    "(inspect, savepoints, read_state, restore readers) open storages this way.",
)

CORE_OPTIONS: list[ConfigOption[Any]] = [
    STORAGE_OPTION,
    COMPRESSION_OPTION,
    READ_ONLY_OPTION,
]
