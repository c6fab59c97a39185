"""Options that belong to dstl itself rather than to one storage."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..options import ConfigOption, OptionType

DEFAULT_STORAGE = "local"

CORE_OPTIONS = [
    ConfigOption(
        "dstl.storage",
        OptionType.STRING,
        DEFAULT_STORAGE,
        "Identifier of the changelog storage: local, filesystem, kafka, memory or a plugin's.",
    ),
]


@hookimpl
def dstl_config_options() -> list[ConfigOption]:
    """Declare dstl's own options."""
    return CORE_OPTIONS
