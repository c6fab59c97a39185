"""Physical truncation of a job's data partitions (DeleteRecords), driven by the live handles.

Records of many logs and processes share a partition, so only the checkpoint
coordinator, which knows every handle a retained checkpoint holds, can name an
offset below which nothing is needed. Below the *earliest* of (a) the first
record of any live handle in the partition and (b) the first record written at
or after the in-flight cutoff, every record is an orphan or already discarded.

Brokers without DeleteRecords (Tansu closes the connection) are probed once per
storage; discarded records are then freed by topic retention, said once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from dstl.spi import ChangelogHandle, StorageError
from dstl.spi.kit.changeset_reader import checked_locations

from .clients import ClientFactory
from .records import LOCATION_FIELDS

log = logging.getLogger(__name__)


def live_floors(topic: str, live: Iterable[ChangelogHandle], identifier: str) -> dict[int, int]:
    """Per data partition of ``topic``: the smallest offset a ``live`` handle still reads."""
    floors: dict[int, int] = {}
    for handle in live:
        if handle.storage_id != identifier:
            continue
        for loc in checked_locations(handle, LOCATION_FIELDS):
            if loc.get("topic") != topic:
                continue
            partition, first = int(loc["partition"]), int(loc["first"])  # type: ignore[arg-type]
            floors[partition] = min(first, floors.get(partition, first))
    return floors


def truncation_offsets(
    partitions: int,
    floors: Mapping[int, int],
    cutoffs: Mapping[int, int],
    low_watermarks: Mapping[int, int],
) -> dict[int, int]:
    """Offsets to delete records below, per partition; partitions with nothing to delete are left out.

    :param floors: per partition, the first offset a live handle reads (see :func:`live_floors`).
    :param cutoffs: per partition, the first offset written at or after the in-flight
        cutoff (the high watermark when nothing is that new). A partition missing
        here is not truncated: without the cutoff, an attempt in flight may be below.
    :param low_watermarks: per partition, the current start of the log.
    """
    plan: dict[int, int] = {}
    for partition in range(partitions):
        if partition not in cutoffs:
            continue
        safe = min(cutoffs[partition], floors.get(partition, cutoffs[partition]))
        if safe > low_watermarks.get(partition, 0):
            plan[partition] = safe
    return plan


class RecordTruncator:
    """Deletes records below planned offsets, if the broker supports DeleteRecords."""

    def __init__(self, factory: ClientFactory, topic: str, partitions: int) -> None:
        self._factory = factory
        self._topic = topic
        self._partitions = partitions
        #: ``None`` until the first DeleteRecords request answers (or fails for good).
        self.supported: bool | None = None

    def plan(
        self, live: Iterable[ChangelogHandle], identifier: str, older_than: float
    ) -> tuple[dict[int, int], dict[int, int]]:
        """What :func:`truncation_offsets` gives for ``live`` and the cutoff ``older_than`` (seconds).

        :returns: the plan, and every partition's low watermark.
        """
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        floors = live_floors(self._topic, live, identifier)
        consumer = Consumer(self._factory.consumer_config(), logger=log)
        timeout = self._factory.timeout
        try:
            lows: dict[int, int] = {}
            highs: dict[int, int] = {}
            for p in range(self._partitions):
                lows[p], highs[p] = consumer.get_watermark_offsets(
                    TopicPartition(self._topic, p), timeout=timeout, cached=False
                )
            stamp = int(min(older_than, time.time()) * 1000)  # a cutoff in the future means "now"
            asked = [TopicPartition(self._topic, p, stamp) for p in range(self._partitions)]
            cutoffs: dict[int, int] = {}
            for answer in consumer.offsets_for_times(asked, timeout=timeout):
                if answer.error is None:
                    # -1: no record that new; everything up to the end is older.
                    newest = highs[answer.partition]
                    cutoffs[answer.partition] = newest if answer.offset < 0 else answer.offset
        except KafkaException as exc:
            msg = f"reading the offsets of {self._topic} failed: {exc}"
            raise StorageError(msg, retriable=True) from exc
        finally:
            consumer.close()
        return truncation_offsets(self._partitions, floors, cutoffs, lows), lows

    def delete_below(self, plan: Mapping[int, int], low_watermarks: Mapping[int, int]) -> int:
        """Delete the records below ``plan``'s offsets; returns the partitions truncated.

        The first request is the probe: a broker that refuses it (unsupported,
        connection closed) is not asked again, and the fallback to retention is
        logged once. With nothing planned, the probe deletes below partition 0's
        low watermark, which deletes nothing.
        """
        if self.supported is False or (not plan and self.supported):
            return 0
        probe_only = not plan
        if probe_only:
            plan = {0: low_watermarks.get(0, 0)}
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self._factory.admin_config(), logger=log)
        timeout = self._factory.timeout
        wanted = [TopicPartition(self._topic, p, offset) for p, offset in sorted(plan.items())]
        try:
            futures: dict[Any, Any] = admin.delete_records(
                wanted, request_timeout=timeout, operation_timeout=timeout
            )
            for future in futures.values():
                future.result(timeout)
        except KafkaException as exc:
            if self.supported is None:
                self.supported = False
                log.warning(
                    "kafka storage: the broker refused DeleteRecords on %s (%s); discarded change sets "
                    "are freed by topic retention (dstl.kafka.topic.config.retention.ms) instead",
                    self._topic,
                    exc,
                )
                return 0
            msg = f"DeleteRecords on {self._topic} failed: {exc}"
            raise StorageError(msg, retriable=True) from exc
        self.supported = True
        return 0 if probe_only else len(wanted)
