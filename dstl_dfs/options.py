"""Configuration options of the ``filesystem`` storage (Flink's ``dstl.dfs.*`` names).

Each is also accepted under Flink's ``state.changelog.dstl.dfs.*`` spelling.
"""

from __future__ import annotations

from dataclasses import replace

from dstl.spi import ConfigOption, OptionType, UnderCheckpoint, parse_duration, parse_size

__all__ = [
    "BASE_PATH",
    "BATCH_PERSIST_DELAY",
    "BATCH_PERSIST_SIZE_THRESHOLD",
    "DFS_OPTIONS",
    "DOWNLOAD_CACHE_IDLE_TIMEOUT",
    "DOWNLOAD_CACHE_MAX_SIZE",
    "DOWNLOAD_MAX_ATTEMPTS",
    "DOWNLOAD_TIMEOUT",
    "PREEMPTIVE_PERSIST_THRESHOLD",
    "S3_ACCESS_KEY_ID",
    "S3_ENDPOINT_URL",
    "S3_FAST_PATH",
    "S3_REGION",
    "S3_SECRET_ACCESS_KEY",
    "STORAGE_OPTIONS_PREFIX",
    "UPLOAD_MAX_ATTEMPTS",
    "UPLOAD_MAX_IN_FLIGHT",
    "UPLOAD_NEXT_ATTEMPT_DELAY",
    "UPLOAD_NUM_THREADS",
    "UPLOAD_RETRY_POLICY",
    "UPLOAD_TIMEOUT",
]

STORAGE_OPTIONS_PREFIX: ConfigOption[str | None] = ConfigOption(
    "dstl.dfs.storage-options.*",
    OptionType.STRING,
    None,
    "fsspec storage options of dstl.dfs.base-path (credentials, endpoint...); JSON values (true, "
    "8, {...}) are passed as such. On s3:// they apply to the s3fs path.",
)

BASE_PATH: ConfigOption[str | None] = ConfigOption(
    "dstl.dfs.base-path",
    OptionType.STRING,
    None,
    "fsspec URL under which change-set objects are written: file://, s3://, memory://, gs://.",
    under_checkpoint=UnderCheckpoint("dstl-dfs", as_url=True),
)

BATCH_PERSIST_DELAY: ConfigOption[float] = ConfigOption(
    "dstl.dfs.batch.persist-delay",
    OptionType.DURATION,
    parse_duration("10ms"),
    "How long persist requests are collected before one upload carries them all.",
)

BATCH_PERSIST_SIZE_THRESHOLD: ConfigOption[int] = ConfigOption(
    "dstl.dfs.batch.persist-size-threshold",
    OptionType.SIZE,
    parse_size("10mb"),
    "Upload at once when this many bytes are queued, without waiting for the delay.",
    minimum=1,
)

PREEMPTIVE_PERSIST_THRESHOLD: ConfigOption[int] = ConfigOption(
    "dstl.dfs.preemptive-persist-threshold",
    OptionType.SIZE,
    parse_size("5mb"),
    "Upload a writer's changes ahead of the checkpoint once this many bytes are buffered.",
    minimum=1,
)

UPLOAD_MAX_IN_FLIGHT: ConfigOption[int] = ConfigOption(
    "dstl.dfs.upload.max-in-flight",
    OptionType.SIZE,
    parse_size("100mb"),
    "Bytes being uploaded above which persists block (back-pressure).",
    minimum=1,
)

UPLOAD_TIMEOUT: ConfigOption[float] = ConfigOption(
    "dstl.dfs.upload.timeout",
    OptionType.DURATION,
    parse_duration("1s"),
    "After this long an upload attempt is raced by a new one (hedging); the slow one goes on.",
    minimum=0.001,
)

UPLOAD_MAX_ATTEMPTS: ConfigOption[int] = ConfigOption(
    "dstl.dfs.upload.max-attempts",
    OptionType.INT,
    3,
    "Attempts per upload, counting hedged ones; the persist fails when the last one fails.",
    minimum=1,
)

UPLOAD_RETRY_POLICY: ConfigOption[str] = ConfigOption(
    "dstl.dfs.upload.retry-policy",
    OptionType.ENUM,
    "fixed",
    "fixed: retry after upload.next-attempt-delay; none: a single attempt.",
    choices=("fixed", "none"),
)

