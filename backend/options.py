"""Configuration options of the changelog state backend (Flink's names)."""

from __future__ import annotations

from dstl.spi import ConfigOption, OptionType, UnderCheckpoint, hookimpl, parse_duration, parse_size

from .keygroups import MAX_KEY_GROUPS
from .materialization.codecs import CODEC_IDS

__all__ = [
    "BACKEND_DELEGATE",
    "BACKEND_LMDB_DIR",
    "BACKEND_LMDB_MAP_SIZE",
    "BACKEND_MAX_PARALLELISM",
    "BACKEND_OPTIONS",
    "CHANGELOG_MATERIALIZATION_BRIDGE",
    "CHANGELOG_MATERIALIZATION_COMPRESSION",
    "CHANGELOG_MATERIALIZATION_ENCODER_NICENESS",
    "CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM",
    "CHANGELOG_MATERIALIZATION_FULL_EVERY",
    "CHANGELOG_MATERIALIZATION_INTERVAL",
    "CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO",
    "CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS",
    "CHANGELOG_MAX_FAILURES_ALLOWED",
    "CHANGELOG_RESTORE_FORK_REPLAY_FROM",
    "CHANGELOG_SQUASH_UPDATES",
    "CHECKPOINTS_DIR",
    "CHECKPOINTS_NUM_RETAINED",
    "CHECKPOINTS_ON_DAMAGED",
    "CHECKPOINTS_ORPHAN_COLLECTION_GRACE",
    "CHECKPOINTS_ORPHAN_COLLECTION_INTERVAL",
    "CHECKPOINTS_STORAGE_OPTIONS_PREFIX",
    "SAVEPOINT_PATH",
    "TTL_CLEANUP_KEYS_PER_CHECKPOINT",
]

CHECKPOINTS_DIR: ConfigOption[str | None] = ConfigOption(
    "state.checkpoints.dir",
    OptionType.STRING,
    None,
    "fsspec URL where materialized snapshots (and checkpoint metadata) are written.",
    aliases=("execution.checkpointing.dir",),
    under_checkpoint=UnderCheckpoint("dstl-state", as_url=True),
)

CHECKPOINTS_STORAGE_OPTIONS_PREFIX: ConfigOption[str | None] = ConfigOption(
    "state.checkpoints.storage-options.*",
    OptionType.STRING,
    None,
    "fsspec storage options of state.checkpoints.dir (credentials, endpoint_url...); JSON values "
    "(true, 8, {...}) are passed as such.",
)

SAVEPOINT_PATH: ConfigOption[str | None] = ConfigOption(
    "state.savepoint.path",
    OptionType.STRING,
    None,
    "A savepoint directory (dstl savepoint) a job without checkpoints of its own starts from, "
    "with any storage; ignored once the job has a checkpoint.",
    aliases=(
        "execution.savepoint.path",
        "execution.state-recovery.path",
    ),
)

CHECKPOINTS_NUM_RETAINED: ConfigOption[int] = ConfigOption(
    "state.checkpoints.num-retained",
    OptionType.INT,
    1,
    "Completed checkpoints kept; what none of them references is discarded.",
    minimum=1,
    aliases=("execution.checkpointing.num-retained",),
)

CHECKPOINTS_ON_DAMAGED: ConfigOption[str] = ConfigOption(
    "state.checkpoints.on-damaged",
    OptionType.ENUM,
    "fail",
    "What recovery does when the latest checkpoint document is damaged or unreadable: fail (stop, "
    "naming the file) or previous (continue from the newest intact checkpoint: a logged rollback).",
    choices=("fail", "previous"),
)

CHECKPOINTS_ORPHAN_COLLECTION_INTERVAL: ConfigOption[float] = ConfigOption(
    "state.checkpoints.orphan-collection.interval",
    OptionType.DURATION,
    parse_duration("10min"),
    "How often the coordinator deletes change data no retained checkpoint references (failed or "
    "fenced attempts); it also does so on recovery.",
    minimum=0,
)

