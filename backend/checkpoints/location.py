"""A job's checkpoint location, read only: its checkpoints, snapshots, and the state they hold."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dstl.spi import Config, InvalidHandleError, KeyGroupRange

from ..changelog import BackendSnapshot, ChangelogKeyedStateBackend
from ..documents import check_regular_file
from ..filesystems import checkpoint_fs
from ..keygroups import parse_instance_name
from ..materialization import MaterializationRef, read_sections
from ..options import CHECKPOINTS_DIR
from ..serialization import serializer_for, untrusted_serializer_for
from .completed import CompletedCheckpoint, read_checkpoints

__all__ = ["SPARK_STATE_DIR", "CheckpointLocation", "instance_key_groups", "restored_read_only"]

#: Where a Spark query keeps dstl's state checkpoints, under its checkpoint location.
SPARK_STATE_DIR = CHECKPOINTS_DIR.under_checkpoint.directory  # type: ignore[union-attr]


class CheckpointLocation:
    """A state checkpoint directory (``state.checkpoints.dir``) or a Spark query's checkpoint location.

    :param path: a local path or fsspec URL.
    :param job: the job to look at; by default the only one there.
    :param config: its ``state.checkpoints.storage-options.*`` reach fsspec.
    :raises InvalidHandleError: when there is no job, or several and none was chosen.
    """

    def __init__(self, path: str, job: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.fs, root = checkpoint_fs(path, config)
        if not self.fs.isdir(root):
            msg = f"{path} is no directory (give state.checkpoints.dir or a Spark checkpoint location)"
            raise InvalidHandleError(msg)
        self.spark_location: str | None = None
        if self.fs.isdir(f"{root}/{SPARK_STATE_DIR}"):  # a Spark checkpoint location
            self.spark_location = root
            root = f"{root}/{SPARK_STATE_DIR}"
        self.root = root
        jobs = sorted(
            entry.rsplit("/", 1)[-1]
            for entry in self.fs.ls(root, detail=False)
            if self.fs.isdir(f"{entry}/checkpoints")
        )
        if job is None:
            if len(jobs) != 1:
                msg = f"{path} holds the jobs {jobs}: choose one with --job"
                if not jobs:
                    msg = f"{path} holds no job's checkpoints (is it state.checkpoints.dir?)"
                raise InvalidHandleError(msg)
            job = jobs[0]
        elif job not in jobs:
            msg = f"{path} has no job {job!r} (it has {jobs})"
            raise InvalidHandleError(msg)
        self.job = job

    @property
    def url(self) -> str:
        """The state checkpoint directory as a URL (``state.checkpoints.dir`` of the job)."""
        return str(self.fs.unstrip_protocol(self.root))

    @property
    def spark_url(self) -> str | None:
        """The Spark checkpoint location as a URL, when this is one."""
        return None if self.spark_location is None else str(self.fs.unstrip_protocol(self.spark_location))

    def checkpoints(self) -> tuple[list[CompletedCheckpoint], list[tuple[int, str, str]]]:
        """The job's checkpoints, oldest first, and the damaged documents."""
        return read_checkpoints(self.fs, f"{self.root}/{self.job}/checkpoints")

    def config(self, extra: Mapping[str, Any]) -> Config:
        """What opens the storages of the handles: ``extra``, plus the Spark layout's defaults."""
        config = Config.of(extra)
        if self.spark_location is None:
            return config
        return config.under_checkpoint(str(self.fs.unstrip_protocol(self.spark_location)))

    def snapshot_meta(self, ref: MaterializationRef) -> dict[str, Any]:
        """The meta of a snapshot object (registrations, SQN, key groups), reading only its tail."""
        path = f"{self.root}/{ref.path}"
        check_regular_file(self.fs, path, f"snapshot {path}")

        def read_range(start: int, end: int) -> bytes:
            return self.fs.cat_file(path, start=start, end=end)

        meta, _ = read_sections(read_range, ref.key_groups, where=path, size=ref.size)
        return meta


@contextmanager
def restored_read_only(
    snapshot: BackendSnapshot,
    key_groups: KeyGroupRange,
    config: Config | Mapping[str, Any],
    *,
    max_parallelism: int,
    snapshot_dir: str,
    job_id: str,
    allow_pickle: bool = False,
) -> Iterator[ChangelogKeyedStateBackend]:
    """A backend holding ``snapshot``'s state, restored without touching the job's logs.

    Its own writer goes to a private in-memory log (nothing is fenced or written
    where the job keeps its state); the handles are read through their own
    storages, opened with ``config``. The state lives in a temporary LMDB file.
    ``job_id`` is the job whose snapshots it reads (references outside it are refused).
    Values of pickle states read as ``{"bytes": n}`` unless ``allow_pickle`` (which
    trusts whoever wrote the checkpoint: unpickling runs their code).
    """
    import tempfile

    from dstl.spi.memory import private_storage

    from ..delegate import LmdbDelegate

    with (
        tempfile.TemporaryDirectory(prefix="dstl-read-") as workdir,
        private_storage(job_id, "read-only") as storage,
    ):
        delegate = LmdbDelegate(Path(workdir) / "state")
        backend = ChangelogKeyedStateBackend(
            storage,
            "read-only",
            key_groups,
            max_parallelism=max_parallelism,
            delegate=delegate,
            snapshot_dir=snapshot_dir,
            serializers=serializer_for if allow_pickle else untrusted_serializer_for,
        )
        try:
            backend.restore(snapshot, config)
            yield backend
        finally:
            backend.close()
            delegate.close()


def instance_key_groups(name: str, snapshot: BackendSnapshot) -> KeyGroupRange:
    """The key groups of the operator instance ``name`` of a checkpoint.

    From its name when it is one of :func:`~.keygroups.instance_name` (the Spark
    driver's), else from its own logs and snapshots (rescale parts may cover
    more than the instance, so they count only when there is nothing else).

    :raises InvalidHandleError: for a snapshot that holds nothing.
    """
    try:
        return parse_instance_name(name)
    except ValueError:
        pass
    ranges = [h.key_groups for h in snapshot.handles] + [r.key_groups for r in snapshot.materialized]
    ranges = ranges or [owned for owned, _ in snapshot.parts]
    if not ranges:
        msg = f"instance {name!r:.60} of checkpoint {snapshot.checkpoint_id} holds no log and no snapshot"
        raise InvalidHandleError(msg)
    return KeyGroupRange(min(r.start for r in ranges), max(r.end for r in ranges))
