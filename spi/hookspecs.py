"""Hook specifications of the ``dstl`` pluggy project.

Plugins are modules (or objects) exposing functions marked with
:data:`hookimpl`. Storages are found through the entry-point group
``dstl.storage``; other plugins (e.g. the state backend's options) through
``dstl.plugins``. Hooks are always called with keyword arguments; new arguments
are only ever added.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from dstl.conformance import ConformanceBackdoor

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


@hookspec(firstresult=True)
def dstl_conformance_environment(
    identifier: str, workdir: Path
) -> AbstractContextManager[Mapping[str, str]] | None:
    """Start what storage ``identifier`` needs for a conformance run.

    Return a context manager that starts the backing service (a server, a bucket,
    a topic, a directory under ``workdir``), yields the config that points the
    storage at it, and stops it on exit. Return ``None`` for storages this plugin
    does not provide. Stops at first non-None result.

    :param identifier: the storage under test.
    :param workdir: a private directory for the run.
    :returns: a context manager yielding config keys, or ``None``.
    """


@hookspec(firstresult=True)
def dstl_conformance_backdoor(identifier: str) -> ConformanceBackdoor | None:
    """Give the conformance suite raw access to storage ``identifier``'s backing store.

    The backdoor bypasses the storage under test: it lists objects (capability
    ``leak_check``), damages stored bytes (``corruption_injection``) and names a
    config under which the backing service is unreachable (``failure_injection``).
    Stops at first non-None result.

    :returns: a :class:`dstl.conformance.ConformanceBackdoor`, or ``None``.
    """


@hookspec
def dstl_cli_commands(subparsers: Any) -> None:
    """Add subcommands to the ``dstl`` command line.

    Packages above the SPI (the backend, the conformance runner) bring their own
    commands this way, so ``dstl.spi`` imports nothing above it. Each subcommand sets
    ``run=function(args, console) -> exit code`` as its parser default.

    :param subparsers: the ``argparse`` sub-parsers action of ``dstl``.
    """
