"""The local-disk storage: segments, group commit, fencing, recovery, discard."""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

from dstl.spi import (
    ChangelogHandle,
    ClosedError,
    Config,
    ConfigError,
    DstlError,
    FencedError,
    InvalidHandleError,
    KeyGroupRange,
    StorageError,
)
from dstl.spi.handle import Location
from dstl.spi.kit import check_relative_path, storage_settings
from dstl.spi.kit.changeset_format import CHANGE_SET_HEADER_SIZE, ChangeSetIdentity, change_set_identity
from dstl.spi.kit.changeset_reader import (
    checked_locations,
)
from dstl.spi.kit.changeset_storage import ChangeSetStorage
from dstl.spi.kit.durability import fsync_directory
from dstl.spi.names import MAX_NAME_LENGTH

from ..options import DIR, FSYNC, SEGMENT_SIZE
from .discards import DiscardTracker
from .fencing import EpochFile, OwnerCheck
from .group_commit import CommitRequest, GroupCommitter
from .reader import LocalReader
from .segments import (
    QUARANTINED_SUFFIX,
    SEALED_SUFFIX,
    SEGMENT_SUFFIX,
    ActiveSegment,
    InstanceLock,
    instance_alive,
    instance_of,
    recover_segment,
    write_sealed_marker,
)
from .writer import LocalWriter

log = logging.getLogger(__name__)

IDENTIFIER = "local"
#: The record of whose job a job directory is (its checkpoint location), in the job directory.
OWNER_FILE = "OWNER"
#: Longest owner record read back (a checkpoint location).
_MAX_OWNER = 4096


