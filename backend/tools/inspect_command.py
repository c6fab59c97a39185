"""``dstl inspect``: what a checkpoint holds, and the change records of its logs or of a handle.

.. code-block:: text

    dstl inspect CHECKPOINT_DIR [--job J] [--batch N] [--instance NAME] [--log] [--json]
    dstl inspect --handle FILE [--json]

``CHECKPOINT_DIR`` is ``state.checkpoints.dir`` or a Spark query's checkpoint
location. Storages named by handles are opened with ``--config KEY=VALUE``
(under a Spark location, the ``local`` log's directory is found by itself).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from dstl.spi import ChangelogHandle, Config, InvalidHandleError

from .inspection import CheckpointLocation, describe_change, describe_checkpoint, handle_changes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..checkpoints import CompletedCheckpoint

__all__ = ["add_inspect_parser", "add_savepoint_parser", "shown"]

#: C0 and C1 control characters, DEL: an escape sequence in a name must not reach the terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def shown(value: object) -> str:
    """``value`` as text safe to print with rich: markup escaped, control characters as hex escapes.

    Names, paths and reasons come from checkpoints and logs someone else wrote.
    """
    text = _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value))
    return escape(text)


def add_inspect_parser(sub: Any) -> None:
    """Register ``dstl inspect``."""
    parser = sub.add_parser("inspect", help="show what a checkpoint holds, or the change records of a log")
    parser.add_argument("path", nargs="?", help="state.checkpoints.dir, or a Spark checkpoint location")
    parser.add_argument("--job", help="the job (default: the only one)")
    parser.add_argument("--batch", type=int, help="checkpoint id (default: the newest)")
    parser.add_argument("--instance", help="one operator instance, e.g. kg0-64")
    parser.add_argument("--log", action="store_true", help="also decode the change records of the logs")
    parser.add_argument("--handle", metavar="FILE", help="decode the change records of a handle (JSON file)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(run=run_inspect)


def add_savepoint_parser(sub: Any) -> None:
    """Register ``dstl savepoint``."""
    parser = sub.add_parser(
        "savepoint",
        help="write a checkpoint's state as self-contained full snapshots (any storage restores it)",
    )
    parser.add_argument("path", help="state.checkpoints.dir, or a Spark checkpoint location")
    parser.add_argument("target", help="an empty directory or fsspec URL for the savepoint")
    parser.add_argument("--job", help="the job (default: the only one)")
    parser.add_argument("--batch", type=int, help="checkpoint id (default: the newest)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.set_defaults(run=run_savepoint)


def run_savepoint(args: argparse.Namespace, console: Console) -> int:
    """Entry point of ``dstl savepoint``."""
    from ..checkpoints.savepoints import write_savepoint

    location = CheckpointLocation(args.path, args.job, args.config_values)
    chosen = _chosen(location, *location.checkpoints(), args.batch)
    config = location.config(args.config_values)
    with console.status(f"writing a savepoint of checkpoint {chosen.checkpoint_id}"):
        savepoint = write_savepoint(location, chosen, args.target, config)
    total = sum(ref.size for s in savepoint.snapshots.values() for ref in s.materialized)
    console.print(
        f"savepoint of job {shown(repr(savepoint.job))}, checkpoint {savepoint.checkpoint_id}: "
        f"{len(savepoint.snapshots)} instances, {total:,} bytes at {shown(args.target)} "
        "(start a job from it with state.savepoint.path)"
    )
    return 0


def _chosen(
    location: CheckpointLocation,
    documents: list[CompletedCheckpoint],
    damaged: list[tuple[int, str, str]],
    batch: int | None,
) -> CompletedCheckpoint:
    """The newest retained checkpoint of ``documents``, or ``batch``'s."""
    if not documents:
        suffix = f" ({len(damaged)} damaged)" if damaged else ""
        msg = f"job {location.job!r} has no readable checkpoint{suffix}"
        raise InvalidHandleError(msg)
    if batch is None:
        return documents[-1]
    for completed in documents:
        if completed.checkpoint_id == batch:
            return completed
    msg = f"checkpoint {batch} is not retained (retained: {[c.checkpoint_id for c in documents]})"
    raise InvalidHandleError(msg)


