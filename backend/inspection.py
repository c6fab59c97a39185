"""Look into a checkpoint, read only: its snapshots, log handles, states and change records.

``dstl inspect`` is the command line over it. Nothing here writes, deletes or
recovers: a running job's directories can be inspected. Values are never
unpickled (a state stored with pickle shows its size only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack

from dstl.spi import ChangelogHandle, Config, InvalidHandleError, KeyGroupRange, storage_for_handle

from .changelog import BackendSnapshot, ChangelogKeyedStateBackend
from .changelog.replay import DecodedChange, decoded_changes
from .coordinator import CompletedCheckpoint, read_checkpoints
from .documents import check_regular_file
from .filesystems import checkpoint_fs
from .keyed import RESERVED_PREFIX, map_key_from_bytes
from .keygroups import parse_instance_name
from .materialization import MaterializationRef, read_sections
from .options import backend_option
from .serialization import serializer_for, untrusted_serializer_for

__all__ = [
    "CheckpointLocation",
    "describe_change",
    "describe_checkpoint",
    "handle_changes",
    "instance_key_groups",
    "json_safe",
    "restored_read_only",
    "state_entries",
]

#: Where a Spark query keeps dstl's state checkpoints, under its checkpoint location.
SPARK_STATE_DIR = backend_option("state.checkpoints.dir").under_checkpoint.directory  # type: ignore[union-attr]


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


def describe_checkpoint(
    location: CheckpointLocation, completed: CompletedCheckpoint, instance: str | None = None
) -> dict[str, Any]:
    """What checkpoint ``completed`` holds: per instance its snapshots, log handles and states.

    :raises InvalidHandleError: when ``instance`` is not in it.
    """
    names = sorted(completed.snapshots)
    if instance is not None:
        if instance not in completed.snapshots:
            msg = f"checkpoint {completed.checkpoint_id} has no instance {instance!r} (it has {names})"
            raise InvalidHandleError(msg)
        names = [instance]
    return {
        "job": location.job,
        "checkpoint_id": completed.checkpoint_id,
        "watermark_ms": completed.time.watermark_ms,
        "next_timers": dict(completed.time.next_timers),
        "instances": {name: _snapshot(location, completed.snapshots[name]) for name in names},
    }


def _snapshot(location: CheckpointLocation, snapshot: BackendSnapshot) -> dict[str, Any]:
    states: dict[str, list[str]] = {}
    materialized = []
    for ref in snapshot.materialized:
        item = {**ref.to_dict(), "bytes": ref.size}
        try:
            meta = location.snapshot_meta(ref)
            item["sqn"] = meta.get("sqn", ref.sqn)
            for name, kind in (meta.get("registrations") or {}).items():
                states.setdefault(str(name), [str(part) for part in kind])
        except Exception as exc:
            item["error"] = f"{type(exc).__name__}: {exc}"
        materialized.append(item)
    handles = [_handle(handle) for handle in snapshot.handles]
    described: dict[str, Any] = {
        "checkpoint_id": snapshot.checkpoint_id,
        "materialized": materialized,
        "bridge": [ref.to_dict() for ref in snapshot.bridge],
        "handles": handles,
        "log_bytes": sum(handle.size for handle in snapshot.handles),
        "snapshot_bytes": sum(ref.size for ref in snapshot.materialized),
        "states": {name: {"kind": kind[0], "serializer": kind[1]} for name, kind in sorted(states.items())},
    }
    if snapshot.parts:
        described["parts"] = [
            {"key_groups": [groups.start, groups.end], **_snapshot(location, part)}
            for groups, part in snapshot.parts
        ]
    return described


def _handle(handle: ChangelogHandle) -> dict[str, Any]:
    """The handle's document, its locations counted rather than listed."""
    return {**handle.to_dict(), "locations": len(handle.locations)}


def handle_changes(
    handle: ChangelogHandle,
    config: Config | Mapping[str, Any],
    key_groups: KeyGroupRange | None = None,
) -> Iterator[tuple[DecodedChange, str]]:
    """The decoded change records of ``handle``, each with its state's serializer, in log order.

    The storage is the handle's own (``storage_for_handle``), opened with ``config``.
    """
    serializers: dict[str, str] = {}

    def registered(name: str, _kind: str, serializer: str) -> None:
        serializers[name] = serializer

    with storage_for_handle(handle, config, job_id="inspect", read_only=True) as storage:
        reader = storage.create_reader()
        try:
            for change in decoded_changes(reader, handle, key_groups, registered):
                yield change, serializers.get(change.state, "")
        finally:
            reader.close()


def describe_change(change: DecodedChange, serializer: str) -> dict[str, Any]:
    """A change record as plain data: its key and values decoded where that is safe (msgpack)."""
    decode: Callable[[Any], Any] = _value if serializer.startswith("msgpack") else _opaque
    return {
        "sqn": change.sqn,
        "key_group": change.key_group,
        "op": change.op.name.lower(),
        "state": change.state,
        "key": _key(change.key),
        "args": [decode(arg) for arg in change.args],
    }


def _key(raw: bytes) -> Any:
    try:
        return json_safe(map_key_from_bytes(raw))
    except Exception:
        return raw.hex()


def _value(arg: Any) -> Any:
    if not isinstance(arg, bytes):
        return json_safe(arg)
    try:
        return json_safe(msgpack.unpackb(arg, raw=False, strict_map_key=False))
    except Exception:
        return {"bytes": len(arg)}


def _opaque(arg: Any) -> Any:
    return {"bytes": len(arg)} if isinstance(arg, bytes) else json_safe(arg)


def json_safe(value: Any) -> Any:
    """JSON-safe: bytes as hex, tuples as lists, map keys as strings."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, dict):
        return {str(json_safe(k)): json_safe(v) for k, v in value.items()}
    return value


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
    import uuid

    from dstl.spi import load_storage

    from .delegate import LmdbDelegate

    private = {"dstl.storage": "memory", "dstl.memory.namespace": f"read-only-{uuid.uuid4().hex}"}
    with (
        tempfile.TemporaryDirectory(prefix="dstl-read-") as workdir,
        load_storage(private, job_id=job_id) as storage,
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


def state_entries(
    backend: ChangelogKeyedStateBackend, *, internal: bool = False
) -> Iterator[tuple[Any, str, str, Any]]:
    """``(key, state name, kind, value)`` of every key and state the backend holds, as the job sees them.

    The key is JSON-safe (a tuple as a list; stored bytes that are no user key, as
    dstl's own timer index has, as hex).

    A list is a list, a map a dict. A TTL's length is not part of the checkpoint,
    so values past it that cleanup has not removed yet are included. dstl's own
    states (timers) only with ``internal``.
    """
    for name, (kind, _) in sorted(backend.registrations().items()):
        if name.startswith(RESERVED_PREFIX) and not internal:
            continue
        state = backend.known_state(name)
        for key_group in backend.key_groups:
            # keys streamed from a view (nothing writes here): memory holds one entry, not a key group
            with backend.delegate.view() as view:
                keys = (raw_key for raw_key, _ in view.entries(name, key_group))
                for raw_key in keys:
                    with backend.bound_to(key_group, raw_key):
                        value = _read(state, kind)
                    if value not in (None, [], {}):
                        yield _key(raw_key), name, kind, value


def _read(state: Any, kind: str) -> Any:
    if kind == "map":
        return dict(state.items())
    if kind in ("list", "reducing"):
        return state.get()
    return state.value()


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