def read_owner_record(path: Path) -> str:
    """The owner recorded in ``path``: a regular file of at most a few KB of UTF-8 (untrusted).

    :raises StorageError: when it is anything else.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        msg = f"cannot read the job's owner record {path}: {exc}"
        raise StorageError(msg) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            msg = f"the job's owner record {path} is not a regular file: remove it"
            raise StorageError(msg)
        data = os.read(fd, _MAX_OWNER + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_OWNER:
        msg = f"the job's owner record {path} is over {_MAX_OWNER} bytes: a damaged file, remove it"
        raise StorageError(msg)
    return data.decode("utf-8", errors="replace")


class LocalStorage(ChangeSetStorage):
    """Append-only segment files on a local disk, shared by the writers of a job.

    Layout under ``dstl.local.dir``::

        <job>/segments/seg-<instance>-<n>.log   change sets (+ .sealed, .discarded)
        <job>/epochs/<log>.epoch                 owner of each log (fencing)
        <job>/instance-<instance>.lock           held while the instance lives
    """

    def __init__(self, config: Config, job_id: str) -> None:
        base = config.get(DIR)
        if not base:
            msg = (
                "dstl.local.dir is not set: set it to a directory on a local disk, "
                "e.g. dstl.local.dir=/var/lib/dstl"
            )
            raise ConfigError(msg)
        super().__init__(
            job_id,
            **storage_settings(config),
        )
        self.base = Path(base).expanduser().absolute()
        self.job_dir = self.base / self.job_id
        self.segments_dir = self.job_dir / "segments"
        self.epochs_dir = self.job_dir / "epochs"
        self._segment_size = config.get(SEGMENT_SIZE)
        self._fsync = config.get(FSYNC)
        self._segment_lock = threading.Lock()  # held across write + fsync: keep it apart
        self.instance = uuid.uuid4().hex[:12]
        self._active: ActiveSegment | None = None
        if self.read_only:  # reads need none of it: no directory, lock, recovery or discard file
            self._instance_lock = None
            return
        try:
            self.segments_dir.mkdir(parents=True, exist_ok=True)
            self.epochs_dir.mkdir(parents=True, exist_ok=True)
            self._instance_lock = InstanceLock(self.job_dir, self.instance)
        except OSError as exc:
            msg = f"cannot use dstl.local.dir {str(self.base)!r}: {exc}"
            raise StorageError(msg) from exc
        self._discards = DiscardTracker(self.segments_dir)
        self._segment_number = 0
        self._committer = GroupCommitter(self._commit)
        try:
            self._recover()
        except (OSError, DstlError) as exc:
            # A failed start must not keep this instance's lock (nor its descriptor) alive.
            self._instance_lock.release()
            if isinstance(exc, DstlError):
                raise
            msg = (
                f"recovering {self.segments_dir} failed: {exc}; a dead instance's segment cannot be read "
                "or sealed (remove or repair what the error names)"
            )
            raise StorageError(msg) from exc

    # -- identity and paths ---------------------------------------------------------------
    @property
    def identifier(self) -> str:
        """``local``."""
        return IDENTIFIER

    def relative_segment(self, segment: str) -> str:
        """The location of segment file ``segment`` of this job, as handles hold it."""
        return f"{self.job_id}/segments/{segment}"

    def segment_path(self, relative: str) -> Path:
        """The file of a segment location (of any job under the base: reads may cross jobs)."""
        check_relative_path(relative, "segment location")
        return self.base / relative

    def _own_segment(self, relative: str) -> Path:
        """The path of a segment of this storage's job; any other location is refused (never deleted)."""
        path = self.segment_path(relative)
        if path.parent != self.segments_dir:
            msg = (
                f"segment location {relative!r} does not belong to job {self.job_id!r} of this storage "
                f"(expected {self.job_id}/segments/<segment>): a damaged or foreign handle"
            )
            raise InvalidHandleError(msg)
        return path

    # -- recovery -----------------------------------------------------------------------
    def _recover(self) -> None:
        """Seal the segments of dead instances, cutting torn tails."""
        for path in sorted(self.segments_dir.glob(f"*{SEGMENT_SUFFIX}")):
            sealed = path.with_name(path.name + SEALED_SUFFIX)
            if sealed.exists() or instance_alive(self.job_dir, instance_of(path.name)):
                continue
            discarded = functools.partial(self._discards.discarded_ranges, path.name)
            found = recover_segment(path, discarded=discarded)
            if found.cut:
                log.warning(
                    "cut a torn tail of %d bytes off %s (an incomplete, unacknowledged write)",
                    found.cut,
                    path,
                )
                self._metrics.inc("recovered_torn_bytes", found.cut)
            if found.damage is not None:
                log.error(
                    "segment %s is damaged: %s; it is kept and quarantined (never deleted by discards), "
                    "and only a handle that needs the damaged change set fails",
                    path,
                    found.damage,
                )
                self._metrics.inc("quarantined_segments")
                (path.with_name(path.name + QUARANTINED_SUFFIX)).write_text(f"{found.damage}\n")
            write_sealed_marker(path, path.stat().st_size)
            self._discards.collect(path.name)
        for lock in self.job_dir.glob("instance-*.lock"):
            instance = lock.stem.removeprefix("instance-")
            if instance != self.instance and not instance_alive(self.job_dir, instance):
                lock.unlink(missing_ok=True)

    # -- job binding --------------------------------------------------------------------------
    def _record_owner(self, owner: str) -> str:
        """``<job>/OWNER``, created exclusively (``O_EXCL``) and synced; read back when it exists."""
        path = self.job_dir / OWNER_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return read_owner_record(path)
        except OSError as exc:
            msg = f"cannot record the owner of job {self.job_id!r} in {path}: {exc}"
            raise StorageError(msg) from exc
        try:
            os.write(fd, owner.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(self.job_dir)
        return owner

    # -- writers ----------------------------------------------------------------------------
    def _claim_log(self, log_id: str, epoch: int) -> str:
        token = f"{self.instance}.{uuid.uuid4().hex[:8]}"
        EpochFile(self.epochs_dir / f"{log_id}.epoch").take_over(epoch, token)
        return token

    def _make_writer(self, log_id: str, key_groups: KeyGroupRange, epoch: int, token: str) -> LocalWriter:
        owner_check = OwnerCheck(EpochFile(self.epochs_dir / f"{log_id}.epoch"))
        return LocalWriter(self, log_id, key_groups, epoch, token, owner_check=owner_check)

    def submit_commit(self, request: CommitRequest) -> Future[tuple[str, int]]:
        """Queue a writer's change sets for the next group commit: its segment and first offset."""
        return self._committer.submit(request)

    def pin(self, segment: str, offset: int) -> None:
        """A writer holds the change set at ``offset`` of ``segment`` for reuse."""
        self._discards.pin(segment, offset)

    # -- group commit -------------------------------------------------------------------------
    def _commit(self, batch: list[CommitRequest]) -> None:
        accepted: list[CommitRequest] = []
        for request in batch:
            try:
                owner = request.owner()
            except (FencedError, ClosedError) as exc:  # this request's writer only: the others go on
                self._metrics.inc("upload_failures")
                request.future.set_exception(exc)
                continue
            if owner != (request.epoch, request.token):
                self._metrics.inc("upload_failures")
                request.future.set_exception(
                    FencedError.by_owner(request.log_id, request.epoch, owner[0] if owner else None)
                )
            else:
                accepted.append(request)
        if not accepted:
            return
        size = sum(len(b) for r in accepted for b in r.blobs)
        segment: ActiveSegment | None = None
        try:
            with self._segment_lock:
                if self._closed:
                    msg = "local storage is closed"
                    raise ClosedError(msg)
                segment = self._segment_for(size)
                try:
                    offset = segment.append([b for r in accepted for b in r.blobs])
                finally:
                    if segment.failure is not None:
                        self._retire(segment)
        except OSError as exc:
            self._metrics.inc("upload_failures")
            where = f" to {segment.path}" if segment is not None else ""
            error = StorageError(
                f"writing the change sets{where} failed: {exc}; the segment was sealed and the next "
                "persist writes to a fresh one (free space or fix the disk, then retry)",
                retriable=True,
            )
            for request in accepted:
                request.future.set_exception(error)
            return
        self._metrics.inc("uploads")
        self._metrics.inc("fsyncs" if self._fsync else "writes")
        self._metrics.inc("uploaded_bytes", size)
        self._metrics.observe("batch_requests", len(accepted))
        for request in accepted:
            request.future.set_result((segment.name, offset))
            offset += sum(len(b) for b in request.blobs)

    def _retire(self, segment: ActiveSegment) -> None:
        """Seal a segment whose write or sync failed; the next commit starts a fresh one."""
        log.error("retiring segment %s after a failed write or sync: %s", segment.path, segment.failure)
        self._metrics.inc("retired_segments")
        if self._active is segment:
            self._active = None
        try:
            segment.seal()
        except OSError as exc:  # unsealed, it is cut back to its valid length on recovery
            log.warning("could not seal retired segment %s: %s", segment.path, exc)
        self._discards.collect(segment.name)

    def _segment_for(self, size: int) -> ActiveSegment:
        active = self._active
        if active is not None and active.size > 0 and active.size + size > self._segment_size:
            active.seal()
            self._active = None
            self._discards.collect(active.name)
        if self._active is None:
            self._segment_number += 1
            self._active = ActiveSegment(
                self.segments_dir, self.instance, self._segment_number, fsync=self._fsync
            )
        return self._active

    # -- reads, discard, close --------------------------------------------------------------
    def create_reader(self) -> LocalReader:
        """Create a reader."""
        return LocalReader(self)

    def unpin(self, locations: list[Location]) -> None:
        """A writer released these change sets (the segment may be collected once all are discarded)."""
        pairs = [(self._own_segment(str(loc["segment"])).name, int(loc["offset"])) for loc in locations]  # type: ignore[arg-type]
        for segment in self._discards.unpin(pairs):
            self._discards.collect(segment)

    def discard(self, handles: Iterable[ChangelogHandle]) -> None:
        """Record the handles' change sets as discarded; delete segments nothing needs."""
        self._check_writable()
        by_segment: dict[str, set[tuple[int, int]]] = {}
        handles = list(handles)
        self._metrics.inc("discarded_change_sets", sum(len(h.locations) for h in handles))
        recorded: dict[str, dict[int, int]] = {}
        for handle in handles:
            for loc in checked_locations(handle, LocalReader.location_fields):
                path = self._own_segment(str(loc["segment"]))
                offset, length = int(loc["offset"]), int(loc["length"])  # type: ignore[arg-type]
                if path.name not in recorded:
                    recorded[path.name] = self._discards.discarded_ranges(path.name)
                if recorded[path.name].get(offset) == length:
                    continue  # discarded before (its blocks may be freed already): nothing to add
                if self._wrote(path, offset, length) and self._holds(path, offset, handle, loc):
                    by_segment.setdefault(path.name, set()).add((offset, length))
        deleted = len(self._discards.discard(by_segment))
        deleted += self._roll_if_discarded(by_segment)
        self._metrics.inc("deleted_objects", deleted)

    def _wrote(self, path: Path, offset: int, length: int) -> bool:
        """Whether a change set of exactly ``length`` bytes was written at ``offset`` of ``path``.

        The segment's chain of frames is the record of what was written: a location
        that is not one of its change sets (a forged or damaged handle, or a frame-like
        run of bytes inside change data) is not counted. So it can never make a segment
        that still holds live change sets look fully discarded, nor free their blocks.
        """
        try:
            stored = self._discards.frames.length_at(path.name, offset)
        except FileNotFoundError:
            return False  # already deleted: nothing to account
        except OSError as exc:
            stored = None
            reason = str(exc)
        else:
            reason = (
                "no change set starts there"
                if stored is None
                else f"the change set there is {stored} bytes long"
            )
        if stored == length:
            return True
        log.warning(
            "ignoring the discard of %s offset %d length %d: %s (a damaged or forged handle)",
            path,
            offset,
            length,
            reason,
        )
        self._metrics.inc("refused_discards")
        return False

    def _holds(self, path: Path, offset: int, handle: ChangelogHandle, loc: Location) -> bool:
        """Whether the change set at ``offset`` is the handle's (its header says whose it is)."""

        def identity() -> ChangeSetIdentity:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            try:
                head = os.pread(fd, CHANGE_SET_HEADER_SIZE + MAX_NAME_LENGTH, offset)
            finally:
                os.close(fd)
            return change_set_identity(head, location=str(path), offset=offset)

        return self._may_discard(identity, handle, loc, where=str(path), offset=offset)

    def _roll_if_discarded(self, touched: dict[str, set[tuple[int, int]]]) -> int:
        """Seal the active segment once everything in it was discarded, so that it can be deleted.

        Otherwise a job whose log is truncated at every checkpoint would keep up to
        ``dstl.local.segment-size`` of dead log per instance on disk. The discard file is
        read outside the segment lock (commits wait on it), and only when this discard
        touched the active segment.
        """
        active = self._active
        if active is None or active.name not in touched:
            return 0
        size = active.size
        if not self._discards.fully_discarded(active.name, size):
            return 0
        with self._segment_lock:
            if self._active is not active or active.size != size:  # a commit came in meanwhile
                return 0
            active.seal()
            self._active = None
        return int(self._discards.collect(active.name))

    def collect_orphans(self, live: Iterable[ChangelogHandle], *, older_than: float) -> int:
        """Delete this job's segments that no ``live`` handle needs, last written before ``older_than``.

        Only sealed segments go (another instance's active segment is sealed when it
        rolls, closes or is recovered); this instance's own active segment is sealed
        first when nothing in it is needed. Segments an open writer still reuses are
        kept, and so are quarantined ones.
        """
        self._check_writable()
        needed: set[str] = set()
        for handle in live:
            if handle.storage_id != self.identifier:
                continue
            for loc in checked_locations(handle, LocalReader.location_fields):
                path = self.segment_path(str(loc["segment"]))
                if path.parent == self.segments_dir:
                    needed.add(path.name)
        self._seal_active_if_orphaned(needed, older_than)
        deleted = 0
        for path in sorted(self.segments_dir.glob(f"*{SEGMENT_SUFFIX}")):
            if path.name in needed:
                continue
            try:
                if path.stat().st_mtime >= older_than:
                    continue
            except FileNotFoundError:
                continue
            if self._discards.collect(path.name, orphaned=True):
                log.info("deleted orphan segment %s (no retained checkpoint needs it)", path)
                deleted += 1
        self._metrics.inc("deleted_objects", deleted)
        self._metrics.inc("orphans_deleted", deleted)
        return deleted

    def _seal_active_if_orphaned(self, needed: set[str], older_than: float) -> None:
        active = self._active
        if active is None or active.name in needed:
            return
        with self._segment_lock:
            if self._active is not active:
                return
            try:
                if active.path.stat().st_mtime >= older_than:
                    return
            except FileNotFoundError:
                return
            active.seal()
            self._active = None

    def list_objects(self) -> list[str]:
        """Segment files of this job."""
        return sorted(p.name for p in self.segments_dir.glob(f"*{SEGMENT_SUFFIX}"))

    def _close_resources(self) -> None:
        """Seal the active segment and release the instance lock."""
        with self._segment_lock:
            active, self._active = self._active, None
        if active is not None:
            active.seal()
            self._discards.collect(active.name)
        if self._instance_lock is not None:
            self._instance_lock.release()
