"""State at scale: materialization and restore time and peak anonymous memory against the state size.

Each size runs in a fresh process (so one size's heap does not inflate the
next): the working state is filled with ``keys`` keys of ``--value-bytes`` bytes
(straight into the delegate: the log is not what is measured), then one full
materialization and one restore into a new backend run while a sampler reads
the process's anonymous resident memory (``RssAnon``) every 5 ms. The figure is
the peak above the level before the operation: what the operation itself holds.

    python -m bench.scale_bench                         # 250k and 1M keys, LMDB and heap
    python -m bench.scale_bench --sizes 1000000,4000000 --delegates lmdb
    python -m bench.scale_bench --probe lmdb 200000 OUT.json   # one measurement (what a test runs)
    python -m bench.scale_bench --collections 1000,20000,100000    # per-op cost against collection size
    python -m bench.scale_bench --timers 10000,100000,1000000 --delegates lmdb   # timer cost against count

``--collections`` times list add and map put, get and remove through the state API
(changelog append included) on one key whose list or map already holds that many
entries; the ratio to the smallest size is what must stay flat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import _markdown, _table, percentile

SECTION_KEYS = 20_000  # keys written per delegate batch while filling


def anon_rss() -> int:
    """Anonymous resident memory of this process in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_during(work: Callable[[], Any]) -> tuple[float, int]:
    """``(seconds, peak anonymous memory above the level before)`` of ``work()``."""
    import gc

    gc.collect()
    before = anon_rss()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, anon_rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        work()
    finally:
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
    return seconds, max(peak, anon_rss()) - before


