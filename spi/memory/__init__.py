"""The in-memory reference storage (identifier ``memory``).

Keeps the whole writer contract in process memory, with the same checksummed
change-set format the durable storages use. Data lives in named namespaces
(``dstl.memory.namespace``) shared by every storage instance of the process, so a
fresh instance can read what another one wrote; nothing survives the process.
"""

from __future__ import annotations

from ._private.storage import (
    MemoryStorage,
    MemoryStorageReader,
    MemoryWriter,
    namespace_objects,
    private_storage,
)
from .options import MEMORY_OPTIONS

#: the same surface as every storage package: options, storage, reader, writer
MemoryReader = MemoryStorageReader

__all__ = [
    "MEMORY_OPTIONS",
    "MemoryReader",
    "MemoryStorage",
    "MemoryStorageReader",
    "MemoryWriter",
    "namespace_objects",
    "private_storage",
]