UPLOAD_NEXT_ATTEMPT_DELAY: ConfigOption[float] = ConfigOption(
    "dstl.dfs.upload.next-attempt-delay",
    OptionType.DURATION,
    parse_duration("500ms"),
    "Pause before retrying a failed upload attempt.",
)

UPLOAD_NUM_THREADS: ConfigOption[int] = ConfigOption(
    "dstl.dfs.upload.num-threads",
    OptionType.INT,
    5,
    "Threads uploading objects in parallel.",
    minimum=1,
)

DOWNLOAD_CACHE_IDLE_TIMEOUT: ConfigOption[float] = ConfigOption(
    "dstl.dfs.download.cache-idle-timeout",
    OptionType.DURATION,
    parse_duration("10min"),
    "Downloaded objects are kept this long after their last read.",
    minimum=0,
)

DOWNLOAD_TIMEOUT: ConfigOption[float] = ConfigOption(
    "dstl.dfs.download.timeout",
    OptionType.DURATION,
    parse_duration("10s"),
    "How long one read of an object (or one fencing listing) may take before it is retried.",
    minimum=0.001,
)

DOWNLOAD_MAX_ATTEMPTS: ConfigOption[int] = ConfigOption(
    "dstl.dfs.download.max-attempts",
    OptionType.INT,
    3,
    "Attempts of a read or fencing listing on transient errors (5xx, resets, stalls, damaged "
    "bodies) before it fails with a retriable StorageError.",
    minimum=1,
)

DOWNLOAD_CACHE_MAX_SIZE: ConfigOption[int] = ConfigOption(
    "dstl.dfs.download.cache-max-size",
    OptionType.SIZE,
    parse_size("256mb"),
    "Bytes the download cache may hold; idle objects are evicted beyond it.",
)

S3_FAST_PATH: ConfigOption[bool] = ConfigOption(
    "dstl.dfs.s3.fast-path",
    OptionType.BOOL,
    True,
    "For s3:// use botocore directly (PutObject/GetObject/DeleteObject) instead of s3fs.",
)

S3_ENDPOINT_URL: ConfigOption[str | None] = ConfigOption(
    "dstl.dfs.s3.endpoint-url",
    OptionType.STRING,
    None,
    "S3 endpoint (MinIO, moto, another region's endpoint); default: AWS.",
)

S3_REGION: ConfigOption[str | None] = ConfigOption(
    "dstl.dfs.s3.region", OptionType.STRING, None, "S3 region; default: the standard AWS chain."
)

S3_ACCESS_KEY_ID: ConfigOption[str | None] = ConfigOption(
    "dstl.dfs.s3.access-key-id",
    OptionType.STRING,
    None,
    "S3 access key; default: the standard AWS credential chain (env, profile, instance role).",
)

S3_SECRET_ACCESS_KEY: ConfigOption[str | None] = ConfigOption(
    "dstl.dfs.s3.secret-access-key",
    OptionType.STRING,
    None,
    "S3 secret key (never logged); default: the standard AWS credential chain.",
)

_DECLARED = (
    STORAGE_OPTIONS_PREFIX,
    BASE_PATH,
    BATCH_PERSIST_DELAY,
    BATCH_PERSIST_SIZE_THRESHOLD,
    PREEMPTIVE_PERSIST_THRESHOLD,
    UPLOAD_MAX_IN_FLIGHT,
    UPLOAD_TIMEOUT,
    UPLOAD_MAX_ATTEMPTS,
    UPLOAD_RETRY_POLICY,
    UPLOAD_NEXT_ATTEMPT_DELAY,
    UPLOAD_NUM_THREADS,
    DOWNLOAD_CACHE_IDLE_TIMEOUT,
    DOWNLOAD_TIMEOUT,
    DOWNLOAD_MAX_ATTEMPTS,
    DOWNLOAD_CACHE_MAX_SIZE,
    S3_FAST_PATH,
    S3_ENDPOINT_URL,
    S3_REGION,
    S3_ACCESS_KEY_ID,
    S3_SECRET_ACCESS_KEY,
)

DFS_OPTIONS = tuple(replace(option, aliases=(f"state.changelog.{option.name}",)) for option in _DECLARED)
