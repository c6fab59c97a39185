"""dstl's service provider interface: the contract every changelog storage keeps.

Types, abstract storage/writer/reader, the changelog handle, errors, config and
plugin discovery: what an engine uses. Storages are found through the entry-point
group ``dstl.storage`` and chosen with ``dstl.storage``. What storage authors build
on (change-set base classes, the stored format, durability and futures helpers) is
:mod:`dstl.spi.kit`.
"""

from __future__ import annotations

import warnings
from typing import Any

from .config import Config
from .core_options import STORAGE_OPTION
from .errors import (
    ClosedError,
    ConfigError,
    CorruptedError,
    DstlError,
    FencedError,
    InvalidHandleError,
    InvalidIdentifierError,
    JobConflictError,
    PluginError,
    ReadOnlyError,
    StorageError,
    TruncatedError,
    UnknownStorageError,
)
from .handle import HANDLE_SCHEMA_VERSION, ChangelogHandle
from .hookspecs import hookimpl
from .metrics import REQUIRED_COUNTERS, StorageMetrics
from .names import log_id_for, validate_name
from .options import ConfigOption, OptionType, UnderCheckpoint, parse_duration, parse_size
from .plugins import get_registry, load_storage, refresh_plugins, storage_for_handle
from .reader import StateChangelogReader
from .registry import KNOWN_CAPABILITIES, StorageRegistry, StorageSpec
from .storage import StateChangelogStorage
from .types import META_KEY_GROUP, KeyGroupRange, SequenceNumberRange, StateChange
from .writer import StateChangelogWriter

__all__ = [
    "HANDLE_SCHEMA_VERSION",
    "KNOWN_CAPABILITIES",
    "META_KEY_GROUP",
    "REQUIRED_COUNTERS",
    "STORAGE_OPTION",
    "ChangelogHandle",
    "ClosedError",
    "Config",
    "ConfigError",
    "ConfigOption",
    "CorruptedError",
    "DstlError",
    "FencedError",
    "InvalidHandleError",
    "InvalidIdentifierError",
    "JobConflictError",
    "KeyGroupRange",
    "OptionType",
    "PluginError",
    "ReadOnlyError",
    "SequenceNumberRange",
    "StateChange",
    "StateChangelogReader",
    "StateChangelogStorage",
    "StateChangelogWriter",
    "StorageError",
    "StorageMetrics",
    "StorageRegistry",
    "StorageSpec",
    "TruncatedError",
    "UnderCheckpoint",
    "UnknownStorageError",
    "get_registry",
    "hookimpl",
    "load_storage",
    "log_id_for",
    "parse_duration",
    "parse_size",
    "refresh_plugins",
    "storage_for_handle",
    "validate_name",
]

#: Names that moved to the storage authors' kit; importing them from here still works, with a warning.
_MOVED_TO_KIT = frozenset(
    {
        "ChangeSet",
        "ChangeSetReader",
        "ChangeSetStorage",
        "ChangeSetWriter",
        "DecodedChangeSet",
        "FetchedChangeSet",
        "LocationField",
        "StoragePlugin",
        "WriterState",
        "check_relative_path",
        "checked_locations",
        "decode_change_set",
        "decode_fetched",
        "encode_change_set",
        "iter_change_sets",
    }
)


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_KIT:
        from . import kit

        message = f"import {name} from dstl.spi.kit (dstl.spi is the engine contract)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return getattr(kit, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
