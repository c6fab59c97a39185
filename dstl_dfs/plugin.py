"""Declares the ``dstl.dfs.*`` options (entry point ``dstl.plugins: dfs``)."""

from __future__ import annotations

from dstl.spi import ConfigOption, hookimpl

from .options import DFS_OPTIONS


@hookimpl
def dstl_config_options() -> list[ConfigOption]:
    """Declare the DFS storage's options."""
    return list(DFS_OPTIONS)
