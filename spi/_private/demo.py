"""A short pure-Python changelog demo: append, persist per checkpoint, restore, verify.

Stands in for the PySpark main job until ``dstl.backend.spark`` exists. An
operator keeps per-user running totals, logs every update to the DSTL, persists
at each checkpoint, and finally restores the totals from the last handle's JSON
through a *fresh* storage instance, as a recovering job would.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..config import Config
from ..handle import ChangelogHandle
from ..plugins import load_storage, storage_for_handle
from ..types import KeyGroupRange

_KEY_GROUPS = KeyGroupRange(0, 128)
_USERS = 1000
_EVENTS_PER_CHECKPOINT = 2000


def _progress_table(rows: list[tuple[int, int, int, int, float]]) -> Table:
    table = Table(title="dstl demo: running totals per user")
    for column in ("checkpoint", "changes", "handle bytes", "uploaded bytes", "persist ms"):
        table.add_column(column, justify="right")
    for row in rows[-10:]:
        table.add_row(*(str(v) for v in row[:4]), f"{row[4]:.2f}")
    return table


def _config(args: argparse.Namespace, workdir: str) -> Config:
    values = dict(args.config_values)
    if args.storage:
        values["dstl.storage"] = args.storage
    base = Config.of(values)
    # Point durable storages at a scratch directory unless the user chose one.
    defaults = {"dstl.local.dir": f"{workdir}/local", "dstl.dfs.base-path": f"file://{workdir}/dfs"}
    known = {opt.name for opt in base.declared_options()}
    extra = {k: v for k, v in defaults.items() if k in known and k not in base}
    return base.with_values(extra) if extra else base


def run_demo(args: argparse.Namespace, console: Console) -> int:
    """Run the demo for ``args.seconds``; returns the exit code (1 on a failed verify)."""
    rng = random.Random(42)
    totals: dict[int, int] = {}
    rows: list[tuple[int, int, int, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="dstl-demo-") as workdir:
        config = _config(args, workdir)
        console.print(f"storage: [bold]{config['dstl.storage']}[/bold]")
        storage = load_storage(config, job_id="demo")
        handle_json = ""
        with storage, Live(_progress_table(rows), console=console, transient=False) as live:
            writer = storage.create_writer("running-totals", _KEY_GROUPS, epoch=0)
            deadline = time.monotonic() + args.seconds
            checkpoint = 0
            while time.monotonic() < deadline:
                checkpoint += 1
                for _ in range(_EVENTS_PER_CHECKPOINT):
                    user = rng.randrange(_USERS)
                    totals[user] = totals.get(user, 0) + rng.randrange(1, 100)
                    writer.append(user % len(_KEY_GROUPS), json.dumps([user, totals[user]]).encode())
                started = time.perf_counter()
                handle = writer.persist(writer.initial_sqn(), checkpoint).result(timeout=30)
                elapsed = (time.perf_counter() - started) * 1000
                writer.confirm(handle.sqn_range.start, handle.sqn_range.end, checkpoint)
                handle_json = handle.to_json()
                rows.append(
                    (checkpoint, _EVENTS_PER_CHECKPOINT, handle.size, handle.incremental_size, elapsed)
                )
                live.update(_progress_table(rows))
            writer.close()
        console.print()
        restored = _restore(handle_json, config)
        ok = restored == totals
        console.print(
            f"{checkpoint} checkpoints, {len(totals)} users; restore from the last handle "
            f"through a fresh storage: {'PASS' if ok else 'FAIL'}"
        )
        return 0 if ok or not args.verify else 1


def _restore(handle_json: str, config: Config) -> dict[int, int]:
    handle = ChangelogHandle.from_json(handle_json)
    restored: dict[int, int] = {}
    with storage_for_handle(handle, config, job_id="demo-restore") as fresh:
        for change in fresh.create_reader().read(handle):
            user, total = json.loads(change.data)
            restored[user] = total
    return restored
