"""confluent-kafka clients built from dstl config, and topic management."""

from __future__ import annotations

import logging
import uuid
import zlib
from typing import Any

from dstl.spi import Config, ConfigError, StorageError

from ..options import (
    BOOTSTRAP_SERVERS,
    MAX_MESSAGE_SIZE,
    REQUEST_TIMEOUT,
    TOPIC_CREATE,
    TOPIC_PARTITIONS,
    TOPIC_REPLICATION_FACTOR,
)

log = logging.getLogger(__name__)


def partition_for(key: str, partitions: int) -> int:
    """Stable partition of a log (CRC32 of ``job/log``; never Python's ``hash``)."""
    return zlib.crc32(key.encode()) % partitions


class ClientFactory:
    """Producer, consumer and admin settings: bootstrap + pass-through keys."""

    def __init__(self, config: Config) -> None:
        servers = config.get(BOOTSTRAP_SERVERS)
        if not servers:
            msg = "dstl.kafka.bootstrap.servers is not set: name the brokers, e.g. host1:9092,host2:9092"
            raise ConfigError(msg)
        self.servers = str(servers)
        self.timeout = config.get(REQUEST_TIMEOUT)
        self.producer_extra = config.with_prefix("dstl.kafka.producer.")
        self.consumer_extra = config.with_prefix("dstl.kafka.consumer.")
        self.max_message = config.get(MAX_MESSAGE_SIZE)

    def _common(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.servers,
            "socket.timeout.ms": int(self.timeout * 1000),
            "log_level": 3,
        }

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """An idempotent, acks=all producer that sends at once."""
        timeout_ms = int(self.timeout * 1000)
        return {
            **self._common(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "message.max.bytes": max(1_048_576, self.max_message + 64 * 1024),
            "message.timeout.ms": timeout_ms,
            "transaction.timeout.ms": max(timeout_ms, 60_000),
            **self.producer_extra,
            **overrides,
        }

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """A read_committed consumer that is only ever assigned partitions."""
        return {
            **self._common(),
            "group.id": f"dstl-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # Reads are bounded ranges: do not park fetches at the broker (librdkafka
            # queues later requests, e.g. the claims check, behind a parked fetch).
            "fetch.wait.max.ms": 5,
            "fetch.message.max.bytes": max(1_048_576, self.max_message + 64 * 1024),
            **self.consumer_extra,
            **overrides,
        }

    def admin_config(self) -> dict[str, Any]:
        """Admin client settings."""
        return {**self._common(), **self.producer_extra}


#: The claims topic keeps one claim per log: compacted by key (job/log), never expired,
#: so it does not grow with writer churn and retention never drops a live owner's claim.
CLAIMS_TOPIC_CONFIG = {"cleanup.policy": "compact"}


def ensure_topics(
    factory: ClientFactory, config: Config, names: list[str], *, compacted: frozenset[str] = frozenset()
) -> int:
    """Create or check ``names``; returns their partition count.

    :param compacted: names created with :data:`CLAIMS_TOPIC_CONFIG` instead of
        ``dstl.kafka.topic.config.*`` (whose retention is for change data).
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(factory.admin_config(), logger=log)
    try:
        existing = admin.list_topics(timeout=factory.timeout).topics
    except KafkaException as exc:
        msg = f"cannot reach Kafka at {factory.servers}: {exc}"
        raise StorageError(msg, retriable=True) from exc
    missing = [name for name in names if name not in existing]
    if missing and not config.get(TOPIC_CREATE):
        msg = f"topic {missing[0]!r} does not exist and dstl.kafka.topic.create is false: create it first"
        raise ConfigError(msg)
    if missing:
        partitions = config.get(TOPIC_PARTITIONS)
        topic_config = config.with_prefix("dstl.kafka.topic.config.")
        replication = config.get(TOPIC_REPLICATION_FACTOR)
        futures = admin.create_topics(
            [
                NewTopic(
                    n,
                    num_partitions=partitions,
                    replication_factor=replication,
                    config=dict(CLAIMS_TOPIC_CONFIG) if n in compacted else topic_config,
                )
                for n in missing
            ],
            request_timeout=factory.timeout,
        )
        for name, future in futures.items():
            try:
                future.result(factory.timeout)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc).lower():
                    msg = f"cannot create topic {name!r}: {exc}"
                    raise StorageError(msg, retriable=True) from exc
        existing = admin.list_topics(timeout=factory.timeout).topics
    counts = {len(existing[name].partitions) for name in names if name in existing}
    if len(counts) != 1:
        msg = f"topics {names} must exist with the same partition count, found {counts or 'none'}"
        raise StorageError(msg)
    return counts.pop()
