"""Savepoints: a checkpoint's state as self-contained full snapshots, with no log and no storage.

``dstl savepoint CHECKPOINT_DIR TARGET`` restores each operator instance of a
checkpoint read-only and writes one full snapshot of it under ``TARGET``, next to
``savepoint.json`` (the instances, their key groups, the watermark and next
timers). A job started with ``state.savepoint.path=TARGET`` and no checkpoint of
its own copies the snapshots into its ``state.checkpoints.dir`` and continues from
them, whatever its storage: nothing refers to the old job's logs.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dstl.spi import Config, InvalidHandleError

from ..changelog import BackendSnapshot, ChangelogKeyedStateBackend
from ..documents import check_regular_file, load_document, read_regular_file
from ..filesystems import checkpoint_fs, put_atomically
from ..materialization import MaterializationRef
from ..options import BACKEND_MAX_PARALLELISM
from .completed import CompletedCheckpoint, TimeProgress
from .location import CheckpointLocation, instance_key_groups, restored_read_only

__all__ = ["SAVEPOINT_FILE", "Savepoint", "adopt_savepoint", "read_savepoint", "write_savepoint"]

SAVEPOINT_FILE = "savepoint.json"
SAVEPOINT_VERSION = 1


@dataclass(frozen=True)
class Savepoint:
    """What ``savepoint.json`` says: the source job and checkpoint, and a full snapshot per instance."""

    job: str
    checkpoint_id: int
    max_parallelism: int
    snapshots: Mapping[str, BackendSnapshot]
    time: TimeProgress = field(default_factory=TimeProgress)

    def to_json(self) -> str:
        """The document: the source job and parallelism around a checkpoint document."""
        checkpoint = CompletedCheckpoint(self.checkpoint_id, self.snapshots, self.time)
        return json.dumps(
            {
                "version": SAVEPOINT_VERSION,
                "job": self.job,
                "max_parallelism": self.max_parallelism,
                "checkpoint": json.loads(checkpoint.to_json()),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes, source: str) -> Savepoint:
        """Parse and validate (a savepoint may come from anywhere: untrusted).

        :raises InvalidHandleError: naming ``source`` and what is wrong.
        """
        fields = {"version": int, "job": str, "max_parallelism": int, "checkpoint": dict}
        doc = load_document(text, source, fields)
        if doc["version"] != SAVEPOINT_VERSION:
            msg = f"{source} has version {doc['version']}; this dstl reads version {SAVEPOINT_VERSION}"
            raise InvalidHandleError(msg)
        checkpoint = CompletedCheckpoint.from_json(json.dumps(doc["checkpoint"]), source=source)
        for name, snapshot in checkpoint.snapshots.items():
            if snapshot.handles or snapshot.parts or len(snapshot.materialized) != 1:
                msg = f"{source}: instance {name!r:.60} is not one self-contained full snapshot"
                raise InvalidHandleError(msg)
        return cls(
            doc["job"],
            checkpoint.checkpoint_id,
            doc["max_parallelism"],
            checkpoint.snapshots,
            checkpoint.time,
        )


def write_savepoint(
    location: CheckpointLocation,
    completed: CompletedCheckpoint,
    target: str,
    config: Config | Mapping[str, Any],
) -> Savepoint:
    """Write checkpoint ``completed``'s state under ``target`` as one full snapshot per instance.

    Each instance is restored read-only (a temporary LMDB file: memory stays flat)
    and materialized in full; ``savepoint.json`` is written last, so a target
    without it holds no savepoint.

    :raises InvalidHandleError: when ``target`` holds a savepoint already.
    """
    cfg = Config.of(config)
    fs, root = checkpoint_fs(target, cfg)
    target_url = str(fs.unstrip_protocol(root)).rstrip("/")
    for inside in filter(None, (location.url, location.spark_url)):
        if f"{target_url}/".startswith(f"{inside.rstrip('/')}/"):
            msg = (
                f"{target} lies inside the job's checkpoint directory {inside}: the job's recovery deletes "
                "what it does not know there. Choose a target outside it"
            )
            raise InvalidHandleError(msg)
    if fs.exists(f"{root}/{SAVEPOINT_FILE}"):
        msg = f"{target} holds a savepoint already: choose an empty target"
        raise InvalidHandleError(msg)
    fs.makedirs(root, exist_ok=True)
    max_parallelism = cfg.get(BACKEND_MAX_PARALLELISM)
    snapshots = {}
    for name, snapshot in sorted(completed.snapshots.items()):
        key_groups = instance_key_groups(name, snapshot)
        with restored_read_only(
            snapshot,
            key_groups,
            cfg,
            max_parallelism=max_parallelism,
            snapshot_dir=location.url,
            job_id=location.job,
        ) as restored:
            # a second backend over the restored state writes its snapshot under the target
            writer = ChangelogKeyedStateBackend(
                restored.storage,
                "savepoint",
                key_groups,
                max_parallelism=max_parallelism,
                delegate=restored.delegate,
                snapshot_dir=target,
            )
            try:
                writer.resume(BackendSnapshot(completed.checkpoint_id, ()), restored.registrations())
                ref = writer.materialize().result()  # full: there is no chain of its own
            finally:
                writer.close()
        snapshots[name] = BackendSnapshot(completed.checkpoint_id, (), (ref,))
    savepoint = Savepoint(location.job, completed.checkpoint_id, max_parallelism, snapshots, completed.time)
    put_atomically(fs, root, f"{root}/{SAVEPOINT_FILE}", savepoint.to_json().encode())  # last: it vouches
    return savepoint


def read_savepoint(path: str, config: Config | Mapping[str, Any] | None = None) -> Savepoint:
    """The savepoint under ``path`` (``config``'s checkpoint storage options reach fsspec).

    :raises InvalidHandleError: when there is none, or it is damaged.
    """
    fs, root = checkpoint_fs(path, config)
    document = f"{root}/{SAVEPOINT_FILE}"
    try:
        text = read_regular_file(fs, document, f"savepoint {document}")
    except FileNotFoundError as exc:
        msg = f"{path} holds no savepoint (no {SAVEPOINT_FILE}; state.savepoint.path names its directory)"
        raise InvalidHandleError(msg) from exc
    return Savepoint.from_json(text, f"savepoint {document}")


def adopt_savepoint(
    path: str,
    checkpoints_dir: str,
    job: str,
    max_parallelism: int,
    config: Config | Mapping[str, Any] | None = None,
) -> CompletedCheckpoint:
    """Copy the savepoint's snapshots into ``job``'s snapshot directory: its first state.

    Returns a checkpoint (not completed by any coordinator) naming the copies and
    carrying the savepoint's watermark and timers; the job's first batch continues
    from it, whatever storage it uses.

    Both paths use ``config``'s checkpoint storage options.

    :raises InvalidHandleError: on a damaged savepoint, or one of another max parallelism.
    """
    savepoint = read_savepoint(path, config)
    if savepoint.max_parallelism != max_parallelism:
        msg = (
            f"the savepoint at {path} has state.backend.max-parallelism={savepoint.max_parallelism}, "
            f"the job {max_parallelism}: key groups would not match (set it to {savepoint.max_parallelism})"
        )
        raise InvalidHandleError(msg)
    source_fs, source_root = checkpoint_fs(path, config)
    target_fs, target_root = checkpoint_fs(checkpoints_dir, config)
    folder = f"{job}/snapshots/savepoint-{savepoint.checkpoint_id}-{uuid.uuid4().hex[:8]}"
    snapshots = {}
    for index, (name, snapshot) in enumerate(sorted(savepoint.snapshots.items())):
        (ref,) = snapshot.materialized
        copied = f"{folder}/instance-{index}.snap"  # not the instance name: the document is untrusted
        target_fs.makedirs(f"{target_root.rstrip('/')}/{folder}", exist_ok=True)
        _copy_snapshot(
            source_fs,
            f"{source_root.rstrip('/')}/{ref.path}",
            target_fs,
            f"{target_root.rstrip('/')}/{copied}",
            ref.size,
        )
        moved = MaterializationRef(copied, ref.key_groups, ref.sqn, ref.size, ref.entries, ref.clock)
        snapshots[name] = BackendSnapshot(0, (), (moved,))
    return CompletedCheckpoint(0, snapshots, savepoint.time)


_COPY_CHUNK = 8 << 20


def _copy_snapshot(source_fs: Any, source: str, target_fs: Any, target: str, size: int) -> None:
    """Copy exactly ``size`` bytes of a regular file, or nothing (no partial file stays).

    The savepoint is untrusted: its snapshot may be a link (to ``/dev/zero``, to a
    file outside it), a FIFO, missing, or of another size than recorded.

    :raises InvalidHandleError: naming the file and what is wrong with it.
    """
    try:
        info = check_regular_file(source_fs, source, f"the savepoint's snapshot {source}")
    except FileNotFoundError as exc:
        msg = f"the savepoint's snapshot {source} does not exist"
        raise InvalidHandleError(msg) from exc
    except OSError as exc:
        msg = f"the savepoint's snapshot {source} cannot be read: {exc}"
        raise InvalidHandleError(msg) from exc
    if info.get("size") != size:
        msg = f"the savepoint's snapshot {source} is {info.get('size')} bytes, the savepoint says {size}"
        raise InvalidHandleError(msg)
    try:
        with source_fs.open(source, "rb") as reader, target_fs.open(target, "wb") as writer:
            left = size
            while left:
                chunk = reader.read(min(left, _COPY_CHUNK))
                if not chunk:
                    msg = f"the savepoint's snapshot {source} ended {left} bytes before its recorded size"
                    raise InvalidHandleError(msg)
                writer.write(chunk)
                left -= len(chunk)
    except (OSError, InvalidHandleError) as exc:
        with contextlib.suppress(OSError):
            target_fs.rm_file(target)
        if isinstance(exc, InvalidHandleError):
            raise
        msg = f"copying the savepoint's snapshot {source} to {target} failed: {exc}"
        raise InvalidHandleError(msg) from exc
