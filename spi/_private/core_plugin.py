"""Options that belong to dstl itself rather than to one storage."""

from __future__ import annotations

from ..core_options import CORE_OPTIONS
from ..hookspecs import hookimpl
from ..options import ConfigOption


@hookimpl
def dstl_config_options() -> list[ConfigOption]:
    """Declare dstl's own options."""
    return CORE_OPTIONS
