"""The ``kafka`` storage's plugin (entry point ``dstl.storage: kafka``)."""

from __future__ import annotations

from dstl.spi import StorageSpec
from dstl.spi.storage_plugin import StoragePlugin

from .options import KAFKA_OPTIONS

plugin = StoragePlugin(
    StorageSpec(
        identifier="kafka",
        factory="dstl.kafka._private.storage:KafkaStorage",
        description="Change sets as Kafka records, fenced by per-log claims (confluent-kafka).",
        options=KAFKA_OPTIONS,
        capabilities=frozenset({"fencing", "survives_process_kill", "multi_process", "failure_injection"}),
        install_hint="pip install 'dstl[kafka]'",
    ),
    # A Tansu broker on loopback, or DSTL_TEST_KAFKA_BOOTSTRAP.
    environment="dstl.kafka._private.conformance:kafka_environment",
    backdoor="dstl.kafka._private.conformance:KafkaBackdoor",
)
