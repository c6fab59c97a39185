"""dstl's service provider interface: the contract every changelog storage keeps.

Types, abstract storage/writer/reader, the changelog handle, errors, config and
plugin discovery. Storages are found through the entry-point group
``dstl.storage`` and chosen with ``dstl.storage``.
"""

from __future__ import annotations

from .changeset_format import DecodedChangeSet, decode_change_set, encode_change_set, iter_change_sets
from .changeset_reader import (
    ChangeSetReader,
    FetchedChangeSet,
    LocationField,
    checked_locations,
    decode_fetched,
)
from .changeset_storage import ChangeSetStorage
from .changeset_writer import ChangeSet, ChangeSetWriter, WriterState, log_id_for
from .config import Config
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
from .names import check_relative_path, validate_name
from .options import ConfigOption, OptionType, UnderCheckpoint, parse_duration, parse_size
from .plugins import get_registry, load_storage, refresh_plugins, storage_for_handle
from .reader import StateChangelogReader
from .registry import KNOWN_CAPABILITIES, StorageRegistry, StorageSpec
from .storage import StateChangelogStorage
from .storage_plugin import StoragePlugin
from .types import META_KEY_GROUP, KeyGroupRange, SequenceNumberRange, StateChange
from .writer import StateChangelogWriter

__all__ = [
    "HANDLE_SCHEMA_VERSION",
    "KNOWN_CAPABILITIES",
    "META_KEY_GROUP",
    "REQUIRED_COUNTERS",
    "ChangeSet",
    "ChangeSetReader",
    "ChangeSetStorage",
    "ChangeSetWriter",
    "ChangelogHandle",
    "ClosedError",
    "Config",
    "ConfigError",
    "ConfigOption",
    "CorruptedError",
    "DecodedChangeSet",
    "DstlError",
    "FetchedChangeSet",
    "LocationField",
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
    "StoragePlugin",
    "TruncatedError",
    "UnderCheckpoint",
    "UnknownStorageError",
    "WriterState",
    "check_relative_path",
    "checked_locations",
    "decode_change_set",
    "decode_fetched",
    "encode_change_set",
    "get_registry",
    "hookimpl",
    "iter_change_sets",
    "load_storage",
    "log_id_for",
    "parse_duration",
    "parse_size",
    "refresh_plugins",
    "storage_for_handle",
    "validate_name",
]
