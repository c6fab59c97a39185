"""Deliberately broken storages: each breaks one property the suite must catch.

Loaded with ``dstl conformance ID --plugin tests.conformance.broken_storages``.
Each is the memory storage (or a small file storage) with one realistic bug.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path

from dstl.spi import (
    ConfigOption,
    CorruptedError,
    OptionType,
    StateChange,
    StorageRegistry,
    StorageSpec,
    hookimpl,
)
from dstl.spi.changeset_format import iter_change_sets
from dstl.spi.memory import MemoryStorage, MemoryStorageReader, MemoryWriter
from dstl.spi.memory._private.conformance import MemoryBackdoor

MEMORY_CAPABILITIES = frozenset({"fencing", "physical_truncation", "leak_check", "corruption_injection"})


class DropsLastWriter(MemoryWriter):
    """Bug: an off-by-one drops the last change of every change set on upload."""

    def _upload(self, change_sets, checkpoint_id):
        for cs in change_sets:
            cs.changes = cs.changes[:-1]
        return super()._upload(change_sets, checkpoint_id)


class DropsLastStorage(MemoryStorage):
    writer_class = DropsLastWriter
    storage_id = "broken-drops-last"


class WholeObjectReader(MemoryStorageReader):
    """Bug: reads every change set of an object a location points into."""

    def read(self, handle, key_groups=None):
        ns = self._storage._ns
        names = dict.fromkeys(str(loc["object"]) for loc in handle.location_dicts)
        for name in names:
            with ns.lock:
                data = bytes(ns.objects[name])
            for decoded in iter_change_sets(data, location=name):
                for kg, change in decoded.changes:
                    if key_groups is None or kg < 0 or kg in key_groups:
                        yield StateChange(kg, change, decoded.sqn)


class BelowStartStorage(MemoryStorage):
    reader_class = WholeObjectReader
    storage_id = "broken-below-start"


class IgnoresTruncationWriter(MemoryWriter):
    """Bug: truncate() forgets to move the truncation point."""

    def truncate(self, before_sqn):
        pass


class IgnoresTruncationStorage(MemoryStorage):
    writer_class = IgnoresTruncationWriter
    storage_id = "broken-ignores-truncation"


class NoFencingStorage(MemoryStorage):
    """Bug: every writer believes it owns the log."""

    storage_id = "broken-no-fencing"

    def create_writer(self, operator_id, key_groups, *, epoch=0):
        writer = super().create_writer(operator_id, key_groups, epoch=epoch)
        with self._ns.lock:
            self._ns.owners.pop((self.job_id, writer.log_id), None)
        writer._owner_check_disabled = True
        return writer

    class writer_class(MemoryWriter):  # noqa: N801
        def _upload(self, change_sets, checkpoint_id):
            with self._storage._ns.lock:
                self._storage._ns.owners[(self._storage.job_id, self.log_id)] = (self.epoch, self._token)
            return super()._upload(change_sets, checkpoint_id)


class SkipsCorruptReader(MemoryStorageReader):
    """Bug: a damaged change set is skipped instead of reported."""

    def read(self, handle, key_groups=None):
        iterator = super().read(handle, key_groups)
        while True:
            try:
                yield next(iterator)
            except StopIteration:
                return
            except CorruptedError:
                return


class HidesCorruptionStorage(MemoryStorage):
    reader_class = SkipsCorruptReader
    storage_id = "broken-hides-corruption"


# -- a file storage that acknowledges persists before the bytes reach a file -----------------
_PENDING: dict[str, bytes] = {}
_PENDING_LOCK = threading.Lock()
_WRITE_BEHIND_SECONDS = 5.0


class WriteBehindWriter(MemoryWriter):
    """Bug: completes the persist first and writes the file seconds later."""

    def _upload(self, change_sets, checkpoint_id):
        future = super()._upload(change_sets, checkpoint_id)
        locations = future.result()
        directory = Path(self._storage._config["dstl.lazyfile.dir"])
        for loc in locations:
            name = str(loc["object"])
            with self._storage._ns.lock:
                blob = bytes(self._storage._ns.objects[name])
            with _PENDING_LOCK:
                _PENDING[name] = blob

            def write_later(name=name, blob=blob):
                time.sleep(_WRITE_BEHIND_SECONDS)
                target = directory / name.replace("/", "__")
                target.write_bytes(blob)

            threading.Thread(target=write_later, daemon=True).start()
        return future


class WriteBehindReader(MemoryStorageReader):
    """Reads what is in process memory, else the files."""

    def read(self, handle, key_groups=None):
        directory = Path(self._storage._config["dstl.lazyfile.dir"])
        ns = self._storage._ns
        for loc in handle.location_dicts:
            name = str(loc["object"])
            with ns.lock:
                if name not in ns.objects:
                    path = directory / name.replace("/", "__")
                    if path.exists():
                        ns.objects[name] = bytearray(path.read_bytes())
        return super().read(handle, key_groups)


class LosesOnKillStorage(MemoryStorage):
    writer_class = WriteBehindWriter
    reader_class = WriteBehindReader
    storage_id = "broken-loses-on-kill"


BROKEN = {
    DropsLastStorage.storage_id: (DropsLastStorage, MEMORY_CAPABILITIES),
    BelowStartStorage.storage_id: (BelowStartStorage, MEMORY_CAPABILITIES),
    IgnoresTruncationStorage.storage_id: (IgnoresTruncationStorage, MEMORY_CAPABILITIES),
    NoFencingStorage.storage_id: (NoFencingStorage, MEMORY_CAPABILITIES),
    HidesCorruptionStorage.storage_id: (HidesCorruptionStorage, MEMORY_CAPABILITIES),
    LosesOnKillStorage.storage_id: (LosesOnKillStorage, frozenset({"survives_process_kill"})),
}

LAZYFILE_DIR = ConfigOption("dstl.lazyfile.dir", OptionType.STRING, None, "directory of broken-loses-on-kill")


@hookimpl
def dstl_register_storages(registry: StorageRegistry) -> None:
    for identifier, (cls, capabilities) in BROKEN.items():
        options = (LAZYFILE_DIR,) if cls is LosesOnKillStorage else ()
        registry.add(
            StorageSpec(
                identifier, cls, f"deliberately broken: {cls.__doc__ or identifier}", options, capabilities
            )
        )


@hookimpl
def dstl_conformance_environment(identifier, workdir):
    if identifier not in BROKEN:
        return None
    config = {"dstl.memory.namespace": f"broken-{uuid.uuid4().hex}"}
    if identifier == LosesOnKillStorage.storage_id:
        config["dstl.lazyfile.dir"] = str(workdir)
    return contextlib.nullcontext(config)


@hookimpl
def dstl_conformance_backdoor(identifier):
    return MemoryBackdoor() if identifier in BROKEN else None