CHECKPOINTS_ORPHAN_COLLECTION_GRACE: ConfigOption[float] = ConfigOption(
    "state.checkpoints.orphan-collection.grace",
    OptionType.DURATION,
    parse_duration("10min"),
    "Change data younger than this is never collected as an orphan: longer than any attempt takes "
    "from its persist to its checkpoint's completion. At least 1s, and at least the longest an upload "
    "of the storage may take (filesystem: upload.timeout x max-attempts plus the delays between).",
    minimum=1,
)

CHANGELOG_MATERIALIZATION_INTERVAL: ConfigOption[float] = ConfigOption(
    "state.changelog.materialization.interval",
    OptionType.DURATION,
    parse_duration("10min"),
    "How often the working state is materialized so the log before it can be truncated.",
    aliases=("state.changelog.periodic-materialize.interval",),
)

CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO: ConfigOption[float] = ConfigOption(
    "state.changelog.materialization.max-log-ratio",
    OptionType.FLOAT,
    1.0,
    "Also materialize when the log a restore would replay exceeds this multiple of the materialized "
    "state (at least 1 MiB): bounds space and recovery for workloads that churn state. 0 turns it off.",
    minimum=0,
)

CHANGELOG_SQUASH_UPDATES: ConfigOption[bool] = ConfigOption(
    "state.changelog.squash-updates",
    OptionType.BOOL,
    False,
    "Log only the last of several replacing updates (value put, clear, list set) of a key between "
    "checkpoints: less log for hot keys and windows, the appends move to checkpoint time.",
)

CHANGELOG_RESTORE_FORK_REPLAY_FROM: ConfigOption[int] = ConfigOption(
    "state.changelog.restore.fork-replay-from",
    OptionType.SIZE,
    parse_size("1mb"),
    "A restore decodes and squashes logs of at least this size in a forked process while it loads "
    "the snapshots, then applies the result at snapshot speed: recovery close to a snapshot-only "
    "restore on two or more cores. 0 turns it off (also off where os.fork does not exist).",
    minimum=0,
)

CHANGELOG_MATERIALIZATION_FULL_EVERY: ConfigOption[int] = ConfigOption(
    "state.changelog.materialization.full-every",
    OptionType.INT,
    5,
    "Every k-th materialization is full; the others hold only keys changed or removed since.",
    minimum=1,
)

TTL_CLEANUP_KEYS_PER_CHECKPOINT: ConfigOption[int] = ConfigOption(
    "state.ttl.cleanup.keys-per-checkpoint",
    OptionType.INT,
    10_000,
    "Keys that a full snapshot found expired (TTL) and that are removed from the working state per "
    "checkpoint; a mass expiry is spread over checkpoints instead of stalling one batch.",
    minimum=1,
)

CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS: ConfigOption[int] = ConfigOption(
    "state.changelog.materialization.max-tracked-keys",
    OptionType.INT,
    200_000,
    "Keys changed since the last snapshot that are tracked one by one (about 85 B each); beyond "
    "it, the key groups with the most changes are snapshotted whole by the next incremental. "
    "Bounds memory whatever the state's size.",
    minimum=1,
)

CHANGELOG_MATERIALIZATION_COMPRESSION: ConfigOption[str] = ConfigOption(
    "state.changelog.materialization.compression",
    OptionType.ENUM,
    "zstd",
    "Compression of snapshot sections (each on its own, so partial restores stay partial): zstd "
    "(level 1), lz4 or none.",
    choices=tuple(CODEC_IDS),
)

CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM: ConfigOption[int] = ConfigOption(
    "state.changelog.materialization.encode-apart-from",
    OptionType.SIZE,
    parse_size("8mb"),
    "A snapshot that reads a copy of the LMDB working state at least this big is encoded by a separate "
    "Python process at a lower CPU priority, then uploaded: the task's Python process keeps its GIL for "
    "batches. 0 encodes in the task's process (also off outside POSIX).",
    minimum=0,
)