def run_inspect(args: argparse.Namespace, console: Console) -> int:
    """Entry point of ``dstl inspect``."""
    progress_console = Console(stderr=True)
    if args.handle:
        with open(args.handle, "rb") as file:
            handle = ChangelogHandle.from_json(file.read())
        config = Config.of(args.config_values)
        _print_changes(console, args.json, _changes([handle], config, progress_console))
        return 0
    if not args.path:
        msg = "give a checkpoint directory, or --handle FILE"
        raise InvalidHandleError(msg)
    location = CheckpointLocation(args.path, args.job, args.config_values)
    documents, damaged = location.checkpoints()
    chosen = _chosen(location, documents, damaged, args.batch)
    described = describe_checkpoint(location, chosen, args.instance)
    described["retained"] = [c.checkpoint_id for c in documents]
    described["damaged"] = [{"checkpoint_id": i, "path": p, "reason": r} for i, p, r in damaged]
    if args.log:
        handles = [handle for name in described["instances"] for handle in chosen.snapshots[name].all_handles]
        config = location.config(args.config_values)
        if args.json:
            print(json.dumps(described), flush=True)
        else:
            _print_checkpoint(console, described)
        _print_changes(console, args.json, _changes(handles, config, progress_console))
        return 0
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        _print_checkpoint(console, described)
    return 0


def _changes(handles: list[ChangelogHandle], config: Config, console: Console) -> Iterable[dict[str, Any]]:
    """Every change record of ``handles``, with a progress bar (on stderr) by bytes read."""
    total = sum(handle.size for handle in handles)
    with Progress(console=console, transient=True, disable=total < 1 << 20) as progress:
        task = progress.add_task("decoding change records", total=total or 1)
        for handle in handles:
            for change, serializer in handle_changes(handle, config):
                yield describe_change(change, serializer)
            progress.advance(task, handle.size)


def _print_changes(console: Console, as_json: bool, changes: Iterable[dict[str, Any]]) -> None:
    if as_json:
        for change in changes:
            sys.stdout.write(json.dumps(change) + "\n")
        return
    table = Table(title="change records")
    for column in ("sqn", "key group", "op", "state", "key", "values"):
        table.add_column(column, overflow="fold")
    count = 0
    for change in changes:
        count += 1
        table.add_row(
            str(change["sqn"]),
            str(change["key_group"]),
            shown(change["op"]),
            shown(change["state"]),
            shown(json.dumps(change["key"])),
            shown(json.dumps(change["args"])[:200]),
        )
    console.print(table)
    console.print(f"{count} change records")


def _print_checkpoint(console: Console, described: dict[str, Any]) -> None:
    head = f"job {shown(repr(described['job']))}, checkpoint {described['checkpoint_id']}"
    if described["watermark_ms"] is not None:
        head += f", watermark {described['watermark_ms']} ms ({_when(described['watermark_ms'])})"
    console.print(f"[bold]{head}[/] (retained: {described['retained']})")
    for item in described["damaged"]:
        where, reason = shown(item["path"]), shown(item["reason"])
        console.print(f"[red]damaged[/] checkpoint {item['checkpoint_id']}: {where}: {reason}")
    table = Table()
    for column in ("instance", "snapshots", "snapshot bytes", "log handles", "log bytes", "SQN ranges"):
        table.add_column(column, overflow="fold")
    states: dict[str, str] = {}
    for name, snapshot in described["instances"].items():
        for label, part in [
            (name, snapshot),
            *((f"  part {p['key_groups']}", p) for p in snapshot.get("parts", ())),
        ]:
            table.add_row(
                shown(label),
                str(len(part["materialized"])),
                f"{part['snapshot_bytes']:,}",
                str(len(part["handles"])),
                f"{part['log_bytes']:,}",
                ", ".join(f"{h['sqn_range'][0]}-{h['sqn_range'][1]}" for h in part["handles"]),
            )
            states[label.strip()] = _states_line(part["states"])
    console.print(table)
    for label, line in states.items():
        console.print(f"states of {shown(label)}: {shown(line)}")
    timers = described["next_timers"]
    if timers:
        at = [f"{shown(name)} at {expiry} ({_when(expiry)})" for name, expiry in sorted(timers.items())]
        console.print("next timers: " + ", ".join(at))


def _when(epoch_ms: int) -> str:
    """Epoch milliseconds as UTC time (a document may hold any value: out of range says so)."""
    try:
        moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "out of range"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _states_line(states: dict[str, dict[str, Any]]) -> str:
    """The user's states with their kind; dstl's own (``__dstl.*``: timers, indexes) counted."""
    own = [name for name in states if name.startswith("__dstl.")]
    line = ", ".join(f"{name} ({v['kind']})" for name, v in states.items() if name not in own)
    return f"{line} (+{len(own)} of dstl's: timers and their indexes)" if own else line or "none"
