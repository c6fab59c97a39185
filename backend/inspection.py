"""Look into a checkpoint, read only: its snapshots, log handles, states and change records.

``dstl inspect`` is the command line over it. Nothing here writes, deletes or
recovers: a running job's directories can be inspected. Values are never
unpickled (a state stored with pickle shows its size only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack

from dstl.spi import ChangelogHandle, Config, InvalidHandleError, KeyGroupRange, storage_for_handle

from .changelog import BackendSnapshot
from .changelog.replay import DecodedChange, decoded_changes
from .coordinator import CompletedCheckpoint, read_checkpoints
from .materialization import MaterializationRef, read_sections
from .state import map_key_from_bytes

__all__ = ["CheckpointLocation", "describe_change", "describe_checkpoint", "handle_changes"]

#: Where a Spark query keeps dstl's state checkpoints and the ``local`` log, under its checkpoint location.
SPARK_STATE_DIR, SPARK_LOCAL_LOG_DIR = "dstl-state", "dstl-changelog"


class CheckpointLocation:
    """A state checkpoint directory (``state.checkpoints.dir``) or a Spark query's checkpoint location.

    :param path: a local path or fsspec URL.
    :param job: the job to look at; by default the only one there.
    :raises InvalidHandleError: when there is no job, or several and none was chosen.
    """

    def __init__(self, path: str, job: str | None = None) -> None:
        import fsspec

        self.fs, root = fsspec.core.url_to_fs(path)
        root = root.rstrip("/")
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

    def checkpoints(self) -> tuple[list[CompletedCheckpoint], list[tuple[int, str, str]]]:
        """The job's checkpoints, oldest first, and the damaged documents."""
        return read_checkpoints(self.fs, f"{self.root}/{self.job}/checkpoints")

    def config(self, extra: Mapping[str, Any]) -> Config:
        """What opens the storages of the handles: ``extra``, plus the Spark layout's local log dir."""
        values = dict(extra)
        if self.spark_location is not None and "dstl.local.dir" not in values:
            values["dstl.local.dir"] = f"{self.spark_location}/{SPARK_LOCAL_LOG_DIR}"
        return Config.of(values)

    def snapshot_meta(self, ref: MaterializationRef) -> dict[str, Any]:
        """The meta of a snapshot object (registrations, SQN, key groups), reading only its tail."""
        path = f"{self.root}/{ref.path}"

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
        except Exception as exc:  # noqa: BLE001 - shown, not fatal: inspecting damage is a use
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
    return {
        "storage": handle.storage_id,
        "log_id": handle.log_id,
        "epoch": handle.epoch,
        "key_groups": [handle.key_groups.start, handle.key_groups.end],
        "sqn_range": [handle.sqn_range.start, handle.sqn_range.end],
        "bytes": handle.size,
        "locations": len(handle.locations),
    }


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

    with storage_for_handle(handle, config, job_id="inspect") as storage:
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


def _key(raw: bytes) -> Any:  # noqa: ANN401
    try:
        return _plain(map_key_from_bytes(raw))
    except Exception:  # noqa: BLE001 - a key another serializer wrote: show its bytes
        return raw.hex()


def _value(arg: Any) -> Any:  # noqa: ANN401
    if not isinstance(arg, bytes):
        return _plain(arg)
    try:
        return _plain(msgpack.unpackb(arg, raw=False, strict_map_key=False))
    except Exception:  # noqa: BLE001 - shown as bytes
        return {"bytes": len(arg)}


def _opaque(arg: Any) -> Any:  # noqa: ANN401
    return {"bytes": len(arg)} if isinstance(arg, bytes) else _plain(arg)


def _plain(value: Any) -> Any:  # noqa: ANN401
    """JSON-safe: bytes as hex, tuples as lists, map keys as strings."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    return value
