"""DSTL benchmark harness: append throughput and persist latency of one storage.

The physical floor is measured in the same run, interleaved with the persists
and in alternating order, so both see the same machine noise: a raw
``os.write`` + ``fdatasync`` of the same number of bytes on the same disk, or for
Kafka a raw idempotent produce + flush of the same bytes to the same partition.

    python -m bench.dstl_bench --storage local [--config KEY=VALUE ...] [--quick]

The storage's backing service comes from its ``dstl_conformance_environment``
hook unless --config points it somewhere. Prints tables; writes a Markdown report
and a PNG of the latency distributions to bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dstl.spi import Config, KeyGroupRange, load_storage
from dstl.spi.config import parse_key_values
from dstl.spi.plugins import get_plugin_manager

KEY_GROUPS = KeyGroupRange(0, 128)
PERCENTILES = (50, 90, 99, 99.9)
# (change size, writers, changes per writer) of the throughput runs.
THROUGHPUT_PLAN = ((100, 1, 2_000_000), (100, 8, 250_000), (4096, 1, 200_000), (4096, 8, 25_000))


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first paragraph, with --quick and --results."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--results", default=str(Path(__file__).parent / "results"))
    return parser


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    rank = math.ceil(q / 100 * len(ordered)) - 1
    return ordered[min(len(ordered) - 1, max(0, rank))]


@dataclass
class Scenario:
    """A persist-latency scenario: change rate, checkpoint interval, change size, duration."""

    rate: float
    interval: float
    change_size: int
    seconds: float
    shared_partition: bool = False  # Kafka: the floor's records land in the writer's partition

    @property
    def name(self) -> str:
        shared = ", shared partition" if self.shared_partition else ""
        return f"{self.rate:,.0f}/s, {self.interval * 1000:g} ms{shared}"


@dataclass
class LatencyResult:
    """Persist latencies and the floor measured alongside them (seconds)."""

    name: str
    persist: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    bytes_per_persist: list[int] = field(default_factory=list)
    floor_name: str = "floor"
    counters: dict[str, int] = field(default_factory=dict)  # storage counters the scenario added

    def row(self) -> list[str]:
        """Scenario, count, bytes, persist percentiles, floor p50/p99, p99 ratio (ms)."""
        p = [percentile(self.persist, q) * 1000 for q in PERCENTILES]
        f50, f99 = percentile(self.floor, 50) * 1000, percentile(self.floor, 99) * 1000
        ratio = p[PERCENTILES.index(99)] / f99
        size = f"{statistics.median(self.bytes_per_persist):,.0f}"
        return [
            self.name,
            str(len(self.persist)),
            size,
            *(f"{v:.3f}" for v in p),
            f"{f50:.3f}",
            f"{f99:.3f}",
            f"{ratio:.2f}",
        ]


LATENCY_COLUMNS = [
    "scenario",
    "n",
    "bytes/persist",
    *(f"p{q:g}" for q in PERCENTILES),
    "floor p50",
    "floor p99",
    "p99/floor p99",
]


@dataclass
class ThroughputResult:
    """Appends per second for one change size and writer count."""

    name: str
    changes: int
    seconds: float
    change_size: int

    def row(self) -> list[str]:
        """Name, appends/s, MB/s."""
        per_second = self.changes / self.seconds
        return [self.name, f"{per_second:,.0f}", f"{per_second * self.change_size / 1e6:,.1f}"]


THROUGHPUT_COLUMNS = ["changes", "appends/s", "MB/s"]


def measure_appends(storage, change_size: int, writers: int, changes_per_writer: int) -> ThroughputResult:
    """Appends from ``writers`` threads, one writer each (persists are not timed)."""
    data = os.urandom(change_size)
    tag = f"tp-{change_size}-{writers}-{time.monotonic_ns()}"
    ws = [storage.create_writer(f"{tag}-{n}", KEY_GROUPS) for n in range(writers)]
    barrier = threading.Barrier(writers + 1)

    def work(writer):
        barrier.wait()
        for i in range(changes_per_writer):
            writer.append(i & 127, data)

    threads = [threading.Thread(target=work, args=(w,)) for w in ws]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for w in ws:
        w.truncate_and_close(0)
    name = f"{change_size} B x {writers} writer(s)"
    return ThroughputResult(name, changes_per_writer * writers, elapsed, change_size)


class FsyncFloor:
    """Raw os.write + fdatasync of the same number of bytes, on the storage's disk."""

    name = "write+fdatasync"

    def __init__(self, directory: Path, tag: str) -> None:
        self.path = directory / f"floor-{tag}.bin"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def measure(self, payload: memoryview) -> float:
        started = time.perf_counter()
        view = payload
        while view:
            view = view[os.write(self.fd, view) :]
        os.fdatasync(self.fd)
        return time.perf_counter() - started

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


