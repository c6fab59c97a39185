"""Kafka-log changelog storage (identifier ``kafka``) through confluent-kafka.

Change sets are records (chunked above ``dstl.kafka.max-message-size``) in topic
``<prefix>.<job>``, partitioned by log, carrying log, epoch, writer and SQN in
headers. Writers are fenced by claims: ``init_transactions`` with a
transactional id per job and log, a committed claim record, and a claims check
raced against every produce. Reads are ``read_committed`` and bounded.
"""

from __future__ import annotations

from importlib import import_module

from .options import KAFKA_OPTIONS

__all__ = ["KAFKA_OPTIONS", "KafkaReader", "KafkaStorage", "KafkaWriter"]

#: The storage imports confluent-kafka: `import dstl.kafka` stays light for option discovery.
_LAZY = {name: "._private.storage" for name in ("KafkaReader", "KafkaStorage", "KafkaWriter")}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(import_module(module, __name__), name)
