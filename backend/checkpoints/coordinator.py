"""Checkpoint coordinator (driver side): completed checkpoints, retention, shared state.

A completed checkpoint is a JSON document ``<dir>/<job>/checkpoints/chk-<id>.json``
naming every operator instance's :class:`BackendSnapshot`. The shared-state
registry counts, per log location and per snapshot object, the retained
checkpoints that reference it; when the count drops to zero the object is
discarded (log locations through their storage, snapshots from the directory).

Documents are untrusted when read back. Recovery never continues from older
state without saying so: a damaged latest document stops it
(``state.checkpoints.on-damaged=fail``) or is skipped in a logged rollback
(``previous``), and while any document is damaged nothing is deleted as an
orphan (it may be what the damaged one references). Only snapshots under the
job's own ``snapshots/`` directory are ever deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from dstl.spi import (
    STORAGE_OPTION,
    ChangelogHandle,
    Config,
    ConfigError,
    CorruptedError,
    DstlError,
    FencedError,
    KeyGroupRange,
    SequenceNumberRange,
    StateChangelogStorage,
    StorageError,
    load_storage,
    storage_for_handle,
)

from ..changelog import BackendSnapshot
from ..documents import list_directory, read_small_int
from ..filesystems import put_exclusively, storage_options
from ..options import (
    CHECKPOINTS_DIR,
    CHECKPOINTS_NUM_RETAINED,
    CHECKPOINTS_ON_DAMAGED,
    CHECKPOINTS_ORPHAN_COLLECTION_GRACE,
    CHECKPOINTS_ORPHAN_COLLECTION_INTERVAL,
)
from .completed import (
    CHECKPOINT_FILE_PREFIX,
    CHECKPOINT_FILE_SUFFIX,
    CompletedCheckpoint,
    TimeProgress,
    read_checkpoints,
)

log = logging.getLogger(__name__)

__all__ = ["CheckpointCoordinator"]

ON_DAMAGED_CHOICES = ("fail", "previous")
_LEASE_ATTEMPTS = 64
#: The shortest orphan-collection grace accepted: the option's declared minimum.
MIN_ORPHAN_GRACE = float(CHECKPOINTS_ORPHAN_COLLECTION_GRACE.minimum or 0)




class CheckpointCoordinator:
    """Completes checkpoints, keeps ``num_retained`` and discards what none of them needs.

    :param config: used to open the storages named by handles when discarding.
    """

    def __init__(
        self,
        checkpoints_dir: str,
        job_id: str,
        *,
        num_retained: int = 1,
        config: Config | Mapping[str, Any] | None = None,
        on_damaged: str = "fail",
        orphan_interval: float | None = None,
        orphan_grace: float | None = None,
    ) -> None:
        import fsspec

        if num_retained < 1:
            msg = f"num_retained must be at least 1, got {num_retained}"
            raise ValueError(msg)
        if on_damaged not in ON_DAMAGED_CHOICES:
            msg = f"on_damaged must be one of {ON_DAMAGED_CHOICES}, got {on_damaged!r}"
            raise ValueError(msg)
        self.on_damaged = on_damaged
        #: Set by :meth:`recover` when it skipped a damaged newer checkpoint: its id.
        self.rolled_back_from: int | None = None
        self._fs, root = fsspec.core.url_to_fs(checkpoints_dir, **storage_options(config))
        self._root = root.rstrip("/")
        self._dir = f"{self._root}/{job_id}/checkpoints"
        self._job = job_id
        self.num_retained = num_retained
        self._config = Config.of(config)
        self.orphan_interval = (
            self._config.get(CHECKPOINTS_ORPHAN_COLLECTION_INTERVAL)
            if orphan_interval is None
            else orphan_interval
        )
        self.orphan_grace = (
            self._config.get(CHECKPOINTS_ORPHAN_COLLECTION_GRACE)
            if orphan_grace is None
            else orphan_grace
        )
        if self.orphan_grace < MIN_ORPHAN_GRACE:
            msg = (
                f"state.checkpoints.orphan-collection.grace={self.orphan_grace:g}s is too short: change data "
                f"that young may belong to a checkpoint still being completed; use at least "
                f"{MIN_ORPHAN_GRACE:g}s (the default is 10min)"
            )
            raise ConfigError(msg)
        self._orphans_collected_at = time.monotonic()
        self._retained: list[CompletedCheckpoint] = []
        self._counts: Counter[tuple[Any, ...]] = Counter()
        #: Damaged documents found by :meth:`recover`: nothing they may reference is deleted while they exist.
        self._damaged: list[str] = []
        #: This driver's lease generation, taken by :meth:`recover` (writer epochs build on it).
        self.generation: int | None = None
        self._fs.makedirs(self._dir, exist_ok=True)

    @classmethod
    def from_config(cls, config: Config | Mapping[str, Any], job_id: str) -> CheckpointCoordinator:
        """A coordinator under ``state.checkpoints.dir`` keeping ``state.checkpoints.num-retained``."""
        cfg = Config.of(config)
        directory = cfg.get(CHECKPOINTS_DIR)
        if not directory:
            msg = "the checkpoint coordinator needs state.checkpoints.dir (an fsspec URL)"
            raise ConfigError(msg)
        return cls(
            directory,
            job_id,
            num_retained=cfg.get(CHECKPOINTS_NUM_RETAINED),
            config=cfg,
            on_damaged=cfg.get(CHECKPOINTS_ON_DAMAGED),
        )

    def _path(self, checkpoint_id: int) -> str:
        return f"{self._dir}/{CHECKPOINT_FILE_PREFIX}{checkpoint_id:012d}{CHECKPOINT_FILE_SUFFIX}"

    # -- completing --------------------------------------------------------------------------------
    def complete(
        self,
        checkpoint_id: int,
        snapshots: Mapping[str, BackendSnapshot],
        time_progress: TimeProgress | None = None,
    ) -> CompletedCheckpoint:
        """Record checkpoint ``checkpoint_id`` as completed; subsume the ones beyond retention."""
        if self._retained and checkpoint_id <= self._retained[-1].checkpoint_id:
            msg = f"checkpoint {checkpoint_id} is not newer than {self._retained[-1].checkpoint_id}"
            raise ValueError(msg)
        completed = CompletedCheckpoint(checkpoint_id, dict(snapshots), time_progress or TimeProgress())
        self._write(completed)
        self._counts.update(completed.shared_keys())
        self._retained.append(completed)
        while len(self._retained) > self.num_retained:
            self._subsume(self._retained.pop(0))
        if time.monotonic() - self._orphans_collected_at >= self.orphan_interval:
            self.collect_orphans()
        return completed

    def abort_from(self, checkpoint_id: int) -> None:
        """Forget completed checkpoints ``>= checkpoint_id`` (their batch is being replayed).

        What only they referenced is discarded; the older retained ones stay intact.
        """
        while self._retained and self._retained[-1].checkpoint_id >= checkpoint_id:
            self._subsume(self._retained.pop())

    def _write(self, completed: CompletedCheckpoint) -> None:
        # Created exclusively (never overwritten): a second driver of the job cannot replace it.
        final = self._path(completed.checkpoint_id)
        self._check_lease()
        if final in self._damaged and self._fs.exists(final):
            log.warning("replacing the damaged checkpoint document %s with checkpoint %s", final, final)
            self._fs.rm_file(final)
        try:
            put_exclusively(self._fs, self._dir, final, completed.to_json().encode())
        except FileExistsError as exc:
            msg = (
                f"checkpoint {completed.checkpoint_id} of job {self._job} exists already at {final}: another "
                "driver runs this job on the same state directory. This one stops; run one driver per job "
                "(or give the other query a checkpoint location and job id of its own)"
            )
            raise FencedError(msg) from exc
        except OSError as exc:
            msg = (
                f"writing checkpoint {completed.checkpoint_id} to {final} failed: {exc}; the checkpoint is "
                "not completed (free space or fix the checkpoint directory, then retry)"
            )
            raise StorageError(msg, retriable=True) from exc

    # -- the driver lease ----------------------------------------------------------------------------
    def _take_lease(self) -> int:
        """Become the job's newest driver: an exclusively created ``drivers/<generation>`` marker.

        A driver whose marker is not the newest one is fenced at its next checkpoint
        (:meth:`_check_lease`): a restarted driver takes over from one still running.
        Generations only grow, from the ``runs`` counter of earlier releases too.
        """
        directory = f"{self._root}/{self._job}/drivers"
        self._fs.makedirs(directory, exist_ok=True)
        legacy = f"{self._root}/{self._job}/runs"
        floor = read_small_int(self._fs, legacy) if self._fs.exists(legacy) else 0
        for _ in range(_LEASE_ATTEMPTS):
            generation = max([floor, *self._generations(directory)]) + 1
            owner = json.dumps({"generation": generation, "started": time.time()}).encode()
            try:
                put_exclusively(self._fs, directory, f"{directory}/{generation:012d}", owner)
            except FileExistsError:
                continue  # another driver took this generation first: go above it
            for older in self._generations(directory):
                if older < generation:
                    with contextlib.suppress(OSError):
                        self._fs.rm_file(f"{directory}/{older:012d}")
            return generation
        msg = f"could not take the driver lease of job {self._job} under {directory}: too many drivers"
        raise StorageError(msg, retriable=True)

    def _generations(self, directory: str) -> list[int]:
        names = (path.rsplit("/", 1)[-1] for path in list_directory(self._fs, directory))
        return [int(name) for name in names if len(name) == 12 and name.isascii() and name.isdigit()]

    def _check_lease(self) -> None:
        """Fence this driver once a newer one of the job took the lease."""
        if self.generation is None:
            return
        newest = max(self._generations(f"{self._root}/{self._job}/drivers"), default=self.generation)
        if newest > self.generation:
            msg = (
                f"another driver of job {self._job} started on {self._dir} (generation {newest} > "
                f"{self.generation}): this one is fenced and stops. Run one driver per job, or give the "
                "other query a checkpoint location of its own"
            )
            raise FencedError(msg)

    def _subsume(self, old: CompletedCheckpoint) -> None:
        released = []
        for key in old.shared_keys():
            self._counts[key] -= 1
            if self._counts[key] <= 0:
                del self._counts[key]
                released.append(key)
        if self._damage_pending():
            log.warning(
                "checkpoint %d is subsumed but its objects are kept: a damaged checkpoint document may "
                "reference them (orphan collection removes them once it is repaired or removed)",
                old.checkpoint_id,
            )
        else:
            self._discard(released)
        self._fs.rm_file(self._path(old.checkpoint_id))

    def _discard(self, keys: list[tuple[Any, ...]]) -> None:
        by_log: dict[tuple[str, str, int], list[Any]] = {}
        for key in keys:
            if key[0] == "snapshot":
                if not self._owns_snapshot(key[1]):
                    log.warning(
                        "not deleting snapshot %r: it lies outside %s/snapshots of this job (a damaged or "
                        "forged reference)",
                        key[1],
                        self._job,
                    )
                    continue
                path = f"{self._root}/{key[1]}"
                if self._fs.exists(path):
                    self._fs.rm_file(path)
            else:
                _, storage_id, log_id, epoch, location = key
                by_log.setdefault((storage_id, log_id, epoch), []).append(dict(location))
        for (storage_id, log_id, epoch), locations in by_log.items():
            handle = ChangelogHandle.create(
                storage_id=storage_id,
                log_id=log_id,
                key_groups=KeyGroupRange(0, 0),
                sqn_range=SequenceNumberRange(0, 0),
                epoch=epoch,
                locations=locations,
            )
            with storage_for_handle(handle, self._config, job_id=self._job) as storage:
                storage.discard([handle])

    def _owns_snapshot(self, relative: str) -> bool:
        """Whether ``relative`` (already a safe relative path) names one of this job's snapshots."""
        return relative.startswith(f"{self._job}/snapshots/") and relative.endswith(".snap")

    @property
    def directory(self) -> str:
        """Where this job's checkpoint documents live."""
        return self._dir

    # -- reading back ----------------------------------------------------------------------------
    @property
    def retained(self) -> list[CompletedCheckpoint]:
        """Retained checkpoints, oldest first."""
        return list(self._retained)

    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint, or ``None``."""
        return self._retained[-1] if self._retained else None

    def recover(self) -> CompletedCheckpoint | None:
        """Load the retained checkpoints after a restart and remove what a crash left behind.

        First the job id is bound to this checkpoint directory on the configured
        storage (:meth:`bind_storage`). Metadata beyond ``num_retained``,
        half-written temporary files and snapshot objects no retained checkpoint
        references are deleted before new
        checkpoints start, unless a document is damaged: then nothing is deleted
        (the damaged one may reference it).

        :raises CorruptedError: naming the file when the newest checkpoint document
            is damaged and ``on_damaged`` is ``fail``.
        :raises JobConflictError: when another job holds this job id on the storage.
        """
        self.bind_storage()
        self.generation = self._take_lease()
        for path in list_directory(self._fs, self._dir):
            if path.rsplit("/", 1)[-1].startswith(".tmp-"):
                self._fs.rm_file(path)
        documents, damaged = read_checkpoints(self._fs, self._dir)
        self.rolled_back_from = None
        self._damaged = [path for _, path, _ in damaged]
        if damaged:
            self._judge_damage(damaged, documents[-1].checkpoint_id if documents else None)
        else:
            for stale in documents[: -self.num_retained]:
                self._fs.rm_file(self._path(stale.checkpoint_id))
        self._retained = documents[-self.num_retained :]
        self._counts = Counter()
        for completed in self._retained:
            self._counts.update(completed.shared_keys())
        if not damaged:
            self._remove_orphan_snapshots()
            self.collect_orphans()
        return self.latest()

    def bind_storage(self) -> None:
        """Bind the job id on the configured storage to this job's checkpoint directory.

        Another job (another checkpoint directory) with the same job id on the same
        storage would discard and collect this job's data: it is refused at its start.

        :raises JobConflictError: when the job id is bound to another checkpoint directory.
        """
        with load_storage(self._config, job_id=self._job) as storage:
            storage.bind_job(self.url)

    @property
    def url(self) -> str:
        """This job's checkpoint directory as a URL: the identity its storages record."""
        return str(self._fs.unstrip_protocol(self._dir))

    def _judge_damage(self, damaged: list[tuple[int, str, str]], newest_intact: int | None) -> None:
        """Fail on a damaged newest document, or roll back when ``on_damaged`` allows it."""
        damaged.sort()
        newest_id, path, reason = damaged[-1]
        if newest_intact is not None and newest_id < newest_intact:
            for _, old_path, old_reason in damaged:
                log.warning(
                    "checkpoint %s is damaged (%s); newer checkpoints are intact, nothing is deleted as an "
                    "orphan until it is repaired or removed",
                    old_path,
                    old_reason,
                )
            return
        previous = "no checkpoint" if newest_intact is None else f"checkpoint {newest_intact}"
        if self.on_damaged == "fail":
            msg = (
                f"the latest checkpoint is damaged: {reason}. The job stops rather than continue from older "
                f"state. Repair or remove the file, or set state.checkpoints.on-damaged=previous to continue "
                f"from {previous} (a rollback)"
            )
            raise CorruptedError(msg, location=path)
        log.error(
            "ROLLBACK: the latest checkpoint %s is damaged (%s); continuing from %s because "
            "state.checkpoints.on-damaged=previous. Nothing is deleted as an orphan while it stays there",
            path,
            reason,
            previous,
        )
        self.rolled_back_from = newest_id

    def collect_orphans(self) -> int:
        """Delete change data that no retained checkpoint references and that is older than the grace.

        Asks every storage the retained checkpoints use, and the configured one, to
        :meth:`~dstl.spi.StateChangelogStorage.collect_orphans`. Best effort: a
        storage that cannot be opened is logged and skipped.

        :returns: objects deleted.
        """
        self._orphans_collected_at = time.monotonic()
        if self._damage_pending():
            log.warning(
                "orphan collection of job %s skipped: damaged checkpoint documents remain (%s); repair or "
                "remove them",
                self._job,
                ", ".join(self._damaged),
            )
            return 0
        cutoff = time.time() - self.orphan_grace
        live: dict[str, list[ChangelogHandle]] = {}
        for completed in self._retained:
            for snapshot in completed.snapshots.values():
                for handle in snapshot.all_handles:
                    live.setdefault(handle.storage_id, []).append(handle)
        deleted = 0
        for storage_id in sorted({*live, self._config.get(STORAGE_OPTION)}):
            try:
                with self._open_storage(storage_id, live.get(storage_id)) as storage:
                    self._check_grace(storage)
                    deleted += storage.collect_orphans(live.get(storage_id, []), older_than=cutoff)
            except ConfigError:
                raise
            except DstlError as exc:
                log.warning("orphan collection on storage %r skipped: %s", storage_id, exc)
        if deleted:
            log.info("orphan collection deleted %d objects of job %s", deleted, self._job)
        return deleted

    def _check_grace(self, storage: StateChangelogStorage) -> None:
        """Refuse a grace shorter than an upload of ``storage`` may legitimately take (it is in flight)."""
        if self.orphan_grace < storage.longest_upload:
            msg = (
                f"state.checkpoints.orphan-collection.grace={self.orphan_grace:g}s is shorter than an "
                f"upload of storage {storage.identifier!r} may take ({storage.longest_upload:g}s): orphan "
                "collection would delete uploads in flight. Raise the grace or lower the storage's upload "
                "timeout and attempts"
            )
            raise ConfigError(msg)

    def _damage_pending(self) -> bool:
        """Whether a damaged document found at recovery is still there (not replaced by a completed one)."""
        retained = {self._path(c.checkpoint_id) for c in self._retained}
        self._damaged = [path for path in self._damaged if path not in retained and self._fs.exists(path)]
        return bool(self._damaged)

    def _open_storage(self, storage_id: str, handles: list[ChangelogHandle] | None) -> StateChangelogStorage:
        if handles:
            return storage_for_handle(handles[0], self._config, job_id=self._job)
        return load_storage(self._config, job_id=self._job)

    def _remove_orphan_snapshots(self) -> None:
        referenced = {key[1] for key in self._counts if key[0] == "snapshot"}
        base = f"{self._root}/{self._job}/snapshots"
        if not self._fs.exists(base):
            return
        for path in self._fs.find(base):
            relative = path[len(self._root) + 1 :]
            if path.endswith(".snap") and relative not in referenced:
                log.info("removing orphan snapshot %s", relative)
                self._fs.rm_file(path)
