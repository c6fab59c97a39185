"""Loading a checkpoint into a working state: its parts, snapshot chain and log, by key group."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dstl.spi import (
    ChangelogHandle,
    Config,
    KeyGroupRange,
    StateChangelogReader,
    StateChangelogStorage,
    storage_for_handle,
)

from ..delegate import StateDelegate
from .materializer import Materializer
from .replay import replay, visit
from .snapshot import BackendSnapshot

__all__ = ["Loader", "bulk_load"]

#: ``(state name, kind, stored format)`` of a registration found while loading.
Registered = Callable[[str, str, str], None]


@contextmanager
def bulk_load() -> Iterator[None]:
    """Pause the cyclic garbage collector while a restore creates millions of acyclic objects.

    Its passes scale with every live object of the process; during a bulk load they only
    cost time (nothing created here forms cycles).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class Loader:
    """Loads checkpoints into one backend's delegate, reading each handle from its own storage.

    :ivar storage: the backend's storage (handles of another storage open one, read-only).
    :ivar registered: called with every registration found.
    :ivar fork_from: replay forks per key group from this many bytes of log.
    """

    storage: StateChangelogStorage
    delegate: StateDelegate
    materializer: Materializer
    key_groups: KeyGroupRange
    registered: Registered
    fork_from: int

    def load(
        self,
        snapshot: BackendSnapshot,
        config: Config | Mapping[str, Any] | None,
        key_groups: KeyGroupRange | None = None,
    ) -> None:
        """The parts (each for the key groups it owned), then the chain and log, within ``key_groups``."""
        key_groups = key_groups or self.key_groups
        for owned, part in snapshot.parts:
            scope = owned.intersection(key_groups)
            if len(scope):
                self.load(part, config, scope)
        if snapshot.materialized or snapshot.handles:
            self._load_chain(snapshot, config, key_groups)

    def _load_chain(
        self, snapshot: BackendSnapshot, config: Config | Mapping[str, Any] | None, key_groups: KeyGroupRange
    ) -> None:
        def load_snapshots() -> None:
            # A key group a later snapshot replaces whole is not read from the earlier ones: at
            # large state, incrementals hold most key groups whole, and each would be loaded again.
            opened = [self.materializer.open(ref, key_groups) for ref in snapshot.materialized]
            replaced_later = [frozenset[int]()] * len(opened)
            for index in range(len(opened) - 2, -1, -1):
                replaced_later[index] = replaced_later[index + 1] | opened[index + 1].replaced
            for snapshot_file, skipped in zip(opened, replaced_later, strict=True):
                registrations = self.materializer.apply(snapshot_file, replaced_later=skipped)
                for name, (kind, serializer) in registrations.items():
                    self.registered(name, kind, serializer)

        with self.readers(snapshot.handles, config) as sources:
            replay(
                sources, key_groups, self.delegate, self.registered, load_snapshots, fork_from=self.fork_from
            )

    def changed_keys(
        self,
        handles: tuple[ChangelogHandle, ...],
        config: Config | Mapping[str, Any] | None,
        sink: Callable[[str, int, bytes], None],
    ) -> None:
        """``sink(state, key group, key)`` for every change in ``handles`` (for incrementals after resume)."""
        with self.readers(handles, config) as sources:
            for reader, handle in sources:
                visit(reader, handle, self.key_groups, sink, self.registered)

    @contextmanager
    def readers(
        self, handles: Iterable[ChangelogHandle], config: Config | Mapping[str, Any] | None
    ) -> Iterator[list[tuple[StateChangelogReader, ChangelogHandle]]]:
        """A reader for each handle, of its own storage: the backend's, or one opened read-only for it.

        Readers and opened storages are closed on exit.
        """
        opened: dict[str, StateChangelogStorage] = {}
        readers: dict[str, StateChangelogReader] = {}
        try:
            pairs = []
            for handle in handles:
                if handle.storage_id not in readers:
                    storage = self.storage
                    if handle.storage_id != storage.identifier:
                        storage = opened[handle.storage_id] = storage_for_handle(
                            handle, config, job_id="restore", read_only=True
                        )
                    readers[handle.storage_id] = storage.create_reader()
                pairs.append((readers[handle.storage_id], handle))
            yield pairs
        finally:
            for reader in readers.values():
                reader.close()
            for storage in opened.values():
                storage.close()