CHANGELOG_MATERIALIZATION_ENCODER_NICENESS: ConfigOption[int] = ConfigOption(
    "state.changelog.materialization.encoder-niceness",
    OptionType.INT,
    10,
    "The CPU niceness the snapshot encoder process adds to the task's. 10: beside busy batches on its "
    "core it gets about a tenth of it, so batches barely slow, but a snapshot of millions of keys takes "
    "minutes and recovery replays that much more log; 0 shares the core equally.",
    minimum=0,
    maximum=19,
)

CHANGELOG_MATERIALIZATION_BRIDGE: ConfigOption[bool] = ConfigOption(
    "state.changelog.materialization.bridge",
    OptionType.BOOL,
    True,
    "With a full snapshot, also write the keys changed since the previous chain and keep that "
    "chain one generation longer: a working copy on the old chain (an instance that ran on another "
    "executor meanwhile) then catches up with a delta instead of restoring the full state.",
)

CHANGELOG_MAX_FAILURES_ALLOWED: ConfigOption[int] = ConfigOption(
    "state.changelog.max-failures-allowed",
    OptionType.INT,
    3,
    "Consecutive materialization failures tolerated before checkpoints fail.",
    minimum=0,
)

BACKEND_DELEGATE: ConfigOption[str] = ConfigOption(
    "state.backend.delegate",
    OptionType.ENUM,
    "heap",
    "Working state: heap (dicts in the process) or lmdb (a file on local disk that the "
    "processes of a host open one after another).",
    choices=("heap", "lmdb"),
)

BACKEND_LMDB_DIR: ConfigOption[str | None] = ConfigOption(
    "state.backend.lmdb.dir",
    OptionType.STRING,
    None,
    "Local directory of the LMDB working state (required with state.backend.delegate=lmdb).",
)

BACKEND_LMDB_MAP_SIZE: ConfigOption[int] = ConfigOption(
    "state.backend.lmdb.map-size",
    OptionType.SIZE,
    parse_size("1gb"),
    "Initial memory map of an operator instance's LMDB file; it doubles whenever a write does not fit "
    "(the file grows with the data, not with the map).",
    minimum=1 << 20,
    maximum=1 << 44,
)

BACKEND_MAX_PARALLELISM: ConfigOption[int] = ConfigOption(
    "state.backend.max-parallelism",
    OptionType.INT,
    128,
    "Number of key groups (the most instances an operator can be rescaled to).",
    minimum=1,
    maximum=MAX_KEY_GROUPS,
)


BACKEND_OPTIONS = (
    CHECKPOINTS_DIR,
    CHECKPOINTS_STORAGE_OPTIONS_PREFIX,
    SAVEPOINT_PATH,
    CHECKPOINTS_NUM_RETAINED,
    CHECKPOINTS_ON_DAMAGED,
    CHECKPOINTS_ORPHAN_COLLECTION_INTERVAL,
    CHECKPOINTS_ORPHAN_COLLECTION_GRACE,
    CHANGELOG_MATERIALIZATION_INTERVAL,
    CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO,
    CHANGELOG_SQUASH_UPDATES,
    CHANGELOG_RESTORE_FORK_REPLAY_FROM,
    CHANGELOG_MATERIALIZATION_FULL_EVERY,
    TTL_CLEANUP_KEYS_PER_CHECKPOINT,
    CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS,
    CHANGELOG_MATERIALIZATION_COMPRESSION,
    CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM,
    CHANGELOG_MATERIALIZATION_ENCODER_NICENESS,
    CHANGELOG_MATERIALIZATION_BRIDGE,
    CHANGELOG_MAX_FAILURES_ALLOWED,
    BACKEND_DELEGATE,
    BACKEND_LMDB_DIR,
    BACKEND_LMDB_MAP_SIZE,
    BACKEND_MAX_PARALLELISM,
)


@hookimpl
def dstl_config_options() -> list[ConfigOption]:
    """Declare the backend's options (the Spark integration's too)."""
    from .spark.options import SPARK_OPTIONS  # cheap: the Spark package imports PySpark lazily

    return [*BACKEND_OPTIONS, *SPARK_OPTIONS]
