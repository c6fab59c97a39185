"""Deliberately broken storages: each breaks one property the suite must catch.

Loaded with ``dstl conformance ID --plugin tests.conformance.broken_storages``.
Each is the memory storage (or a small file storage) with one realistic bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path

from dstl.local._private.conformance import LocalBackdoor, local_environment
from dstl.local._private.segments import ActiveSegment
from dstl.local._private.storage import LocalStorage
from dstl.local.options import LOCAL_OPTIONS
from dstl.spi import (
    KNOWN_CAPABILITIES,
    ConfigOption,
    CorruptedError,
    FencedError,
    OptionType,
    StateChange,
    StateChangelogReader,
    StorageRegistry,
    StorageSpec,
    hookimpl,
)
from dstl.spi.kit import FetchedChangeSet
from dstl.spi.kit.changeset_format import CHANGE_ITEM, decode_body, iter_change_sets
from dstl.spi.kit.changeset_reader import checked_locations
from dstl.spi.memory import MemoryStorage, MemoryStorageReader, MemoryWriter
from dstl.spi.memory._private.conformance import MemoryBackdoor

MEMORY_CAPABILITIES = frozenset({"fencing", "physical_truncation", "leak_check", "corruption_injection"})


class DropsLastWriter(MemoryWriter):
    """Bug: an off-by-one drops the last change of every change set on upload."""

    def _upload(self, change_sets, checkpoint_id):
        for cs in change_sets:
            kept = decode_body(cs.body, cs.count)[:-1]
            cs.body = b"".join(CHANGE_ITEM.pack(kg, len(d)) + d for kg, d in kept)
            cs.count, cs.size = len(kept), sum(len(d) for _, d in kept)
        return super()._upload(change_sets, checkpoint_id)


class DropsLastStorage(MemoryStorage):
    writer_class = DropsLastWriter
    storage_id = "broken-drops-last"


class WholeObjectReader(MemoryStorageReader):
    """Bug: reads every change set of an object a location points into."""

    def read(self, handle, key_groups=None):
        ns = self._storage.namespace
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
        with self.namespace.lock:
            self.namespace.owners.pop((self.job_id, writer.log_id), None)
        writer._owner_check_disabled = True
        return writer

    class writer_class(MemoryWriter):
        def _upload(self, change_sets, checkpoint_id):
            namespace = self._storage.namespace
            with namespace.lock:
                namespace.owners[(self._storage.job_id, self.log_id)] = (self.epoch, self._token)
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
            with self._storage.namespace.lock:
                blob = bytes(self._storage.namespace.objects[name])
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
        ns = self._storage.namespace
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


class EpochAsTextStorage(MemoryStorage):
    """Bug: epochs compared as text (they arrive from a file or a header as strings)."""

    storage_id = "broken-epoch-as-text"

    def _claim_log(self, log_id, epoch):
        with self.namespace.lock:
            current = self.namespace.owners.get((self.job_id, log_id))
            if current is not None and str(epoch) < str(current[0]):
                raise FencedError(f"log {log_id!r} has a writer with epoch {current[0]} > {epoch}")
            token = f"t{next(self.namespace.tokens)}"
            self.namespace.owners[(self.job_id, log_id)] = (epoch, token)
        return token


class Epoch32BitStorage(MemoryStorage):
    """Bug: epochs kept in a 32-bit field (a protocol's producer epoch, a C struct)."""

    storage_id = "broken-epoch-32bit"

    def _claim_log(self, log_id, epoch):
        with self.namespace.lock:
            current = self.namespace.owners.get((self.job_id, log_id))
            if current is not None and epoch & 0xFFFFFFFF < current[0] & 0xFFFFFFFF:
                raise FencedError(f"log {log_id!r} has a writer with epoch {current[0]} > {epoch}")
            token = f"t{next(self.namespace.tokens)}"
            self.namespace.owners[(self.job_id, log_id)] = (epoch, token)
        return token


#: the object size the packing storage rolls at (its smallest configured size)
ROLL_BYTES = 4096


class PackingWriter(MemoryWriter):
    """Packs the log's uploads into one object until it reaches ROLL_BYTES, then rolls (like segments)."""

    def _upload(self, change_sets, checkpoint_id):
        storage, ns = self._storage, self._storage.namespace
        future = Future()
        with ns.lock:
            owner = ns.owners.get((storage.job_id, self.log_id))
            if owner != (self.epoch, self._token):
                fenced = FencedError.by_owner(self.log_id, self.epoch, owner[0] if owner else None)
                future.set_exception(fenced)
                return future
            name = storage._open_objects.get(self.log_id)
            if name is None:
                name = f"{storage.job_id}/{self.log_id}/{next(ns.tokens):012d}"
                storage._open_objects[self.log_id] = name
                ns.objects[name] = bytearray()
                ns.created[name] = time.monotonic()
            upload = next(ns.tokens)
            locations = []
            for change_set in change_sets:
                blob = self._encoded(change_set)
                offset = len(ns.objects[name])
                ns.objects[name] += blob
                storage._uploads[(name, offset)] = upload
                storage._live.setdefault((name, upload), set()).add(offset)
                locations.append(
                    {"object": name, "offset": offset, "length": len(blob), "sqn": change_set.sqn}
                )
            if len(ns.objects[name]) >= ROLL_BYTES:
                storage._sealed.add(name)
                del storage._open_objects[self.log_id]
        storage.metrics.inc("uploads")
        storage.metrics.inc("uploaded_bytes", sum(loc["length"] for loc in locations))
        future.set_result(locations)
        return future


class PackedDiscardStorage(MemoryStorage):
    """Bug: a sealed object is deleted once one upload's change sets in it are all discarded."""

    storage_id = "broken-packed-discard"
    writer_class = PackingWriter

    def __init__(self, config, job_id):
        super().__init__(config, job_id)
        self._open_objects, self._uploads, self._live, self._sealed = {}, {}, {}, set()

    def discard(self, handles):
        handles = list(handles)
        self._metrics.inc("discarded_change_sets", sum(len(h.locations) for h in handles))
        with self.namespace.lock:
            for handle in handles:
                for loc in checked_locations(handle, MemoryStorageReader.location_fields):
                    name, offset = str(loc["object"]), int(loc["offset"])
                    upload = self._uploads.get((name, offset))
                    live = self._live.get((name, upload), set())
                    live.discard(offset)
                    # Bug: the upload's own change sets decide, not every upload packed in the object.
                    if not live and name in self._sealed:
                        self.namespace.objects.pop(name, None)


class EmptyIsNothingWriter(MemoryWriter):
    """Bug: a change set whose changes hold no bytes is taken for no change set at all."""

    def _rollover(self):
        if self._active_count and not self._active_bytes:
            return  # its changes stay open and join the next change set (or are never persisted)
        super()._rollover()


class EmptyIsNothingStorage(MemoryStorage):
    storage_id = "broken-empty-is-nothing"
    writer_class = EmptyIsNothingWriter


class ItemsNotBytesWriter(MemoryWriter):
    """Bug: a typed view is framed by ``len()``, its items, and that many bytes of it are kept."""

    def append(self, key_group, data):
        if isinstance(data, memoryview) and data.itemsize != 1:
            data = data.tobytes()[: len(data)]
        super().append(key_group, data)


class ItemsNotBytesStorage(MemoryStorage):
    storage_id = "broken-items-not-bytes"
    writer_class = ItemsNotBytesWriter


class KeepsCallerBufferWriter(MemoryWriter):
    """Bug: zero-copy appends: a mutable buffer is referenced, copied in only when its change set closes."""

    def append(self, key_group, data):
        if isinstance(data, bytes):
            super().append(key_group, data)
            return
        start = len(self._active) + CHANGE_ITEM.size
        super().append(key_group, bytes(memoryview(data).nbytes))  # a placeholder of the right size
        self.__dict__.setdefault("_referenced", []).append((start, data))

    def _rollover(self):
        for start, data in self.__dict__.pop("_referenced", []):
            raw = memoryview(data).tobytes()
            self._active[start : start + len(raw)] = raw
        super()._rollover()


class KeepsCallerBufferStorage(MemoryStorage):
    storage_id = "broken-keeps-caller-buffer"
    writer_class = KeepsCallerBufferWriter


class ConfirmFreesUnpersistedWriter(MemoryWriter):
    """Bug: confirm marks every change set of the range confirmed and frees it, persisted or not."""

    def confirm(self, start_sqn, end_sqn, checkpoint_id):
        with self._lock:
            for sqn, cs in self._change_sets.items():
                if start_sqn <= sqn < end_sqn and not cs.confirmed:
                    cs.confirmed = True
                    self._held_bytes -= self._drop_data(cs)


class ConfirmFreesUnpersistedStorage(MemoryStorage):
    storage_id = "broken-confirm-frees-unpersisted"
    writer_class = ConfirmFreesUnpersistedWriter


class NamesByRangeWriter(MemoryWriter):
    """Bug: an upload's object is named by its log and first SQN, so another attempt overwrites it."""

    def _write_object(self, sqns, blobs, future):
        ns = self._storage.namespace
        tokens, ns.tokens = ns.tokens, iter([sqns[0]])  # the name's number: the first SQN
        try:
            super()._write_object(sqns, blobs, future)
        finally:
            ns.tokens = tokens


class NamesByRangeStorage(MemoryStorage):
    storage_id = "broken-names-by-range"
    writer_class = NamesByRangeWriter


class RestoreIgnoresFilterReader(MemoryStorageReader):
    """Bug: the bulk path hands over whole change sets and forgets the key-group filter."""

    def read_change_sets(self, handle, key_groups=None):
        return super().read_change_sets(handle, None)


class RestoreIgnoresFilterStorage(MemoryStorage):
    storage_id = "broken-restore-filter"
    reader_class = RestoreIgnoresFilterReader


#: What caching writers uploaded, decoded, per (job, log, SQN): a process-wide "hot" cache.
_WRITTEN: dict[tuple[str, str, int], list[tuple[int, bytes]]] = {}


class CachingWriter(MemoryWriter):
    """Keeps every change set it uploads decoded in a process-wide cache, for restores."""

    def _upload(self, change_sets, checkpoint_id):
        for cs in change_sets:
            _WRITTEN[(self._storage.job_id, self.log_id, cs.sqn)] = decode_body(cs.body, cs.count)
        return super()._upload(change_sets, checkpoint_id)


class CachedFilterReader(MemoryStorageReader):
    """Bug: a key-group filtered ``read`` (a restore) is served from the writers' cache when it
    holds every change set: the stored bytes are neither read nor verified."""

    def read(self, handle, key_groups=None):
        keys = self._cached(handle) if key_groups is not None else None
        if not keys:
            yield from super().read(handle, key_groups)
            return
        for key in keys:
            for key_group, data in _WRITTEN[key]:
                if key_group < 0 or key_group in key_groups:
                    yield StateChange(key_group, data, key[2])

    def read_change_sets(self, handle, key_groups=None):
        return MemoryStorageReader(self._storage).read_change_sets(handle, key_groups)  # not cached

    def _cached(self, handle):
        """The cache's keys of the handle's change sets, when it has them all and they still exist."""
        locations = handle.location_dicts
        objects = self._storage.namespace.objects
        if not all(isinstance(loc.get("sqn"), int) and loc.get("object") in objects for loc in locations):
            return None
        start, end = handle.sqn_range.start, handle.sqn_range.end
        sqns = sorted({loc["sqn"] for loc in locations if start <= loc["sqn"] < end})
        keys = [(self._storage.job_id, handle.log_id, sqn) for sqn in sqns]
        return keys if keys and all(key in _WRITTEN for key in keys) else None


class CachedFilterStorage(MemoryStorage):
    storage_id = "broken-cached-filter"
    writer_class = CachingWriter
    reader_class = CachedFilterReader


class PrefixCleanupStorage(MemoryStorage):
    """Bug: once a log has nothing live, its objects are cleaned up by the prefix ``job/log`` with no
    separator (a ``rm log*``), taking the objects of every log whose id starts with it."""

    storage_id = "broken-prefix-cleanup"

    def discard(self, handles):
        handles = list(handles)
        super().discard(handles)
        namespace = self.namespace
        with namespace.lock:
            for handle in handles:
                prefix = f"{self.job_id}/{handle.log_id}"
                if not any(name.startswith(f"{prefix}/") for name in namespace.live):
                    for name in [name for name in namespace.objects if name.startswith(prefix)]:
                        namespace.objects.pop(name)
                        namespace.live.pop(name, None)


class AgesByCreationStorage(MemoryStorage):
    """Bug: packs a log's uploads into one object (as segments do) and ages it by its creation when
    collecting orphans, so an append after the cutoff (a persist in flight), or an open writer's
    object, goes with it."""

    storage_id = "broken-ages-by-creation"
    writer_class = PackingWriter

    def __init__(self, config, job_id):
        super().__init__(config, job_id)
        self._open_objects, self._uploads, self._live, self._sealed = {}, {}, {}, set()


class KeepsNewestObjectStorage(MemoryStorage):
    """Bug: orphan collection keeps, of each live handle, only the object its newest change set lies
    in, as if a handle were one upload."""

    storage_id = "broken-keeps-newest-object"

    def collect_orphans(self, live, *, older_than):
        newest = []
        for handle in live:
            last = handle.locations[-1:]
            newest.append(dataclasses.replace(handle, locations=tuple(last)))
        return super().collect_orphans(newest, older_than=older_than)


class IgnoresSqnOnDiscardStorage(MemoryStorage):
    """Bug: a discard checks that the change set's header names the handle's log and epoch, not the
    SQN its location claims, so a handle relabelling its own change sets frees one still needed."""

    storage_id = "broken-ignores-sqn-on-discard"

    def _holds(self, name, offset, handle, loc):
        return super()._holds(name, offset, handle, {**loc, "sqn": None})


class SlicingReader(MemoryStorageReader):
    """Hands the decoder only the change set's own bytes, and forgets where they lie."""

    def _fetch(self, handle, location):
        whole = super()._fetch(handle, location)
        start = whole.offset
        own = whole.buffer[start : start + int(location["length"])]
        return FetchedChangeSet(own, 0, whole.location)  # should be base_offset=start


class MisplacesDamageStorage(MemoryStorage):
    """Bug: errors about a damaged change set report offset 0 of its object, not where it lies."""

    storage_id = "broken-misplaces-damage"
    reader_class = SlicingReader


class OnlyReadReader(StateChangelogReader):
    """Not broken: a reader that implements only ``read`` (the SPI's default ``read_change_sets``)."""

    def __init__(self, storage):
        self._inner = MemoryStorageReader(storage)

    def read(self, handle, key_groups=None):
        return self._inner.read(handle, key_groups)

    def close(self):
        self._inner.close()


class OnlyReadStorage(MemoryStorage):
    storage_id = "only-read"
    reader_class = OnlyReadReader


class AcksBeforeSyncStorage(LocalStorage):
    """Bug: writes segments and acknowledges without syncing them (fsync 'for speed')."""

    storage_id = "broken-acks-before-sync"

    def __init__(self, config, job_id):
        super().__init__(config.with_values({"dstl.local.fsync": False}), job_id)

    @property
    def identifier(self):
        return self.storage_id


class RetriesSyncSegment(ActiveSegment):
    """Bug: a failed ``fdatasync`` is retried, and the retry's success taken for durability."""

    def append(self, blobs):
        offset = self.size
        data = b"".join(blobs)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        try:
            os.fdatasync(self.fd)
        except OSError:
            os.fdatasync(self.fd)  # succeeds: the dropped pages are not written by it
        self.size += len(data)
        return offset


class RetriesSyncStorage(LocalStorage):
    """Local storage whose segments retry a failed sync and acknowledge."""

    storage_id = "broken-retries-sync"

    @property
    def identifier(self):
        return self.storage_id

    def _segment_for(self, size):
        if self._active is None:
            self._segment_number += 1
            self._active = RetriesSyncSegment(
                self.segments_dir, self.instance, self._segment_number, fsync=self._fsync
            )
        return super()._segment_for(size)


BROKEN = {
    OnlyReadStorage.storage_id: (
        OnlyReadStorage,
        MEMORY_CAPABILITIES | {"forgery_injection", "orphan_collection"},
    ),
    DropsLastStorage.storage_id: (DropsLastStorage, MEMORY_CAPABILITIES),
    BelowStartStorage.storage_id: (BelowStartStorage, MEMORY_CAPABILITIES),
    IgnoresTruncationStorage.storage_id: (IgnoresTruncationStorage, MEMORY_CAPABILITIES),
    NoFencingStorage.storage_id: (NoFencingStorage, MEMORY_CAPABILITIES),
    HidesCorruptionStorage.storage_id: (HidesCorruptionStorage, MEMORY_CAPABILITIES),
    LosesOnKillStorage.storage_id: (LosesOnKillStorage, frozenset({"survives_process_kill"})),
    EpochAsTextStorage.storage_id: (EpochAsTextStorage, MEMORY_CAPABILITIES),
    Epoch32BitStorage.storage_id: (Epoch32BitStorage, MEMORY_CAPABILITIES),
    PackedDiscardStorage.storage_id: (PackedDiscardStorage, frozenset({"fencing", "corruption_injection"})),
    EmptyIsNothingStorage.storage_id: (EmptyIsNothingStorage, MEMORY_CAPABILITIES),
    ItemsNotBytesStorage.storage_id: (ItemsNotBytesStorage, MEMORY_CAPABILITIES),
    ConfirmFreesUnpersistedStorage.storage_id: (ConfirmFreesUnpersistedStorage, MEMORY_CAPABILITIES),
    NamesByRangeStorage.storage_id: (NamesByRangeStorage, MEMORY_CAPABILITIES),
    KeepsCallerBufferStorage.storage_id: (KeepsCallerBufferStorage, MEMORY_CAPABILITIES),
    RestoreIgnoresFilterStorage.storage_id: (RestoreIgnoresFilterStorage, MEMORY_CAPABILITIES),
    CachedFilterStorage.storage_id: (CachedFilterStorage, MEMORY_CAPABILITIES),
    PrefixCleanupStorage.storage_id: (PrefixCleanupStorage, MEMORY_CAPABILITIES),
    AgesByCreationStorage.storage_id: (AgesByCreationStorage, frozenset({"fencing", "orphan_collection"})),
    KeepsNewestObjectStorage.storage_id: (
        KeepsNewestObjectStorage,
        MEMORY_CAPABILITIES | {"orphan_collection"},
    ),
    IgnoresSqnOnDiscardStorage.storage_id: (IgnoresSqnOnDiscardStorage, MEMORY_CAPABILITIES),
    MisplacesDamageStorage.storage_id: (MisplacesDamageStorage, MEMORY_CAPABILITIES | {"forgery_injection"}),
    AcksBeforeSyncStorage.storage_id: (
        AcksBeforeSyncStorage,
        KNOWN_CAPABILITIES - {"multi_process", "sync_failure_injection"},
    ),
    RetriesSyncStorage.storage_id: (RetriesSyncStorage, KNOWN_CAPABILITIES - {"multi_process"}),
}

LOCAL_BASED = frozenset({AcksBeforeSyncStorage, RetriesSyncStorage})
LAZYFILE_DIR = ConfigOption("dstl.lazyfile.dir", OptionType.STRING, None, "directory of broken-loses-on-kill")


@hookimpl
def dstl_register_storages(registry: StorageRegistry) -> None:
    for identifier, (cls, capabilities) in BROKEN.items():
        options = (LAZYFILE_DIR,) if cls is LosesOnKillStorage else ()
        if cls in LOCAL_BASED:
            options = LOCAL_OPTIONS
        registry.add(
            StorageSpec(
                identifier, cls, f"deliberately broken: {cls.__doc__ or identifier}", options, capabilities
            )
        )


@hookimpl
def dstl_conformance_environment(identifier, workdir):
    if identifier not in BROKEN:
        return None
    if BROKEN[identifier][0] in LOCAL_BASED:
        return local_environment(workdir)
    config = {"dstl.memory.namespace": f"broken-{uuid.uuid4().hex}"}
    if identifier == LosesOnKillStorage.storage_id:
        config["dstl.lazyfile.dir"] = str(workdir)
    return contextlib.nullcontext(config)


@hookimpl
def dstl_conformance_backdoor(identifier):
    if identifier in BROKEN and BROKEN[identifier][0] in LOCAL_BASED:
        return LocalBackdoor()
    return MemoryBackdoor() if identifier in BROKEN else None
