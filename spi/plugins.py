"""Plugin discovery and storage loading.

Load order: hookspecs, then entry points (``dstl.storage``, ``dstl.plugins``; the
built-in storages register the same way as third-party ones), then the core
options, then ``check_pending()``. A plugin that fails to import is reported,
not fatal to the others.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from ._private import core_plugin
from .config import Config, use_declared_options
from .core_options import READ_ONLY_KEY, STORAGE_OPTION
from .errors import PluginError
from .handle import ChangelogHandle
from .names import validate_name
from .registry import StorageRegistry
from .storage import StateChangelogStorage

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV",
    "PLUGIN_ENTRY_POINT_GROUP",
    "get_plugin_manager",
    "get_registry",
    "load_storage",
    "refresh_plugins",
    "storage_for_handle",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dstl.storage"
PLUGIN_ENTRY_POINT_GROUP = "dstl.plugins"
#: Comma-separated modules to load as plugins in addition to entry points (like
#: PYTEST_PLUGINS); inherited by subprocesses, e.g. the conformance suite's.
PLUGINS_ENV = "DSTL_PLUGINS"


def _load_env_plugins(
    pm: pluggy.PluginManager, origins: dict[str, tuple[str, str]], broken: dict[str, str]
) -> None:
    for name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        if pm.has_plugin(name):
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            broken[name] = f"{PLUGINS_ENV}: {type(exc).__name__}: {exc}"
            log.warning("dstl plugin module %r from %s failed to load: %s", name, PLUGINS_ENV, exc)
            continue
        pm.register(module, name=name)
        origins[name] = (f"{PLUGINS_ENV}:{name}", "-")


def _load_entry_points(
    pm: pluggy.PluginManager, group: str, origins: dict[str, tuple[str, str]], broken: dict[str, str]
) -> None:
    for ep in metadata.entry_points(group=group):
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            continue
        dist = (ep.dist.name, ep.dist.version) if ep.dist is not None else ("?", "?")
        try:
            plugin = ep.load()
        except Exception as exc:
            broken[ep.name] = f"{dist[0]} {dist[1]}: {type(exc).__name__}: {exc}"
            log.warning("dstl plugin %r from %s failed to load: %s", ep.name, dist[0], exc)
            continue
        pm.register(plugin, name=ep.name)
        origins[ep.name] = dist


@functools.cache
def _discover() -> tuple[pluggy.PluginManager, StorageRegistry]:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    origins: dict[str, tuple[str, str]] = {}
    registry = StorageRegistry()
    _load_entry_points(pm, ENTRY_POINT_GROUP, origins, registry.broken)
    _load_entry_points(pm, PLUGIN_ENTRY_POINT_GROUP, origins, registry.broken)
    _load_env_plugins(pm, origins, registry.broken)
    pm.register(core_plugin, name="dstl.core")
    origins["dstl.core"] = _own_distribution()
    pm.check_pending()
    # Call each implementation on its own so the registry knows which
    # distribution declared which storage (shown by `dstl storages`).
    for impl in pm.hook.dstl_register_storages.get_hookimpls():
        registry.set_origin(*origins.get(pm.get_name(impl.plugin) or "", ("?", "?")))
        impl.function(registry=registry)
    for options in pm.hook.dstl_config_options():
        registry.add_options(options)
    registry.options()  # fail early on conflicting declarations
    return pm, registry


def _own_distribution() -> tuple[str, str]:
    try:
        return "dstl", metadata.version("dstl")
    except metadata.PackageNotFoundError:
        return "dstl", "unknown"


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, discovered once."""
    return _discover()[0]


def get_registry() -> StorageRegistry:
    """The process-wide storage registry, discovered once."""
    return _discover()[1]


use_declared_options(lambda: get_registry().options())


def refresh_plugins() -> None:
    """Forget discovered plugins; the next lookup scans entry points again."""
    _discover.cache_clear()


def load_storage(
    config: Config | Mapping[str, Any] | None = None, *, job_id: str, read_only: bool = False
) -> StateChangelogStorage:
    """Create the storage named by ``dstl.storage`` for ``job_id``.

    :param read_only: open it only to read handles (``dstl.read-only``): it creates
        nothing where the storage keeps data, and refuses writers and deletions.

    :raises UnknownStorageError: listing the installed identifiers.
    :raises ConfigError: on unknown keys or bad values.
    :raises PluginError: when the storage's dependencies are not installed.
    """
    cfg = _read_only(Config.of(config), read_only)
    validate_name(job_id, "job id")
    return get_registry().get(cfg.get(STORAGE_OPTION)).create(cfg, job_id)


def storage_for_handle(
    handle: ChangelogHandle,
    config: Config | Mapping[str, Any] | None = None,
    *,
    job_id: str = "restore",
    read_only: bool = False,
) -> StateChangelogStorage:
    """Create the storage that can read ``handle``: chosen by ``handle.storage_id``.

    The current ``dstl.storage`` does not matter, so a job can switch storage
    between runs and still restore what the previous run wrote. ``read_only`` as
    for :func:`load_storage`: what only reads a handle should open it so.
    """
    if not isinstance(handle, ChangelogHandle):
        msg = f"expected a ChangelogHandle, got {type(handle).__name__}"
        raise PluginError(msg)
    cfg = _read_only(Config.of(config), read_only)
    validate_name(job_id, "job id")
    return get_registry().get(handle.storage_id).create(cfg, job_id)


def _read_only(config: Config, read_only: bool) -> Config:
    return config.with_values({READ_ONLY_KEY: True}) if read_only else config
