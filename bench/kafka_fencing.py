"""Kafka fencing designs, measured side by side on the same broker and bytes.

Each round persists the same payload four ways, in rotating order:

- ``raw produce+flush``: an idempotent producer, the floor (no fencing);
- ``transaction per persist``: begin, produce, commit on a transactional
  producer (Kafka's own zombie fencing, at least three broker round trips);
- ``produce || claims end offset``: the previous dstl design, produce while the
  claims partition's end offset is asked for;
- ``dstl persist``: the storage as built (a claim marker in the data partition;
  no request while the partition holds only this storage's records).

Then writer creation, which claims the log (as a Spark task does every batch),
both ways in alternating order: with a fresh transactional producer per claim
(``dstl.kafka.claims.kept-producers`` 0: ``init_transactions`` every time) and
with the producer of the log's last claim kept (the default).

    python -m bench.kafka_fencing [--rounds N] [--claims N] [--size BYTES] [--quick]

The broker is Tansu from the kafka storage's test helpers, or
``DSTL_TEST_KAFKA_BOOTSTRAP``. Prints a table; writes a Markdown report.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import PERCENTILES, _markdown, _table, bench_parser, percentile
from dstl.spi import KeyGroupRange, load_storage

KEY_GROUPS = KeyGroupRange(0, 128)
COLUMNS = ["design", "n", *(f"p{q:g}" for q in PERCENTILES), "p99 / floor p99"]


def _produce_flush(storage, partition: int, *, ask_claims: bool) -> Callable[[bytes], float]:
    """Raw idempotent produce + flush; with ``ask_claims`` racing a claims end-offset request."""
    from confluent_kafka import Producer

    producer = Producer(storage.factory.producer_config())

    def persist(payload: bytes) -> float:
        started = time.perf_counter()
        producer.produce(storage.topic, payload, partition=partition)
        if ask_claims:
            storage.claims.watermarks(partition)  # blocks for one round trip, records in flight
        producer.flush(30)
        return time.perf_counter() - started

    return persist


def _transactional(storage, partition: int) -> Callable[[bytes], float]:
    from confluent_kafka import Producer

    producer = Producer(
        storage.factory.producer_config(**{"transactional.id": f"bench-{uuid.uuid4().hex[:8]}"})
    )
    producer.init_transactions(30)

    def persist(payload: bytes) -> float:
        started = time.perf_counter()
        producer.begin_transaction()
        producer.produce(storage.topic, payload, partition=partition)
        producer.commit_transaction(30)  # flushes, then the two-phase commit
        return time.perf_counter() - started

    return persist


def _dstl(storage, writer) -> Callable[[bytes], float]:
    checkpoint = 0

    def persist(payload: bytes) -> float:
        nonlocal checkpoint
        checkpoint += 1
        start = writer.next_sqn()
        writer.append(checkpoint & 127, payload)  # appending is not the persist: not timed
        started = time.perf_counter()
        handle = writer.persist(start, checkpoint).result(timeout=30)
        elapsed = time.perf_counter() - started
        writer.confirm(start, handle.sqn_range.end, checkpoint)
        writer.truncate(handle.sqn_range.end)
        return elapsed

    return persist


def measure(bootstrap: str, rounds: int, size: int, progress: Progress) -> tuple[dict[str, list[float]], int]:
    """Latency samples (seconds) of every design, ``rounds`` each, interleaved.

    Also returns how many claims requests dstl's persists made during the rounds.
    """
    config = {
        "dstl.storage": "kafka",
        "dstl.kafka.bootstrap.servers": bootstrap,
        "dstl.kafka.topic": f"fencing-{uuid.uuid4().hex[:8]}",
    }
    with load_storage(config, job_id="bench") as storage:
        writer = storage.create_writer(f"fencing-{uuid.uuid4().hex[:8]}", KEY_GROUPS)
        # Everything else goes to another partition, so the dstl writer's stays its own.
        others = (storage.partition(writer.log_id) + 1) % storage.partitions
        designs: dict[str, Callable[[bytes], float]] = {
            "raw produce+flush": _produce_flush(storage, others, ask_claims=False),
            "transaction per persist": _transactional(storage, others),
            "produce || claims end offset": _produce_flush(storage, others, ask_claims=True),
            "dstl persist": _dstl(storage, writer),
        }
        samples: dict[str, list[float]] = {name: [] for name in designs}
        payload = os.urandom(size)
        for run in designs.values():  # connect, get producer ids, reach steady state
            for _ in range(3):
                run(payload)
        requests_before = storage.metrics.counter("fencing_requests")
        order = list(designs)
        task = progress.add_task("fencing designs", total=rounds)
        for round_ in range(rounds):
            for name in order[round_ % len(order) :] + order[: round_ % len(order)]:
                samples[name].append(designs[name](payload))
            progress.advance(task)
        requests = storage.metrics.counter("fencing_requests") - requests_before
    return samples, requests


CLAIM_COLUMNS = ["writer creation", "n", *(f"p{q:g}" for q in PERCENTILES), "p50 / fresh p50"]
CLAIM_WAYS = {"fresh producer per claim": "0", "kept producer": None}  # None: the declared default


def measure_claims(bootstrap: str, rounds: int, progress: Progress) -> dict[str, list[float]]:
    """Latency samples (seconds) of ``create_writer`` on a log claimed every round, both ways."""
    topic = f"claims-{uuid.uuid4().hex[:8]}"
    samples: dict[str, list[float]] = {way: [] for way in CLAIM_WAYS}
    task = progress.add_task("writer creation", total=rounds)
    storages = {}
    try:
        for way, kept in CLAIM_WAYS.items():
            config = {
                "dstl.storage": "kafka",
                "dstl.kafka.bootstrap.servers": bootstrap,
                "dstl.kafka.topic": topic,
            }
            if kept is not None:
                config["dstl.kafka.claims.kept-producers"] = kept
            storages[way] = load_storage(config, job_id=f"claims-{len(storages)}")
        for round_ in range(-2, rounds):  # two rounds to connect and warm up, not recorded
            ways = list(CLAIM_WAYS) if round_ % 2 == 0 else list(reversed(CLAIM_WAYS))
            for way in ways:
                started = time.perf_counter()
                storages[way].create_writer("claimed", KEY_GROUPS, epoch=round_ + 3).close()
                if round_ >= 0:
                    samples[way].append(time.perf_counter() - started)
            if round_ >= 0:
                progress.advance(task)
    finally:
        for storage in storages.values():
            storage.close()
    return samples


def rows(
    samples: dict[str, list[float]], baseline: str = "raw produce+flush", q: float = 99
) -> list[list[str]]:
    """One table row per design, with its ``q``-th percentile over the ``baseline``'s."""
    base = percentile(samples[baseline], q)
    return [
        [
            name,
            str(len(values)),
            *(f"{percentile(values, p) * 1000:.3f}" for p in PERCENTILES),
            f"{percentile(values, q) / base:.2f}",
        ]
        for name, values in samples.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--claims", type=int, default=200, help="writer creations per way")
    parser.add_argument("--size", type=int, default=54_000, help="bytes per persist")
    args = parser.parse_args(argv)
    from dstl.kafka.testing import kafka_broker

    console = Console()
    rounds = 50 if args.quick else args.rounds
    claims = 10 if args.quick else args.claims
    with kafka_broker() as bootstrap, Progress(console=console) as progress:
        samples, requests = measure(bootstrap, rounds, args.size, progress)
        claim_samples = measure_claims(bootstrap, claims, progress)
    table_rows = rows(samples)
    title = f"persist latency (ms) of {args.size:,} bytes by fencing design"
    console.print(_table(title, COLUMNS, table_rows))
    asked = f"claims requests by dstl's {rounds} measured persists: {requests}"
    console.print(asked)
    claim_table = rows(claim_samples, "fresh producer per claim", 50)
    claim_title = "writer creation latency (ms): the claim of a log created again every round"
    console.print(_table(claim_title, CLAIM_COLUMNS, claim_table))
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    report = results / "kafka-fencing.md"
    lines = [f"# Kafka fencing designs: {title}", "", f"- cpus: {os.cpu_count()}", f"- {asked}", ""]
    claim_lines = ["", f"## {claim_title}", "", *_markdown(CLAIM_COLUMNS, claim_table)]
    report.write_text("\n".join([*lines, *_markdown(COLUMNS, table_rows), *claim_lines, ""]))
    console.print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
