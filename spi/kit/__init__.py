"""The storage authors' kit: base classes and helpers that make a storage a few hundred lines.

Not the engine contract (that is :mod:`dstl.spi`): what the built-in storages share
and a third-party storage may build on.

- :class:`ChangeSetStorage`, :class:`ChangeSetWriter`, :class:`ChangeSetReader`:
  writer bookkeeping, SQN rules, reuse of uploads, confirm/reset, fencing hooks,
  verified reads; a storage implements the upload and the fetch;
- the stored change-set format (framing, checksums, compression, bounds);
- :func:`fsync_directory` (durability), :func:`mapped` / :func:`when_all` (futures),
  :class:`StoragePlugin` (the plugin hooks of a storage from its spec).
"""

from __future__ import annotations

from ..handle import Location, LocationValue
from ..names import MAX_NAME_LENGTH, check_relative_path
from ..storage_plugin import StoragePlugin
from .changeset_format import (
    CHANGE_ITEM,
    CHANGE_SET_CODECS,
    CHANGE_SET_HEADER_SIZE,
    MAX_COMPRESSION_RATIO,
    ChangeSetIdentity,
    DecodedChangeSet,
    change_set_identity,
    decode_body,
    decode_change_set,
    encode_change_set,
    forge_change_set,
    frame_change_set,
    framed_size,
    iter_change_sets,
)
from .changeset_reader import (
    OFFSET_LENGTH_FIELDS,
    ChangeSetReader,
    FetchedChangeSet,
    LocationField,
    checked_locations,
    decode_fetched,
)
from .changeset_storage import ChangeSetStorage, storage_settings
from .changeset_writer import ChangeSet, ChangeSetWriter, WriterHost, WriterState
from .durability import fsync_directory
from .futures import mapped, when_all

__all__ = [
    "CHANGE_ITEM",
    "CHANGE_SET_CODECS",
    "CHANGE_SET_HEADER_SIZE",
    "MAX_COMPRESSION_RATIO",
    "MAX_NAME_LENGTH",
    "OFFSET_LENGTH_FIELDS",
    "ChangeSet",
    "ChangeSetIdentity",
    "ChangeSetReader",
    "ChangeSetStorage",
    "ChangeSetWriter",
    "DecodedChangeSet",
    "FetchedChangeSet",
    "Location",
    "LocationField",
    "LocationValue",
    "StoragePlugin",
    "WriterHost",
    "WriterState",
    "change_set_identity",
    "check_relative_path",
    "checked_locations",
    "decode_body",
    "decode_change_set",
    "decode_fetched",
    "encode_change_set",
    "forge_change_set",
    "fsync_directory",
    "frame_change_set",
    "framed_size",
    "iter_change_sets",
    "mapped",
    "storage_settings",
    "when_all",
]
