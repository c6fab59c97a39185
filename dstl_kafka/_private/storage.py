"""The Kafka-log storage: change sets as records, claims for fencing, bounded reads."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from dstl.spi import ChangelogHandle, Config, CorruptedError, KeyGroupRange, StorageError
from dstl.spi.handle import Location, LocationValue
from dstl.spi.kit import (
    ChangeSet,
    ChangeSetReader,
    ChangeSetStorage,
    ChangeSetWriter,
    FetchedChangeSet,
    storage_settings,
)

from ..options import CLAIMS_KEPT_PRODUCERS, TOPIC
from .claims import ClaimsTracker
from .clients import ClientFactory, ensure_topics, partition_for
from .ledger import PartitionLedger
from .owner import record_owner
from .records import LOCATION_FIELDS, ChunkId, chunks, claim_headers, headers
from .truncation import RecordTruncator

log = logging.getLogger(__name__)

IDENTIFIER = "kafka"


@functools.cache
def _poisoning_errors() -> frozenset[int]:
    """Per-record errors after which the idempotent producer never succeeds again."""
    from confluent_kafka import KafkaError

    # librdkafka names its local error codes with a leading underscore (_FENCED is one)
    local_fenced = KafkaError._FENCED  # noqa: SLF001
    return frozenset({KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, local_fenced})


class KafkaWriter(ChangeSetWriter):
    """Produces change sets through the storage's shared idempotent producer."""

    _storage: KafkaStorage

    def _upload(self, change_sets: Sequence[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        """Produce and flush in the persisting thread, then rule out fencing.

        The delivery reports are served in this thread (no hand-off to another
        thread). Whether the claims must be asked for is decided by the
        partition's ledger; when the last persist found foreign records, they are
        asked for while the records are in flight.
        """
        storage = self._storage
        partition = storage.partition(self.log_id)
        ledger = storage.ledger(partition)
        key = f"{storage.job_id}/{self.log_id}".encode()
        pieces = [(cs.sqn, chunks(self._encoded(cs), storage.chunk_size)) for cs in change_sets]
        offsets: list[list[int]] = [[-1] * len(parts) for _, parts in pieces]
        errors: list[str] = []
        result: Future[list[Location]] = Future()

        def delivered(cs_index: int, chunk_index: int, err: Any, message: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                offsets[cs_index][chunk_index] = message.offset()

        try:
            for cs_index, (sqn, parts) in enumerate(pieces):
                for chunk_index, part in enumerate(parts):
                    storage.produce(
                        partition,
                        value=part,
                        key=key,
                        headers=headers(self.log_id, self.epoch, self._token, sqn, chunk_index, len(parts)),
                        on_delivery=partial(delivered, cs_index, chunk_index),
                    )
            speculation = storage.speculate(partition) if ledger.speculate else None
            storage.await_delivery(
                errors, f"producing to {storage.topic}[{partition}]", lambda: min(map(min, offsets)) >= 0
            )
            last = max(map(max, offsets))
            storage.rule_out_fencing(partition, last, speculation, self.log_id, self.epoch, self._token)
        except BaseException as exc:
            storage.metrics.inc("upload_failures")
            result.set_exception(exc)
            return result
        storage.metrics.inc("uploads")
        storage.metrics.inc("uploaded_bytes", sum(len(p) for _, parts in pieces for p in parts))
        result.set_result(
            [
                {
                    "topic": storage.topic,
                    "partition": partition,
                    "first": min(chunk_offsets),
                    "last": max(chunk_offsets),
                    "sqn": sqn,
                    "writer": self._token,
                }
                for (sqn, _), chunk_offsets in zip(pieces, offsets, strict=True)
            ]
        )
        return result


class KafkaReader(ChangeSetReader):
    """Reads each partition range once per read (read_committed, bounded by a timeout)."""

    location_fields = LOCATION_FIELDS

    def __init__(self, storage: KafkaStorage) -> None:
        super().__init__(IDENTIFIER)
        self._storage = storage
        self._fetched: dict[tuple[str, int, int, str, int], bytes] = {}

    def _fetch_wanted(
        self, handle: ChangelogHandle, wanted: list[dict[str, LocationValue]]
    ) -> Iterator[tuple[int, FetchedChangeSet]]:
        """Prefetch the partition ranges of ``wanted``, then hand out its change sets in SQN order."""
        self._fetched = self._prefetch(handle, wanted)
        try:
            yield from super()._fetch_wanted(handle, wanted)
        finally:
            self._fetched = {}

    def _prefetch(  # noqa: C901 - a bounded fetch loop: one branch per broker answer
        self, handle: ChangelogHandle, wanted: list[dict[str, LocationValue]]
    ) -> dict[tuple[str, int, int, str, int], bytes]:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for loc in wanted:
            spot = (str(loc["topic"]), int(loc["partition"]))  # type: ignore[arg-type]
            first, last = int(loc["first"]), int(loc["last"])  # type: ignore[arg-type]
            low, high = ranges.get(spot, (first, last))
            ranges[spot] = (min(low, first), max(high, last))
        parts: dict[tuple[str, int, int, str, int], dict[int, bytes]] = {}
        counts: dict[tuple[str, int, int, str, int], int] = {}
        consumer = Consumer(self._storage.factory.consumer_config(), logger=log)
        timeout = self._storage.factory.timeout
        try:
            for (topic, partition), (first, last) in ranges.items():
                low, _ = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout, cached=False
                )
                if low > first:
                    msg = (
                        f"records {first}..{last} of {topic}[{partition}] were deleted "
                        f"(retention?); the low watermark is {low}"
                    )
                    raise StorageError(msg)
                consumer.assign([TopicPartition(topic, partition, first)])
                deadline = time.monotonic() + timeout
                position = first
                while position <= last:
                    if time.monotonic() > deadline:
                        msg = f"reading {topic}[{partition}] timed out at offset {position} (up to {last})"
                        raise StorageError(msg, retriable=True)
                    message = consumer.poll(0.1)
                    if message is None:
                        continue
                    error = message.error()
                    if error is not None:
                        if error.code() == -191:  # end of partition: nothing more to read
                            break
                        continue
                    offset = message.offset()
                    if offset is None:
                        continue
                    position = offset + 1
                    chunk = ChunkId.parse(message.headers())
                    if chunk is None or chunk.log_id != handle.log_id or chunk.epoch != handle.epoch:
                        continue
                    ident = (topic, partition, chunk.sqn, chunk.writer, chunk.epoch)
                    parts.setdefault(ident, {})[chunk.index] = message.value() or b""
                    counts[ident] = chunk.count
        except KafkaException as exc:
            msg = f"reading from Kafka failed: {exc}"
            raise StorageError(msg, retriable=True) from exc
        finally:
            consumer.close()
        whole = {}
        for ident, pieces in parts.items():
            if len(pieces) == counts[ident]:
                whole[ident] = b"".join(pieces[i] for i in range(counts[ident]))
        return whole

    def _fetch(self, handle: ChangelogHandle, location: dict[str, LocationValue]) -> FetchedChangeSet:
        topic, partition, sqn = str(location["topic"]), int(location["partition"]), int(location["sqn"])  # type: ignore[arg-type]
        where = f"kafka://{topic}/{partition}@{location['first']}-{location['last']}"
        blob = self._fetched.get((topic, partition, sqn, str(location.get("writer")), handle.epoch))
        if blob is None:
            msg = (
                f"change set {sqn} of log {handle.log_id!r} (epoch {handle.epoch}) is incomplete in the range"
            )
            raise CorruptedError(msg, location=where, offset=int(location["first"]))  # type: ignore[arg-type]
        return FetchedChangeSet(blob, 0, where)


class KafkaStorage(ChangeSetStorage):
    """Change sets of a job in topic ``<prefix>.<job>``, partitioned by log."""

    def __init__(self, config: Config, job_id: str) -> None:
        super().__init__(
            job_id,
            **storage_settings(config),
        )
        self.factory = ClientFactory(config)
        self._config = config
        self.topic = f"{config.get(TOPIC)}.{self.job_id}"
        self.claims_topic = f"{self.topic}.claims"
        self._producer: Any = None
        if self.read_only:  # readers consume the topics their handles name: no topic, producer or claim
            return
        self.partitions = ensure_topics(
            self.factory, config, [self.topic, self.claims_topic], compacted=frozenset({self.claims_topic})
        )
        self.chunk_size = self.factory.max_message
        self.claims = ClaimsTracker(
            self.factory, self.claims_topic, self.job_id, config.get(CLAIMS_KEPT_PRODUCERS)
        )
        self._fatal = threading.Event()
        self._producer_lock = threading.Lock()
        self._producer = self._new_producer()
        # Fetch the topic's metadata now rather than on the first persist.
        self._producer.list_topics(self.topic, timeout=self.factory.timeout)
        self._truncator = RecordTruncator(self.factory, self.topic, self.partitions)
        self._ledgers: dict[int, PartitionLedger] = {}
        self._ledgers_lock = threading.Lock()

    def _record_owner(self, owner: str) -> str:
        return record_owner(self.factory, self._config, self.topic, owner)

    @property
    def identifier(self) -> str:
        """``kafka``."""
        return IDENTIFIER

    def partition(self, log_id: str) -> int:
        """Data partition of ``log_id``."""
        return partition_for(f"{self.job_id}/{log_id}", self.partitions)

    def claims_partition(self, log_id: str) -> int:
        """Claims partition of ``log_id``: the data partition's number, in the claims topic.

        Fencing relies on that: a data partition's claims are in the claims
        partition of the same number.
        """
        return self.partition(log_id)

    def ledger(self, partition: int) -> PartitionLedger:
        """What this storage knows about the offsets of data partition ``partition``."""
        ledger = self._ledgers.get(partition)  # on every record: no lock once it exists
        if ledger is None:
            with self._ledgers_lock:
                ledger = self._ledgers.setdefault(partition, PartitionLedger())
        return ledger

    def speculate(self, partition: int) -> tuple[int, tuple[int, int]]:
        """Ask for the claims partition's offsets now; returns ``(highest delivered before, watermarks)``.

        The delivered offset is read before the request is sent: every claim
        marker at or below it was appended after its claim committed, so that
        claim lies below the end offset.
        """
        seen = self.ledger(partition).highest
        self.metrics.inc("fencing_requests")
        return seen, self.claims.watermarks(partition)

    def rule_out_fencing(
        self,
        partition: int,
        last: int,
        speculation: tuple[int, tuple[int, int]] | None,
        log_id: str,
        epoch: int,
        token: str,
    ) -> None:
        """Raise :class:`FencedError` if a newer claim of ``log_id`` came before offset ``last``.

        :param last: the greatest offset of the persist's records (all delivered).
        :param speculation: what :meth:`speculate` returned before the records were flushed.
        """
        ledger = self.ledger(partition)
        claims = self.claims
        if ledger.follows(last):
            # No foreign record since the last look: no claim marker either.
            claims.verify_owner(log_id, epoch, token)
            ledger.speculate = False
            return
        if speculation is None:
            # A foreign record came in unexpectedly; asked now, after delivery, the
            # end offset lies above the claim of any marker below ``last``.
            self.metrics.inc("fencing_requests")
            claims.check(partition, log_id, epoch, token)
            ledger.cover(last)
        else:
            seen, watermarks = speculation
            claims.check(partition, log_id, epoch, token, watermarks)
            ledger.cover(seen)
        ledger.speculate = not ledger.follows(last)

    def produce(self, partition: int, **kwargs: Any) -> None:
        """Produce to the data topic; the record's offset goes into the partition's ledger."""
        ledger = self.ledger(partition)
        callback = kwargs.pop("on_delivery", None)

        def delivered(err: Any, message: Any) -> None:
            if err is None:
                ledger.delivered(message.offset())
            elif err.fatal() or err.code() in _poisoning_errors():
                self._fatal.set()
            if callback is not None:
                callback(err, message)

        deadline = time.monotonic() + self.factory.timeout
        while True:
            try:
                self._producer.produce(self.topic, partition=partition, on_delivery=delivered, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    msg = "the producer queue stayed full: Kafka is not keeping up"
                    raise StorageError(msg, retriable=True) from None
                self._producer.poll(0.05)

    def _claim_log(self, log_id: str, epoch: int) -> str:
        """Claim the log, then leave a marker in its data partition (after the commit)."""
        token = self.claims.claim(self.claims_partition(log_id), log_id, epoch)
        partition = self.partition(log_id)
        failures: list[str] = []

        def delivered(err: Any, message: Any) -> None:
            if err is not None:
                failures.append(str(err))

        self.produce(
            partition,
            key=f"{self.job_id}/{log_id}".encode(),
            value=f"{epoch} {token}".encode(),
            headers=claim_headers(log_id, epoch, token),
            on_delivery=delivered,
        )
        self.await_delivery(failures, f"marking the claim of log {log_id!r} in {self.topic}[{partition}]")
        return token

    def await_delivery(
        self, errors: list[str], what: str, delivered: Callable[[], bool] = lambda: True
    ) -> None:
        """Flush the producer; raise a retriable :class:`StorageError` naming ``what`` if anything failed.

        :param errors: filled by the delivery callbacks of the records in question.
        :param delivered: whether every record in question reported its offset.
        """
        remaining = self._producer.flush(self.factory.timeout)
        if remaining or errors or not delivered():
            detail = errors[0] if errors else "not delivered in time"
            if self._fatal.is_set():
                self._replace_producer()
                detail += " (the producer hit a fatal error and was replaced: retry)"
            msg = f"{what} failed: {detail}"
            raise StorageError(msg, retriable=True)

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        def on_error(err: Any) -> None:
            if err.fatal():
                self._fatal.set()

        return Producer({**self.factory.producer_config(), "error_cb": on_error}, logger=log)

    def _replace_producer(self) -> None:
        """Start a new producer after a fatal error, which poisons an idempotent producer for good.

        Seen with Tansu after a restart: the broker lost its producer state and
        answers PRODUCER_FENCED to every later produce of the old producer.
        """
        with self._producer_lock:
            if not self._fatal.is_set():
                return  # another thread replaced it already
            old, self._producer = self._producer, self._new_producer()
            self._fatal.clear()
        log.warning("kafka storage: the producer hit a fatal error and was replaced")
        self._metrics.inc("producer_replacements")
        old.purge()

    def _make_writer(self, log_id: str, key_groups: KeyGroupRange, epoch: int, token: str) -> KafkaWriter:
        return KafkaWriter(self, log_id, key_groups, epoch, token)

    def create_reader(self) -> KafkaReader:
        """Create a reader (one per thread)."""
        return KafkaReader(self)

    def discard(self, handles: Iterable[ChangelogHandle]) -> None:
        """Count the discarded change sets; their records go when the coordinator collects orphans.

        Records of many logs and processes share a partition, so deleting below an
        offset is only safe with the checkpoint coordinator's view of every live
        handle: see :meth:`collect_orphans`.
        """
        self._check_writable()
        handles = list(handles)
        self._metrics.inc("discarded_change_sets", sum(len(h.locations) for h in handles))

    def collect_orphans(self, live: Iterable[ChangelogHandle], *, older_than: float) -> int:
        """Delete (DeleteRecords) every partition's records below what ``live`` and the cutoff still need.

        A broker without DeleteRecords is probed once; then topic retention
        (``dstl.kafka.topic.config.retention.ms``) frees the records, as logged.

        :returns: the partitions truncated.
        """
        self._check_writable()
        if self._truncator.supported is False:
            return 0
        plan, lows = self._truncator.plan(live, IDENTIFIER, older_than)
        truncated = self._truncator.delete_below(plan, lows)
        self._metrics.inc("truncated_partitions", truncated)
        return truncated

    def _close_resources(self) -> None:
        if self._producer is None:  # read only: nothing was opened
            return
        remaining = self._producer.flush(self.factory.timeout)
        if remaining:
            log.warning("kafka storage closed with %d undelivered records", remaining)
        self.claims.close()
