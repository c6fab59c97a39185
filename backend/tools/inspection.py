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

from ..changelog import BackendSnapshot, ChangelogKeyedStateBackend
from ..changelog.replay import DecodedChange, decoded_changes
from ..checkpoints import CheckpointLocation, CompletedCheckpoint
from ..keyed import RESERVED_PREFIX, map_key_from_bytes

__all__ = [
    "describe_change",
    "describe_checkpoint",
    "handle_changes",
    "json_safe",
    "state_entries",
]

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


