"""Configuration options of the ``kafka`` storage."""

from __future__ import annotations

from dstl.spi import ConfigOption, OptionType, parse_duration, parse_size

__all__ = [
    "BOOTSTRAP_SERVERS",
    "CLAIMS_KEPT_PRODUCERS",
    "CONSUMER_PREFIX",
    "KAFKA_OPTIONS",
    "MAX_MESSAGE_SIZE",
    "PRODUCER_PREFIX",
    "REQUEST_TIMEOUT",
    "TOPIC",
    "TOPIC_CONFIG_PREFIX",
    "TOPIC_CREATE",
    "TOPIC_PARTITIONS",
    "TOPIC_REPLICATION_FACTOR",
]

BOOTSTRAP_SERVERS: ConfigOption[str | None] = ConfigOption(
    "dstl.kafka.bootstrap.servers", OptionType.STRING, None, "Kafka bootstrap servers. Required."
)

TOPIC: ConfigOption[str] = ConfigOption(
    "dstl.kafka.topic",
    OptionType.STRING,
    "dstl-changelog",
    "Topic prefix: a job writes to <prefix>.<job> and claims writers in <prefix>.<job>.claims.",
)

TOPIC_PARTITIONS: ConfigOption[int] = ConfigOption(
    "dstl.kafka.topic.partitions", OptionType.INT, 8, "Partitions of topics created on demand.", minimum=1
)

TOPIC_REPLICATION_FACTOR: ConfigOption[int] = ConfigOption(
    "dstl.kafka.topic.replication-factor",
    OptionType.INT,
    1,
    "Replication factor of topics created on demand.",
    minimum=1,
)

TOPIC_CREATE: ConfigOption[bool] = ConfigOption(
    "dstl.kafka.topic.create",
    OptionType.BOOL,
    True,
    "Create missing topics; false requires them to exist (and names the missing one).",
)

TOPIC_CONFIG_PREFIX: ConfigOption[str | None] = ConfigOption(
    "dstl.kafka.topic.config.*",
    OptionType.STRING,
    None,
    "Topic configs for created topics (retention.ms, ...).",
)

PRODUCER_PREFIX: ConfigOption[str | None] = ConfigOption(
    "dstl.kafka.producer.*", OptionType.STRING, None, "librdkafka producer settings (SASL/SSL, ...)."
)

CONSUMER_PREFIX: ConfigOption[str | None] = ConfigOption(
    "dstl.kafka.consumer.*", OptionType.STRING, None, "librdkafka consumer settings (SASL/SSL, ...)."
)

MAX_MESSAGE_SIZE: ConfigOption[int] = ConfigOption(
    "dstl.kafka.max-message-size",
    OptionType.SIZE,
    parse_size("900kb"),
    "Change sets larger than this are split into chunks (keep below the broker's message.max.bytes).",
    minimum=1024,
)

CLAIMS_KEPT_PRODUCERS: ConfigOption[int] = ConfigOption(
    "dstl.kafka.claims.kept-producers",
    OptionType.INT,
    16,
    "Transactional producers kept per storage so the next writer of the same log claims it without "
    "init_transactions (most of a writer's creation cost). Each holds a broker connection and "
    "librdkafka threads; 0 keeps none. Set it to the logs an executor writes for the full saving.",
    minimum=0,
)

REQUEST_TIMEOUT: ConfigOption[float] = ConfigOption(
    "dstl.kafka.request.timeout",
    OptionType.DURATION,
    parse_duration("30s"),
    "How long a persist, a read or a metadata request may take before failing with StorageError.",
    minimum=0.1,
)

KAFKA_OPTIONS = (
    BOOTSTRAP_SERVERS,
    TOPIC,
    TOPIC_PARTITIONS,
    TOPIC_REPLICATION_FACTOR,
    TOPIC_CREATE,
    TOPIC_CONFIG_PREFIX,
    PRODUCER_PREFIX,
    CONSUMER_PREFIX,
    MAX_MESSAGE_SIZE,
    CLAIMS_KEPT_PRODUCERS,
    REQUEST_TIMEOUT,
)
