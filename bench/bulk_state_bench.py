"""What a batch's bulk state work costs per key, against what the LMDB store alone costs.

One instance's batch of a running count on the batch API (``key_set``, ``get_many``,
``update_many``, the checkpoint's persist), over a working state of growing size,
beside the floor of the store itself: the delegate's bulk read and write of the same
keys' values (one lookup per key in a read transaction; one ``putmulti`` and its commit),
with no log, no value decoded or encoded, nothing tracked. Keys are spelled like
user ids and come in the store's order, as a Spark task's do; the batch updates
keys the state holds, bound with their key groups as Spark's routing gives them.

Then the state is materialized and restored in full into a fresh store (as a task
restores an instance whose copy was lost), and the restored copy's first batches
are timed: what the store alone adds to a recovered instance's first batches.

Goal 3a of the speed issue asks a whole batch within 1.3x of a stateless floor that
moves the same rows; this bench shows how much of that budget the store's own
per-key work already takes.

    python -m bench.bulk_state_bench [--state-keys 500000,2000000,4000000] [--batch-keys 500000]
        [--json PATH] [--markdown PATH] [--plot PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import _table
from bench.spark_stores import KEY_SHAPES
from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.delegate import LmdbDelegate
from dstl.spi import KeyGroupRange, load_storage

__all__ = ["main", "measure"]

ALL = KeyGroupRange(0, 128)
#: Keys a loading step writes at once (as a batch of new keys would).
LOAD_STEP = 500_000
PHASES = ("bind", "get_many", "update_many", "persist")
FLOOR_PHASES = ("lmdb get", "lmdb put and commit")
#: Batches measured on a copy restored in full from the materialized state.
AFTER_RESTORE = 2


def _ordered(backend: ChangelogKeyedStateBackend, keys: list[str]) -> tuple[list[str], list[int]]:
    """``keys`` in the store's order (key group, stored bytes), as a Spark task groups them; their groups.

    The key groups stand for Spark's routing (the JVM computes them): bound with them, a
    batch's keys are not hashed again in Python.
    """
    bound = backend.key_set(keys)
    order = sorted(range(len(keys)), key=lambda i: (bound.groups[i], len(bound.raw[i]), bound.raw[i]))
    return [keys[i] for i in order], [bound.groups[i] for i in order]


def _batch(
    backend: ChangelogKeyedStateBackend, keys: list[str], routed: list[int], checkpoint_id: int
) -> dict[str, Any]:
    """One batch of the running count over ``keys``: its phases, seconds, and the keys bound."""
    count = backend.value_state("n")
    phases: dict[str, Any] = {}
    began = time.perf_counter()
    bound = backend.key_set(keys, key_groups=routed)
    phases["bind"] = time.perf_counter() - began
    began = time.perf_counter()
    previous = count.get_many(bound)
    phases["get_many"] = time.perf_counter() - began
    began = time.perf_counter()
    count.update_many(bound, [(p or 0) + 1 for p in previous])
    phases["update_many"] = time.perf_counter() - began
    began = time.perf_counter()
    backend.checkpoint(checkpoint_id).result(timeout=600)
    phases["persist"] = time.perf_counter() - began
    return {"phases": phases, "bound": bound, "previous": previous}


def _ms(phases: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds * 1000, 1) for name, seconds in phases.items()}


def measure(state_keys: int, batch_keys: int, workdir: Path, seed: int = 7) -> dict[str, Any]:
    """A steady batch over ``state_keys`` keys, the store's floor, and the batches after a full restore, ms.

    The restored copy (the state materialized, then loaded into a fresh store, as a
    task restores an instance whose copy was lost) runs :data:`AFTER_RESTORE` batches
    of other keys: what a lost instance's first batches cost in the store alone.
    """
    key = KEY_SHAPES["random"]
    config = {"dstl.storage": "local", "dstl.local.dir": str(workdir / "log")}
    snapshots = str(workdir / "snapshots")
    delegate = LmdbDelegate(workdir / "lmdb", map_size=1 << 34)
    with load_storage(config, job_id="bulk-bench") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, delegate=delegate, snapshot_dir=snapshots)
        count = backend.value_state("n")
        for start in range(0, state_keys, LOAD_STEP):  # load: new keys, a step at a time
            keys = [key(n) for n in range(start, min(state_keys, start + LOAD_STEP))]
            ordered, groups = _ordered(backend, keys)
            bound = backend.key_set(ordered, key_groups=groups)
            count.update_many(bound, [1] * len(keys))
            backend.checkpoint(start // LOAD_STEP).result(timeout=600)
        rng = random.Random(seed)
        batches = [
            _ordered(backend, [key(n) for n in rng.sample(range(state_keys), batch_keys)])
            for _ in range(1 + AFTER_RESTORE)
        ]
        steady = _batch(backend, *batches[0], checkpoint_id=10**6)
        bound = steady["bound"]
        expected = [(p or 0) + 1 for p in steady["previous"]]
        # the store's own floor: the delegate's bulk read and write of the same keys (one read
        # transaction of lookups; one write transaction: putmulti and commit), nothing else
        floor: dict[str, float] = {}
        began = time.perf_counter()
        found = delegate.get_values("n", bound.groups, bound.raw)
        floor["lmdb get"] = time.perf_counter() - began
        began = time.perf_counter()
        delegate.put_values("n", bound.groups, bound.raw, found)
        floor["lmdb put and commit"] = time.perf_counter() - began
        exact = count.get_many(bound) == expected  # the floor wrote back what the batch wrote
        backend.materialize().result(timeout=1800)
        snapshot = backend.checkpoint(10**6 + 1).result(timeout=600)
        backend.close()
        delegate.close()
        restored_store = LmdbDelegate(workdir / "restored", map_size=1 << 34)
        restored = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=1, delegate=restored_store, snapshot_dir=snapshots
        )
        began = time.perf_counter()
        restored.restore(snapshot)
        restore_s = time.perf_counter() - began
        after = []
        for index, (keys, routed) in enumerate(batches[1:]):
            ran = _batch(restored, keys, routed, checkpoint_id=10**6 + 2 + index)
            after.append(_ms(ran["phases"]))
            check = restored.value_state("n").get_many(ran["bound"])
            exact = exact and check == [(p or 0) + 1 for p in ran["previous"]] and all(ran["previous"])
        restored.close()
        restored_store.close()
    return {
        "state_keys": state_keys,
        "batch_keys": batch_keys,
        "phases_ms": _ms(steady["phases"]),
        "floor_ms": _ms(floor),
        "restore_s": round(restore_s, 2),
        "after_restore_ms": after,
        "exact": exact,
    }


def _rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        total = sum(r["phases_ms"].values())
        floor = sum(r["floor_ms"].values())
        rows.append(
            [
                f"{r['state_keys']:,}",
                *(f"{r['phases_ms'][name]:,.0f}" for name in PHASES),
                f"{total:,.0f}",
                *(f"{r['floor_ms'][name]:,.0f}" for name in FLOOR_PHASES),
                f"{floor:,.0f}",
                f"{floor / total:.0%}",
                f"{total * 1000 / r['batch_keys']:.2f}",
                f"{r['restore_s']:,.1f}",
                " / ".join(f"{sum(after.values()):,.0f}" for after in r["after_restore_ms"]),
            ]
        )
    return rows


COLUMNS = [
    "state keys",
    *(f"{name} ms" for name in PHASES),
    "batch ms",
    *(f"{name} ms" for name in FLOOR_PHASES),
    "store floor ms",
    "floor share",
    "us / key",
    "full restore s",
    "batches after it ms",
]


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    labels = [f"{r['state_keys'] / 1e6:g}M" for r in results]
    positions = range(len(results))
    width = 0.38
    bottom = [0.0] * len(results)
    for name in PHASES:
        values = [r["phases_ms"][name] for r in results]
        axes.bar([p - width / 2 for p in positions], values, width, bottom=bottom, label=f"batch: {name}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    bottom = [0.0] * len(results)
    for name in FLOOR_PHASES:
        values = [r["floor_ms"][name] for r in results]
        axes.bar(
            [p + width / 2 for p in positions],
            values,
            width,
            bottom=bottom,
            label=f"store: {name}",
            hatch="//",
        )
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes.set_xticks(list(positions), labels)
    axes.set_xlabel("keys of state")
    axes.set_ylabel(f"ms for a batch of {results[0]['batch_keys']:,} keys")
    axes.set_title("one instance's bulk state work, and the LMDB store's own share of it")
    axes.legend(fontsize=7, ncols=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Measure at each state size; print the table; write JSON, Markdown and a PNG if asked."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-keys", default="500000,2000000,4000000")
    parser.add_argument("--batch-keys", type=int, default=500_000)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.state_keys.split(",")]
    console = Console(width=160)
    results = []
    with Progress(console=console) as progress:
        task = progress.add_task("state sizes", total=len(sizes))
        for size in sizes:
            with tempfile.TemporaryDirectory(prefix="dstl-bulk-") as tmp:
                results.append(measure(size, min(args.batch_keys, size), Path(tmp)))
            progress.advance(task)
    title = f"a batch of {args.batch_keys:,} updates on one instance (LMDB working copy, local log)"
    console.print(_table(title, COLUMNS, _rows(results)))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=2))
    if args.markdown:
        lines = [f"| {' | '.join(COLUMNS)} |", f"|{'---|' * len(COLUMNS)}"]
        lines += [f"| {' | '.join(row)} |" for row in _rows(results)]
        Path(args.markdown).write_text(f"{title}\n\n" + "\n".join(lines) + "\n")
    if args.plot:
        _plot(results, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