class KafkaFloor:
    """Raw idempotent produce (acks=all) + flush of the same bytes, to a partition of the same broker.

    ``shared=True`` produces into the writer's own partition, so that every persist
    follows foreign records (logs of other processes sharing the partition) and
    has to ask for the claims. Otherwise the floor goes to the same partition
    number of a topic of its own, and the writer's partition is its alone.
    """

    name = "produce+flush"

    def __init__(self, storage, log_id: str, *, shared: bool) -> None:
        from confluent_kafka import Producer

        self.topic, self.partition = storage.topic, storage.partition(log_id)
        if not shared:
            self.topic = f"{storage.topic}.floor"
            _create_topic(storage, self.topic)
        self.producer = Producer(storage.factory.producer_config())
        self.chunk = storage.chunk_size
        # Connect and get a producer id before measuring.
        self.producer.produce(self.topic, b"", partition=self.partition)
        self.producer.flush(60)

    def measure(self, payload: memoryview) -> float:
        # The pieces are made before the clock starts: the floor is the produce alone.
        pieces = [bytes(payload[i : i + self.chunk]) for i in range(0, max(1, len(payload)), self.chunk)]
        started = time.perf_counter()
        for piece in pieces:
            self.producer.produce(self.topic, piece, partition=self.partition)
        self.producer.flush(60)
        return time.perf_counter() - started

    def close(self) -> None:
        self.producer.flush(10)


