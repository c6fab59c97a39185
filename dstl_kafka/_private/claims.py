"""Writer claims: who owns each log, in a claims topic partitioned like the data.

A writer claims its log when it is created: ``init_transactions`` on a
transactional producer whose id is derived from job and log (fencing older
transactional claimers), then a committed claim record ``epoch token``. After
the commit the storage leaves a marker in the log's data partition (see
``ledger``), so a persist has to ask for the claims only when a foreign record
landed in its partition. Asking means: the claims partition's end offset, and
only if it grew, the new claims. The greatest ``(epoch, token)`` claimed for a log
owns it.

``init_transactions`` is most of a claim's cost (one round trip to find the
coordinator and one to bump the producer epoch: 50 ms on loopback, more on a busy
broker), and a Spark task claims its log every batch. So the producer of a log's
last claim is kept (a few, least recently used out) and the next claim of that log
commits on it directly. That fences exactly as a fresh one would: while the kept
producer is the transactional id's current one, nobody else has initialised it, so
no other claimer's transaction is open; once another process has, the kept
producer's commit fails as fenced and the claim starts over with a fresh producer.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any

from dstl.spi import FencedError, StorageError

from .clients import ClientFactory

log = logging.getLogger(__name__)


class ClaimsTracker:
    """Reads claim partitions (one consumer, serialised) and remembers the owners."""

    def __init__(self, factory: ClientFactory, topic: str, job_id: str, kept_producers: int = 0) -> None:
        """:param kept_producers: claim producers kept for the next claim of their log (0: none)."""
        from confluent_kafka import Consumer

        self._factory = factory
        self._kept_producers = kept_producers
        self._producers: OrderedDict[str, Any] = OrderedDict()  # log id -> initialised claim producer
        self._producers_lock = threading.Lock()
        self.producers_initialised = 0
        self._topic = topic
        self._job = job_id
        self._consumer = Consumer(factory.consumer_config(), logger=log)
        # End offsets must count records of open transactions too: a read_committed
        # end offset is the last stable offset, which stops short of a committed
        # claim behind another claimer's open transaction (and Tansu answers 0 then).
        self._offsets = Consumer(
            factory.consumer_config(**{"isolation.level": "read_uncommitted"}), logger=log
        )
        self._lock = threading.Lock()
        self._read_to: dict[int, int] = {}
        self.owners: dict[str, tuple[int, str]] = {}

    def watermarks(self, partition: int) -> tuple[int, int]:
        """Low and end offset of a claims partition, asked of the broker now (one round trip).

        The end counts records of open transactions: every claim committed before
        the call lies below it. The GIL is released while librdkafka waits, so a
        persist asks while its own records are in flight.
        """
        with self._lock:
            return self._watermarks(partition)

    def _watermarks(self, partition: int) -> tuple[int, int]:
        """Low and high offsets of a claims partition, from the broker (hold ``_lock``)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            low, high = self._offsets.get_watermark_offsets(
                TopicPartition(self._topic, partition), timeout=self._factory.timeout, cached=False
            )
        except KafkaException as exc:
            msg = f"cannot read the offsets of claims {self._topic}[{partition}]: {exc}"
            raise StorageError(msg, retriable=True) from exc
        return int(low), int(high)

    def refresh(self, partition: int, watermarks: tuple[int, int] | None = None) -> None:
        """Read claims appended to ``partition`` since the last refresh.

        :param watermarks: the partition's :meth:`watermarks`, when already asked
            for; otherwise they are asked for now.
        """
        from confluent_kafka import TopicPartition

        if watermarks is not None and watermarks[1] <= self._read_to.get(partition, 0):
            return  # nothing new: the common case of every persist
        with self._lock:
            low, high = self._watermarks(partition) if watermarks is None else watermarks
            start = max(low, self._read_to.get(partition, 0))
            if high <= start:
                self._read_to[partition] = max(start, high)
                return
            self._consumer.assign([TopicPartition(self._topic, partition, start)])
            try:
                self._read_to[partition] = self._read(partition, start, high)
            finally:
                self._consumer.unassign()  # no background fetch may delay the next check

    def _read(self, partition: int, start: int, high: int) -> int:
        """Apply the claims in ``[start, high)``; returns the position reached (``>= high``).

        read_committed stops at an open transaction until it ends, so a claim in
        flight is waited for rather than skipped (it may commit a moment later).
        """
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + self._factory.timeout
        position = start
        while position < high:
            if time.monotonic() > deadline:
                msg = (
                    f"reading claims of {self._topic}[{partition}] timed out at {position} of {high} "
                    "(a claiming transaction stays open?)"
                )
                raise StorageError(msg, retriable=True)
            message = self._consumer.poll(0.1)
            if message is None or message.error():
                # The position moves past transaction markers and aborted records, which poll never returns.
                (reached,) = self._consumer.position([TopicPartition(self._topic, partition)])
                position = max(position, reached.offset)
                continue
            offset = message.offset()
            if offset is None:
                continue
            position = offset + 1
            self._apply(message.key(), message.value())
        return position

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if not key or not value:
            return
        job, _, log_id = key.decode(errors="replace").partition("/")
        if job != self._job:
            return
        epoch_text, _, token = value.decode(errors="replace").partition(" ")
        if epoch_text.isdigit() and (int(epoch_text), token) > self.owners.get(log_id, (-1, "")):
            self.owners[log_id] = (int(epoch_text), token)

    def check(
        self, partition: int, log_id: str, epoch: int, token: str, watermarks: tuple[int, int] | None = None
    ) -> None:
        """Raise :class:`FencedError` when a greater claim owns ``log_id``.

        :param watermarks: the claims partition's :meth:`watermarks`, when already known.
        """
        self.refresh(partition, watermarks)
        self.verify_owner(log_id, epoch, token)

    def verify_owner(self, log_id: str, epoch: int, token: str) -> None:
        """Raise :class:`FencedError` when a greater claim already known here owns ``log_id``."""
        owner = self.owners.get(log_id)
        if owner is not None and owner != (epoch, token):
            raise FencedError.by_owner(log_id, epoch, owner[0])

    def claim(self, partition: int, log_id: str, epoch: int) -> str:
        """Claim ``log_id`` at ``epoch``; returns the writer token."""
        self.refresh(partition)
        owner = self.owners.get(log_id)
        if owner is not None and owner[0] > epoch:
            msg = f"log {log_id!r} already has a writer with epoch {owner[0]} > {epoch}"
            raise FencedError(msg)
        token = f"{epoch:020d}-{time.time_ns():020d}"
        record = {
            "topic": self._topic,
            "key": f"{self._job}/{log_id}".encode(),
            "value": f"{epoch} {token}".encode(),
            "partition": partition,
        }
        producer = self._take_producer(log_id)
        if producer is None or not self._commit(producer, record, fresh=False):
            producer = self._new_producer(log_id)
            self._commit(producer, record, fresh=True)
        self._keep_producer(log_id, producer)
        self._await_own_claim(partition, log_id, epoch, token)
        return token

    @property
    def kept(self) -> int:
        """Claim producers kept for their log's next claim."""
        with self._producers_lock:
            return len(self._producers)

    def _new_producer(self, log_id: str) -> Any:
        """A producer of the log's transactional id, not yet initialised."""
        from confluent_kafka import Producer

        # "/" is in no job id or log id: job "a.x" with log "y.kg0-8" and job "a" with "x.y.kg0-8" differ
        return Producer(self._factory.producer_config(**{"transactional.id": f"dstl/{self._job}/{log_id}"}))

    def _commit(self, producer: Any, record: dict[str, Any], *, fresh: bool) -> bool:
        """Commit ``record`` in a transaction of ``producer``; initialise it first when ``fresh``.

        :returns: whether it committed; ``False`` only for a kept producer (fenced
            or failed: the caller starts over with a fresh one).
        :raises StorageError: (retriable) when a fresh producer fails.
        """
        from confluent_kafka import KafkaException

        try:
            if fresh:
                producer.init_transactions(self._factory.timeout)
                with self._producers_lock:
                    self.producers_initialised += 1
            producer.begin_transaction()
            producer.produce(**record)
            producer.commit_transaction(self._factory.timeout)
        except KafkaException as exc:
            with warnings.catch_warnings():
                # A fenced producer cannot abort its transaction; close() says so, then frees it.
                warnings.simplefilter("ignore", RuntimeWarning)
                producer.close()
            if not fresh:
                log.debug(
                    "kept claim producer of %s failed (%s): initialising a fresh one", record["key"], exc
                )
                return False
            msg = f"claiming log {record['key'].decode()!r} failed: {exc}"
            raise StorageError(msg, retriable=True) from exc
        return True

    def _take_producer(self, log_id: str) -> Any:
        """The kept producer of ``log_id``'s last claim, now this caller's alone; or ``None``."""
        with self._producers_lock:
            return self._producers.pop(log_id, None)

    def _keep_producer(self, log_id: str, producer: Any) -> None:
        """Keep ``producer`` for the next claim of ``log_id``; close what falls out."""
        dropped = [producer] if self._kept_producers == 0 else []
        with self._producers_lock:
            if self._kept_producers > 0:
                previous = self._producers.pop(log_id, None)  # a concurrent claim's: the newer one wins
                if previous is not None:
                    dropped.append(previous)
                self._producers[log_id] = producer
                while len(self._producers) > self._kept_producers:
                    dropped.append(self._producers.popitem(last=False)[1])
        for old in dropped:
            old.close()

    def _await_own_claim(self, partition: int, log_id: str, epoch: int, token: str) -> None:
        """Return once the check that later fences this writer sees its own claim.

        A committed claim is not always visible at once (Tansu's S3 engine was seen to
        answer an end offset below it), and a writer created on a claim it cannot see
        would be fenced by an older one, or let that older one keep writing.

        :raises FencedError: when a greater claim owns the log by then.
        :raises StorageError: (retriable) when the claim stays invisible for
            ``dstl.kafka.request.timeout``.
        """
        deadline = time.monotonic() + self._factory.timeout
        pause = 0.005
        while True:
            self.refresh(partition)
            owner = self.owners.get(log_id)
            if owner == (epoch, token):
                return
            if owner is not None and owner > (epoch, token):
                raise FencedError.by_owner(log_id, epoch, owner[0])
            if time.monotonic() + pause > deadline:
                msg = (
                    f"the claim of log {log_id!r} at epoch {epoch} was committed but is not visible in "
                    f"{self._topic}[{partition}] after {self._factory.timeout:g}s (the broker's end offset "
                    "lags its commits); no writer was created, retry"
                )
                raise StorageError(msg, retriable=True)
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def close(self) -> None:
        """Close the consumers and the kept claim producers."""
        with self._producers_lock:
            producers = list(self._producers.values())
            self._producers.clear()
        for producer in producers:
            producer.close()
        with self._lock:
            self._consumer.close()
            self._offsets.close()