def _value(rng: Any, value_bytes: int) -> bytes:
    """A value like real state (counters, a timestamp, a random hex id): about 2:1 compressible."""
    import msgpack

    record = {"n": rng.randint(0, 10**6), "t": rng.randint(1_700_000_000_000, 1_800_000_000_000)}
    head = msgpack.packb(record, use_bin_type=True)
    pad = rng.randbytes(max(value_bytes - len(head), 0) // 2 + 1).hex().encode()
    return (head + pad)[:value_bytes]


CHECKPOINTS = 20  # checkpoints timed on the full state, each after UPDATES_PER_CHECKPOINT updates
UPDATES_PER_CHECKPOINT = 1000


def _steady_checkpoints(
    backend: Any,
    state: str,
    keys: int,
    map_entries: int,
    rng: Any,
) -> tuple[float, list[float]]:
    """``(µs per update, checkpoint ms each)`` of updates through the state API on the full state.

    The keys are drawn from as many as the state holds (through the API they hash to
    other key groups than the fill's, so most are inserts into the full store).
    """
    handle = backend.map_state(state) if map_entries else backend.value_state(state)
    payload = "x" * 200
    outer = max(keys // map_entries, 1) if map_entries else keys
    update_s = 0.0
    checkpoint_ms = []
    for checkpoint_id in range(1, CHECKPOINTS + 1):
        started = time.perf_counter()
        for _ in range(UPDATES_PER_CHECKPOINT):
            backend.set_current_key(f"key-{rng.randrange(outer):09d}")
            if map_entries:
                handle.put(rng.randrange(map_entries), payload)
            else:
                handle.update(payload)
        update_s += time.perf_counter() - started
        started = time.perf_counter()
        backend.checkpoint(checkpoint_id).result()
        checkpoint_ms.append((time.perf_counter() - started) * 1000)
    return update_s / (CHECKPOINTS * UPDATES_PER_CHECKPOINT) * 1e6, checkpoint_ms


def probe(
    delegate_kind: str, keys: int, value_bytes: int, out: Path, codec: str = "zstd", map_entries: int = 0
) -> dict[str, Any]:
    """Fill, materialize and restore once in this process; writes and returns the figures.

    :param map_entries: 0 fills ``keys`` value-state keys; otherwise ``keys`` entries in
        total, as maps of ``map_entries`` entries per key (map state).
    """
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.delegate import HeapDelegate, LmdbDelegate
    from dstl.spi import KeyGroupRange, load_storage

    key_groups = KeyGroupRange(0, 128)
    with tempfile.TemporaryDirectory(prefix="dstl-scale-") as workdir:
        snapshots = Path(workdir, "snapshots").as_uri()
        config = {"dstl.storage": "memory", "dstl.memory.namespace": f"scale-{uuid.uuid4().hex}"}

        def delegate() -> Any:
            if delegate_kind == "lmdb":
                return LmdbDelegate(Path(workdir, f"lmdb-{uuid.uuid4().hex[:6]}"), map_size=1 << 30)
            return HeapDelegate()

        with load_storage(config, job_id="scale") as storage:
            backend = ChangelogKeyedStateBackend(
                storage,
                "op",
                key_groups,
                delegate=delegate(),
                snapshot_dir=snapshots,
                snapshot_compression=codec,
            )
            state = "m" if map_entries else "v"
            backend.map_state(state) if map_entries else backend.value_state(state)  # a restore knows it
            import random

            rng = random.Random(11)
            if map_entries:
                for index in range(max(keys // map_entries, 1)):
                    entries = {f"e{i:09d}".encode(): _value(rng, value_bytes) for i in range(map_entries)}
                    backend.delegate.write_batch(state, index % 128, {f"key-{index:09d}".encode(): entries})
            filler: dict[int, dict[bytes, Any]] = {}
            for index in range(0 if map_entries else keys):
                filler.setdefault(index % 128, {})[f"key-{index:09d}".encode()] = _value(rng, value_bytes)
                if (index + 1) % SECTION_KEYS == 0 or index + 1 == keys:
                    for key_group, entries in filler.items():
                        backend.delegate.write_batch(state, key_group, entries)
                    filler = {}
            op_us, checkpoint_ms = _steady_checkpoints(backend, state, keys, map_entries, rng)
            refs: list[Any] = []
            materialize_s, materialize_mem = peak_during(lambda: refs.append(backend.materialize().result()))
            snapshot = backend.checkpoint(CHECKPOINTS + 1).result()
            backend.close()
            restored = ChangelogKeyedStateBackend(
                storage, "op", key_groups, epoch=1, delegate=delegate(), snapshot_dir=snapshots
            )
            restore_s, restore_mem = peak_during(lambda: restored.restore(snapshot, config))
            count = sum(
                len(entry) if map_entries else 1
                for kg in range(128)
                for _, entry in restored.delegate.entries(state, kg)
            )
            restored.close()
    figures = {
        "delegate": delegate_kind,
        "codec": codec,
        "keys": keys,
        "map_entries": map_entries,
        "value_bytes": value_bytes,
        "update_us_per_op": op_us,
        "checkpoint_p50_ms": statistics.median(checkpoint_ms),
        "checkpoint_p99_ms": percentile(checkpoint_ms, 99),
        "snapshot_bytes": refs[0].size,
        "materialize_s": materialize_s,
        "materialize_peak_anon": materialize_mem,
        "restore_s": restore_s,
        "restore_peak_anon": restore_mem,
        "restored_keys": count,
    }
    out.write_text(json.dumps(figures))
    return figures


def run_probe(
    delegate_kind: str, keys: int, value_bytes: int = 200, codec: str = "zstd", map_entries: int = 0
) -> dict[str, Any]:
    """:func:`probe` in a fresh interpreter; returns its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        command = [sys.executable, "-m", "bench.scale_bench", "--probe", delegate_kind, str(keys), str(out)]
        command += ["--value-bytes", str(value_bytes), "--codecs", codec, "--map-entries", str(map_entries)]
        subprocess.run(command, check=True, timeout=3600, cwd=Path(__file__).resolve().parents[1])
        return json.loads(out.read_text())


COLLECTION_OPS = 1000  # operations timed per kind and size (removes distinct keys: at most the smallest size)


def collection_op_costs(delegate_kind: str, size: int, workdir: str) -> dict[str, float]:
    """µs per list add, map put, map get and map remove on one key holding ``size`` entries."""
    import random

    from dstl.backend import MsgpackSerializer
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.delegate import HeapDelegate, LmdbDelegate
    from dstl.spi import KeyGroupRange, load_storage

    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"ops-{uuid.uuid4().hex}"}
    delegate = (
        LmdbDelegate(Path(workdir, f"lmdb-{uuid.uuid4().hex[:6]}"))
        if delegate_kind == "lmdb"
        else HeapDelegate()
    )
    with load_storage(config, job_id="ops") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128), delegate=delegate)
        items, pages = backend.list_state("l"), backend.map_state("m")
        backend.set_current_key("the-key")
        key_group, key = backend.current_key()
        dump = MsgpackSerializer().dumps  # the states' stored form (msgpack, no TTL)
        element = dump("x" * 50)
        backend.delegate.put("l", key_group, key, [element] * size)
        backend.delegate.put("m", key_group, key, {dump(i): element for i in range(size)})
        rng = random.Random(5)
        probes = rng.sample(range(size), COLLECTION_OPS)  # distinct: each remove removes

        def timed(work: Callable[[int], Any]) -> float:
            started = time.perf_counter()
            for i in range(COLLECTION_OPS):
                work(i)
            return (time.perf_counter() - started) / COLLECTION_OPS * 1e6

        costs = {
            "list add µs": timed(lambda i: items.add("y" * 50)),
            "map put µs": timed(lambda i: pages.put(size + i, "y" * 50)),
            "map get µs": timed(lambda i: pages.get(probes[i])),
            "map remove µs": timed(lambda i: pages.remove(probes[i])),
        }
        backend.close()
    if delegate_kind == "lmdb":
        delegate.close()
    return costs


def collections_table(sizes: list[int], delegates: list[str], console: Console) -> tuple[list, list, list]:
    """Per-op cost by delegate, size and operation, with the ratio to the smallest size."""
    if min(sizes) < COLLECTION_OPS:
        msg = f"collection sizes must be at least {COLLECTION_OPS}: each timed remove removes another entry"
        raise SystemExit(msg)
    ops = ["list add µs", "map put µs", "map get µs", "map remove µs"]
    return size_table(console, "entries", sizes, delegates, collection_op_costs, ratios=ops)


def size_table(
    console: Console,
    unit: str,
    sizes: list[int],
    delegates: list[str],
    measure: Callable[[str, int, str], dict[str, float]],
    *,
    ratios: list[str],
) -> tuple[list, list, list]:
    """``measure(delegate, size, workdir)`` for each delegate and size: records, columns and rows.

    Each figure is shown, and for ``ratios`` also its ratio to the smallest size
    (what must stay flat).
    """
    records = []
    with (
        tempfile.TemporaryDirectory(prefix=f"dstl-{unit}-") as workdir,
        Progress(console=console) as progress,
    ):
        task = progress.add_task(unit, total=len(sizes) * len(delegates))
        for kind in delegates:
            for size in sizes:
                progress.update(task, description=f"{kind}, {size:,} {unit}")
                records.append({"delegate": kind, unit: size, **measure(kind, size, workdir)})
                progress.advance(task)
    figures = [name for name in records[0] if name not in ("delegate", unit)]
    columns = ["delegate", unit, *figures, *[f"{name.rsplit(' ', 1)[0]} ×" for name in ratios]]
    rows = []
    for r in records:
        base = next(b for b in records if b["delegate"] == r["delegate"] and b[unit] == min(sizes))
        rows.append(
            [
                r["delegate"],
                f"{r[unit]:,}",
                *[f"{r[name]:.1f}" for name in figures],
                *[f"{r[name] / base[name]:.2f}" for name in ratios],
            ]
        )
    return records, columns, rows


TIMERS_DUE = 100  # timers due per timed fire


def timer_costs(delegate_kind: str, timers: int, workdir: str) -> dict[str, float]:
    """What a fresh backend over ``timers`` registered timers pays (a Spark task's situation).

    Registering (µs per timer, through the state API, logged), then in a new backend
    over the same working state: the next expiry (what the task reports to the
    driver) and firing the :data:`TIMERS_DUE` earliest timers (ms).
    """
    from dstl.backend import TimeDomain
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.delegate import HeapDelegate, LmdbDelegate
    from dstl.spi import KeyGroupRange, load_storage

    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"timers-{uuid.uuid4().hex}"}
    delegate = (
        LmdbDelegate(Path(workdir, f"lmdb-{uuid.uuid4().hex[:6]}"))
        if delegate_kind == "lmdb"
        else HeapDelegate()
    )
    groups, domain = KeyGroupRange(0, 128), TimeDomain.PROCESSING
    with load_storage(config, job_id="timers") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", groups, delegate=delegate)
        started = time.perf_counter()
        for n in range(timers):
            backend.set_current_key(f"user-{n}")
            backend.timers().register(1_000_000 + n, domain)
        register_us = (time.perf_counter() - started) / timers * 1e6
        snapshot = backend.checkpoint(1).result(timeout=600)
        registrations = backend.registrations()
        backend.close()
        fresh = ChangelogKeyedStateBackend(storage, "op", groups, delegate=delegate, epoch=1)
        fresh.resume(snapshot, registrations)
        started = time.perf_counter()
        fresh.timers().next_expiry(domain)
        next_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        fired = sum(1 for _ in fresh.timers().fire(1_000_000 + TIMERS_DUE - 1, domain))
        fire_ms = (time.perf_counter() - started) * 1000
        fresh.close()
    if fired != TIMERS_DUE:
        msg = f"{fired} timers fired, {TIMERS_DUE} were due"
        raise SystemExit(msg)
    if delegate_kind == "lmdb":
        delegate.close()
    return {"register µs": register_us, "next expiry ms": next_ms, "fire due ms": fire_ms}


def timers_table(sizes: list[int], delegates: list[str], console: Console) -> tuple[list, list, list]:
    """Timer costs by delegate and number of timers, with the ratio to the fewest."""
    return size_table(
        console, "timers", sizes, delegates, timer_costs, ratios=["next expiry ms", "fire due ms"]
    )


def main(argv: list[str] | None = None) -> int:
    """Run every size and delegate; print and write the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="250000,1000000")
    parser.add_argument("--delegates", default="lmdb,heap")
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--codecs", default="zstd", help="snapshot codecs to compare, e.g. none,zstd,lz4")
    parser.add_argument("--probe", nargs=3, metavar=("DELEGATE", "KEYS", "OUT"))
    parser.add_argument("--collections", metavar="SIZES", help="per-op cost at these collection sizes")
    parser.add_argument("--timers", metavar="SIZES", help="a fresh backend's timer costs at these counts")
    parser.add_argument(
        "--map-entries",
        type=int,
        default=0,
        help="also run each size as maps of this many entries per key (the size counts entries)",
    )
    parser.add_argument("--results", default="bench/results")
    args = parser.parse_args(argv)
    if args.probe:
        kind, keys, out = args.probe
        probe(kind, int(keys), args.value_bytes, Path(out), args.codecs.split(",")[0], args.map_entries)
        return 0
    console = Console()
    tables = {  # --timers / --collections: (sizes, table, report stem, title)
        "timers": (
            args.timers,
            timers_table,
            "scale-timers",
            f"Timers: register, then a fresh backend's next expiry and firing of {TIMERS_DUE} due",
        ),
        "collections": (
            args.collections,
            collections_table,
            "scale-collections",
            f"Per-op cost against collection size (µs, {COLLECTION_OPS} ops each)",
        ),
    }
    for unit, (given, table, stem, title) in tables.items():
        if given:
            sizes = [int(s) for s in given.split(",")]
            records, columns, rows = table(sizes, args.delegates.split(","), console)
            heading = f"{title} (× is the ratio to {min(sizes):,} {unit})"
            _report(console, Path(args.results) / stem, heading, columns, rows, records)
            return 0
    records = []
    shapes = [0, args.map_entries] if args.map_entries else [0]
    runs = [
        (d, int(s), c, m)
        for d in args.delegates.split(",")
        for s in args.sizes.split(",")
        for c in args.codecs.split(",")
        for m in shapes
    ]
    with Progress(console=console) as progress:
        task = progress.add_task("scale runs", total=len(runs))
        for kind, keys, codec, map_entries in runs:
            shape = f"maps of {map_entries:,}" if map_entries else "values"
            progress.update(task, description=f"{kind}, {keys:,} {shape}, {codec}")
            records.append(run_probe(kind, keys, args.value_bytes, codec, map_entries))
            progress.advance(task)
    mb = 1 << 20
    columns = [
        "delegate",
        "codec",
        "state",
        "entries",
        "state MB",
        "update µs/op",
        "checkpoint p99 ms",
        "snapshot MB",
        "materialize s",
        "materialize peak anon MB",
        "restore s",
        "restore peak anon MB",
    ]
    rows = [
        [
            r["delegate"],
            r["codec"],
            f"maps of {r['map_entries']:,}" if r.get("map_entries") else "values",
            f"{r['keys']:,}",
            f"{r['keys'] * r['value_bytes'] / mb:.0f}",
            f"{r['update_us_per_op']:.1f}",
            f"{r['checkpoint_p99_ms']:.1f}",
            f"{r['snapshot_bytes'] / mb:.0f}",
            f"{r['materialize_s']:.2f}",
            f"{r['materialize_peak_anon'] / mb:.1f}",
            f"{r['restore_s']:.2f}",
            f"{r['restore_peak_anon'] / mb:.1f}",
        ]
        for r in records
    ]
    title = f"Full materialization and restore, {args.value_bytes} B values"
    _report(console, Path(args.results) / "scale-bench", title, columns, rows, records)
    return 0


def _report(console: Console, stem: Path, title: str, columns: list, rows: list, records: list) -> None:
    """Print the table; write it as ``stem.md`` and the records as ``stem.json``."""
    console.print(_table(title, columns, rows))
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text("\n".join([f"# {title}", "", *_markdown(columns, rows), ""]))
    stem.with_suffix(".json").write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
