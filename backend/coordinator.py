"""Checkpoint coordinator (driver side): completed checkpoints, retention, shared state.

A completed checkpoint is a JSON document ``<dir>/<job>/checkpoints/chk-<id>.json``
naming every operator instance's :class:`BackendSnapshot`. The shared-state
registry counts, per log location and per snapshot object, the retained
checkpoints that reference it; when the count drops to zero the object is
discarded (log locations through their storage, snapshots from the directory).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dstl.spi import (
    ChangelogHandle,
    Config,
    ConfigError,
    InvalidHandleError,
    KeyGroupRange,
    SequenceNumberRange,
    storage_for_handle,
)

from .changelog import BackendSnapshot

log = logging.getLogger(__name__)

__all__ = ["CheckpointCoordinator", "CompletedCheckpoint"]

_PREFIX = "chk-"


@dataclass(frozen=True)
class CompletedCheckpoint:
    """Checkpoint ``checkpoint_id``: a snapshot per operator instance (keyed by a name)."""

    checkpoint_id: int
    snapshots: Mapping[str, BackendSnapshot]

    def to_json(self) -> str:
        """The metadata document."""
        return json.dumps(
            {
                "checkpoint_id": self.checkpoint_id,
                "snapshots": {name: json.loads(s.to_json()) for name, s in sorted(self.snapshots.items())},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> CompletedCheckpoint:
        """Parse and validate (metadata is read back from shared storage: untrusted)."""
        try:
            doc = json.loads(text)
            checkpoint_id = doc["checkpoint_id"]
            snapshots = doc["snapshots"]
        except (ValueError, TypeError, KeyError) as exc:
            msg = f"not a dstl checkpoint: {exc}"
            raise InvalidHandleError(msg) from exc
        if not isinstance(checkpoint_id, int) or not isinstance(snapshots, dict):
            msg = "checkpoint metadata needs an integer checkpoint_id and a snapshots object"
            raise InvalidHandleError(msg)
        return cls(
            checkpoint_id, {str(k): BackendSnapshot.from_json(json.dumps(v)) for k, v in snapshots.items()}
        )

    def shared_keys(self) -> set[tuple[Any, ...]]:
        """Every log location and snapshot this checkpoint references."""
        keys: set[tuple[Any, ...]] = set()
        for snapshot in self.snapshots.values():
            for handle in snapshot.handles:
                for location in handle.locations:
                    keys.add(("log", handle.storage_id, handle.log_id, handle.epoch, location))
            for ref in snapshot.materialized:
                keys.add(("snapshot", ref.path))
        return keys


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
    ) -> None:
        import fsspec

        if num_retained < 1:
            msg = f"num_retained must be at least 1, got {num_retained}"
            raise ValueError(msg)
        self._fs, root = fsspec.core.url_to_fs(checkpoints_dir)
        self._root = root.rstrip("/")
        self._dir = f"{self._root}/{job_id}/checkpoints"
        self._job = job_id
        self.num_retained = num_retained
        self._config = Config.of(config)
        self._retained: list[CompletedCheckpoint] = []
        self._counts: Counter[tuple[Any, ...]] = Counter()
        self._fs.makedirs(self._dir, exist_ok=True)

    @classmethod
    def from_config(cls, config: Config | Mapping[str, Any], job_id: str) -> CheckpointCoordinator:
        """A coordinator under ``state.checkpoints.dir`` keeping ``state.checkpoints.num-retained``."""
        cfg = Config.of(config)
        directory = cfg["state.checkpoints.dir"]
        if not directory:
            msg = "the checkpoint coordinator needs state.checkpoints.dir (an fsspec URL)"
            raise ConfigError(msg)
        return cls(directory, job_id, num_retained=int(cfg["state.checkpoints.num-retained"]), config=cfg)

    def _path(self, checkpoint_id: int) -> str:
        return f"{self._dir}/{_PREFIX}{checkpoint_id:012d}.json"

    # -- completing --------------------------------------------------------------------------------
    def complete(self, checkpoint_id: int, snapshots: Mapping[str, BackendSnapshot]) -> CompletedCheckpoint:
        """Record checkpoint ``checkpoint_id`` as completed; subsume the ones beyond retention."""
        if self._retained and checkpoint_id <= self._retained[-1].checkpoint_id:
            msg = f"checkpoint {checkpoint_id} is not newer than {self._retained[-1].checkpoint_id}"
            raise ValueError(msg)
        completed = CompletedCheckpoint(checkpoint_id, dict(snapshots))
        self._write(completed)
        self._counts.update(completed.shared_keys())
        self._retained.append(completed)
        while len(self._retained) > self.num_retained:
            self._subsume(self._retained.pop(0))
        return completed

    def abort_from(self, checkpoint_id: int) -> None:
        """Forget completed checkpoints ``>= checkpoint_id`` (their batch is being replayed).

        What only they referenced is discarded; the older retained ones stay intact.
        """
        while self._retained and self._retained[-1].checkpoint_id >= checkpoint_id:
            self._subsume(self._retained.pop())

    def _write(self, completed: CompletedCheckpoint) -> None:
        # Write under a temporary name, then move: readers never see half a document.
        final = self._path(completed.checkpoint_id)
        temporary = f"{self._dir}/.tmp-{uuid.uuid4().hex}"
        self._fs.pipe_file(temporary, completed.to_json().encode())
        self._fs.mv(temporary, final)

    def _subsume(self, old: CompletedCheckpoint) -> None:
        released = []
        for key in old.shared_keys():
            self._counts[key] -= 1
            if self._counts[key] <= 0:
                del self._counts[key]
                released.append(key)
        self._discard(released)
        self._fs.rm_file(self._path(old.checkpoint_id))

    def _discard(self, keys: list[tuple[Any, ...]]) -> None:
        by_log: dict[tuple[str, str, int], list[Any]] = {}
        for key in keys:
            if key[0] == "snapshot":
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

        Metadata beyond ``num_retained``, half-written temporary files and snapshot
        objects no retained checkpoint references are deleted before new
        checkpoints start.
        """
        documents = []
        for path in self._fs.ls(self._dir, detail=False):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(".tmp-"):
                self._fs.rm_file(path)
            elif name.startswith(_PREFIX) and name.endswith(".json"):
                try:
                    documents.append(CompletedCheckpoint.from_json(self._fs.cat_file(path).decode()))
                except InvalidHandleError as exc:
                    log.warning("ignoring unreadable checkpoint metadata %s: %s", path, exc)
        documents.sort(key=lambda c: c.checkpoint_id)
        for stale in documents[: -self.num_retained]:
            self._fs.rm_file(self._path(stale.checkpoint_id))
        self._retained = documents[-self.num_retained :]
        self._counts = Counter()
        for completed in self._retained:
            self._counts.update(completed.shared_keys())
        self._remove_orphan_snapshots()
        return self.latest()

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
