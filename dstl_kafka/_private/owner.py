"""Whose job a job's topics are: an owner topic per checkpoint location, created exclusively.

Kafka has no conditional put, but topic creation is exclusive and names are
listed atomically: the owner of job ``J`` is recorded as topic
``<topic>.owner-<digest of the owner>`` holding one record, the owner's name. A
job finding another owner's topic (or, after creating its own, finding a second)
is refused; two jobs racing both refuse, neither proceeds on shared data.
"""

from __future__ import annotations

import hashlib
import logging

from dstl.spi import Config, StorageError

from ..options import TOPIC_CREATE
from .clients import ClientFactory, ensure_topics

log = logging.getLogger(__name__)

_MAX_OWNER = 4096


def owner_prefix(topic: str) -> str:
    """The prefix of the owner topics of the job whose data topic is ``topic``."""
    return f"{topic}.owner-"


def record_owner(factory: ClientFactory, config: Config, topic: str, owner: str) -> str:
    """Record ``owner`` as the owner of ``topic``'s job unless another is; returns the recorded owner.

    With ``dstl.kafka.topic.create=false`` nothing can be recorded: every owner is
    accepted (and logged), as the storage's default does.
    """
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    prefix = owner_prefix(topic)
    mine = prefix + hashlib.sha256(owner.encode()).hexdigest()[:24]
    others = [name for name in _listed(factory, AdminClient, prefix) if name != mine]
    if others:
        return _read_owner(factory, sorted(others)[0])
    if not config.get(TOPIC_CREATE):
        log.warning("dstl.kafka.topic.create is false: the owner of %s is not recorded", topic)
        return owner
    one_partition = config.with_values({"dstl.kafka.topic.partitions": 1})
    ensure_topics(factory, one_partition, [mine], compacted=frozenset({mine}))
    producer = Producer(factory.producer_config())
    producer.produce(mine, key=b"owner", value=owner.encode(), partition=0)
    if producer.flush(factory.timeout):
        msg = f"recording the owner of {topic} in {mine} timed out"
        raise StorageError(msg, retriable=True)
    others = [name for name in _listed(factory, AdminClient, prefix) if name != mine]
    return _read_owner(factory, sorted(others)[0]) if others else owner


def _listed(factory: ClientFactory, admin_class: type, prefix: str) -> list[str]:
    admin = admin_class(factory.admin_config(), logger=log)
    return [name for name in admin.list_topics(timeout=factory.timeout).topics if name.startswith(prefix)]


def _read_owner(factory: ClientFactory, owner_topic: str) -> str:
    """The owner recorded in ``owner_topic`` (its name when its record cannot be read in time)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(factory.consumer_config(), logger=log)
    try:
        consumer.assign([TopicPartition(owner_topic, 0, 0)])
        message = consumer.poll(factory.timeout)
        value = None if message is None or message.error() is not None else message.value()
        if value:
            return bytes(value[:_MAX_OWNER]).decode("utf-8", errors="replace")
    finally:
        consumer.close()
    return f"the job that created Kafka topic {owner_topic}"
