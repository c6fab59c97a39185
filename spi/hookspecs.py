"""Hook specifications of the ``dstl`` pluggy project.

Plugins are modules (or objects) exposing functions marked with
:data:`hookimpl`. Storages are found through the entry-point group
``dstl.storage``; other plugins (e.g. the state backend's options) through
``dstl.plugins``. Hooks are always called with keyword arguments; new arguments
are only ever added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .options import ConfigOption
    from .registry import StorageRegistry

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "dstl"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marker for hook implementations: ``@hookimpl def dstl_register_storages(registry): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def dstl_register_storages(registry: StorageRegistry) -> None:
    """Register the storages this plugin provides.

    Call ``registry.add(StorageSpec(...))`` once per storage. The spec names the
    identifier, a lazy factory (``"package.module:Class"``, so discovery never
    imports heavy dependencies), the config options and the capabilities.

    :param registry: the registry being built; identifiers must be unique.
    """


@hookspec
def dstl_config_options() -> list[ConfigOption]:
    """Declare configuration options that do not belong to one storage.

    :returns: the options (name, type, default, doc) this plugin reads.
    """
