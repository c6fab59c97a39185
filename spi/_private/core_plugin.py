"""Options that belong to dstl itself rather than to one storage."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..kit.changeset_format import CHANGE_SET_CODECS
from ..options import ConfigOption, OptionType

DEFAULT_STORAGE = "local"
#: The key that opens a storage read only (:func:`~dstl.spi.load_storage` ``read_only=True`` sets it).
READ_ONLY_KEY = "dstl.read-only"

CORE_OPTIONS = [
    ConfigOption(
        "dstl.storage",
        OptionType.STRING,
        DEFAULT_STORAGE,
        "Identifier of the changelog storage: local, filesystem, kafka, memory or a plugin's.",
        aliases=("state.changelog.storage",),
    ),
    ConfigOption(
        "dstl.changelog.compression",
        OptionType.ENUM,
        CHANGE_SET_CODECS[0],
        "Compression of each change set a writer stores (a body is stored compressed only when that "
        "makes it smaller); readers understand every codec, whatever this says.",
        choices=CHANGE_SET_CODECS,
    ),
    ConfigOption(
        READ_ONLY_KEY,
        OptionType.BOOL,
        False,
        "Open the storage only to read handles: it creates nothing (no directories, topics, locks, epoch "
        "claims or owner records) and refuses writers, discards and orphan collection. Read-only tools "
        "(inspect, savepoints, read_state, restore readers) open storages this way.",
    ),
]


@hookimpl
def dstl_config_options() -> list[ConfigOption]:
    """Declare dstl's own options."""
    return CORE_OPTIONS