def _create_topic(storage, topic: str) -> None:
    """``topic`` with as many partitions as the storage's data topic (if it does not exist)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(storage.factory.admin_config())
    if topic not in admin.list_topics(timeout=30).topics:
        for future in admin.create_topics([NewTopic(topic, num_partitions=storage.partitions)]).values():
            future.result(30)


def make_floor(storage, writer, floor_dir: Path, tag: str, *, shared: bool = False):
    """The physical floor matching the storage: Kafka produce, else a disk fsync."""
    if storage.identifier == "kafka":
        return KafkaFloor(storage, writer.log_id, shared=shared)
    return FsyncFloor(floor_dir, tag)


def measure_persists(storage, scenario: Scenario, floor_dir: Path, progress) -> LatencyResult:
    """Append at the scenario's rate, persist every interval; time persists and the floor."""
    result = LatencyResult(scenario.name)
    interval, seconds = scenario.interval, scenario.seconds
    writer = storage.create_writer(f"lat-{int(interval * 1000)}ms-{time.monotonic_ns()}", KEY_GROUPS)
    data = os.urandom(scenario.change_size)
    per_checkpoint = max(1, round(scenario.rate * interval))
    payload = memoryview(os.urandom(per_checkpoint * (scenario.change_size + 64) + 4096))
    floor = make_floor(
        storage, writer, floor_dir, f"{int(interval * 1000)}ms", shared=scenario.shared_partition
    )
    result.floor_name = floor.name
    counters_before = storage.metrics.counters()
    task = progress.add_task(scenario.name, total=seconds)
    checkpoint = 0
    deadline = time.monotonic() + seconds
    next_tick = time.monotonic()
    try:
        while time.monotonic() < deadline:
            checkpoint += 1
            start_sqn = writer.next_sqn()
            for i in range(per_checkpoint):
                writer.append(i & 127, data)
            next_tick += interval
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            # The floor writes as many bytes as the (previous) persist stored; the
            # order alternates so neither side always runs first after the pause.
            floor_first = checkpoint % 2 == 0 and bool(result.bytes_per_persist)
            if floor_first:
                result.floor.append(floor.measure(payload[: result.bytes_per_persist[-1]]))
            stored_before = storage.metrics.counter("uploaded_bytes")
            began = time.perf_counter()
            handle = writer.persist(start_sqn, checkpoint).result(timeout=60)
            result.persist.append(time.perf_counter() - began)
            stored = storage.metrics.counter("uploaded_bytes") - stored_before
            result.bytes_per_persist.append(stored)
            writer.confirm(start_sqn, handle.sqn_range.end, checkpoint)
            writer.truncate(handle.sqn_range.end)
            if not floor_first:
                result.floor.append(floor.measure(payload[:stored]))
            progress.update(task, completed=seconds - max(0.0, deadline - time.monotonic()))
    finally:
        floor.close()
        writer.close()
    result.counters = {
        name: value - counters_before.get(name, 0) for name, value in storage.metrics.counters().items()
    }
    return result


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def _markdown(columns: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|---" * len(columns) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _kafka_requests(latency: list[LatencyResult]) -> list[str]:
    """How often persists asked the broker for the claims (fencing) per scenario."""
    rows = [
        [r.name, f"{r.counters.get('fencing_requests', 0) / max(1, len(r.persist)):.2f}"] for r in latency
    ]
    return ["", "## Claims requests per persist", "", *_markdown(["scenario", "requests/persist"], rows), ""]


def _plot(path: Path, storage_id: str, latency: list[LatencyResult], console: Console) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("matplotlib not installed: no plot (pip install 'dstl[bench]')")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in latency:
        for label, samples in ((f"{r.name} persist", r.persist), (f"{r.name} floor", r.floor)):
            ordered = sorted(s * 1000 for s in samples)
            ax.plot(ordered, [i / len(ordered) for i in range(1, len(ordered) + 1)], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of persists")
    ax.set_title(f"persist latency CDF vs. raw {latency[0].floor_name}, storage {storage_id}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    console.print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--storage", default="local")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each latency scenario")
    parser.add_argument("--rate", type=float, default=50_000, help="changes/s in the latency scenarios")
    args = parser.parse_args(argv)
    console = Console()
    seconds = 2.0 if args.quick else args.seconds
    scale = 0.05 if args.quick else 1.0
    user_config = parse_key_values(args.config)
    results_dir = Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dstl-bench-") as workdir, contextlib.ExitStack() as stack:
        env = None
        if not user_config:
            hook = get_plugin_manager().hook.dstl_conformance_environment
            env = hook(identifier=args.storage, workdir=Path(workdir))
        base = stack.enter_context(env) if env is not None else {}
        config = Config({**base, **user_config, "dstl.storage": args.storage})
        storage = stack.enter_context(load_storage(config, job_id="bench"))
        # The floor is measured on the disk the storage writes to.
        floor_dir = Path(config["dstl.local.dir"]) if args.storage == "local" else Path(workdir)
        floor_dir.mkdir(parents=True, exist_ok=True)
        console.print(f"storage [bold]{args.storage}[/bold], config {config!r}")
        with Progress(console=console) as progress:
            task = progress.add_task("append throughput", total=len(THROUGHPUT_PLAN))
            throughput = []
            for size, writers, count in THROUGHPUT_PLAN:
                throughput.append(measure_appends(storage, size, writers, max(1000, int(count * scale))))
                progress.advance(task)
            scenarios = [Scenario(args.rate, interval, 100, seconds) for interval in (0.1, 0.01)]
            if args.storage == "kafka":
                scenarios += [
                    Scenario(args.rate, i, 100, seconds, shared_partition=True) for i in (0.1, 0.01)
                ]
            latency = [measure_persists(storage, s, floor_dir, progress) for s in scenarios]
    floor_name = latency[0].floor_name if latency else "floor"
    tp_rows = [r.row() for r in throughput]
    lat_rows = [r.row() for r in latency]
    console.print(_table("append throughput", THROUGHPUT_COLUMNS, tp_rows))
    console.print(
        _table(f"persist latency (ms) vs. raw {floor_name} of the same bytes", LATENCY_COLUMNS, lat_rows)
    )
    report = results_dir / f"dstl-bench-{args.storage}.md"
    lines = [
        f"# DSTL benchmark: storage `{args.storage}`",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S')}",
    ]
    lines += [
        f"- cpus: {os.cpu_count()}",
        "",
        "## Append throughput",
        "",
        *_markdown(THROUGHPUT_COLUMNS, tp_rows),
    ]
    lines += [
        "",
        f"## Persist latency (ms), floor: raw {floor_name}",
        "",
        *_markdown(LATENCY_COLUMNS, lat_rows),
        "",
    ]
    if args.storage == "kafka":
        requests = _kafka_requests(latency)
        console.print("\n".join(requests))
        lines += requests
    report.write_text("\n".join(lines))
    _plot(report.with_suffix(".png"), args.storage, latency, console)
    console.print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
