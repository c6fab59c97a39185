"""A backend's tunables as one frozen object, read from a config once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dstl.spi import Config

from ..filesystems import storage_options
from ..options import (
    BACKEND_MAX_PARALLELISM,
    CHANGELOG_MATERIALIZATION_BRIDGE,
    CHANGELOG_MATERIALIZATION_COMPRESSION,
    CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM,
    CHANGELOG_MATERIALIZATION_ENCODER_NICENESS,
    CHANGELOG_MATERIALIZATION_FULL_EVERY,
    CHANGELOG_MATERIALIZATION_INTERVAL,
    CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO,
    CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS,
    CHANGELOG_MAX_FAILURES_ALLOWED,
    CHANGELOG_RESTORE_FORK_REPLAY_FROM,
    CHANGELOG_SQUASH_UPDATES,
    CHECKPOINTS_DIR,
    TTL_CLEANUP_KEYS_PER_CHECKPOINT,
)

__all__ = ["BackendSettings"]


@dataclass(frozen=True)
class BackendSettings:
    """The keyword arguments of :class:`ChangelogKeyedStateBackend` a config decides (``state.*``)."""

    max_parallelism: int = BACKEND_MAX_PARALLELISM.default
    snapshot_dir: str | None = None
    max_failures_allowed: int = CHANGELOG_MAX_FAILURES_ALLOWED.default
    materialization_interval: float | None = None
    full_materialization_every: int = CHANGELOG_MATERIALIZATION_FULL_EVERY.default
    max_log_ratio: float = CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO.default
    squash_updates: bool = CHANGELOG_SQUASH_UPDATES.default
    fork_replay_from: int = CHANGELOG_RESTORE_FORK_REPLAY_FROM.default
    bridge_full_snapshots: bool = CHANGELOG_MATERIALIZATION_BRIDGE.default
    snapshot_compression: str = CHANGELOG_MATERIALIZATION_COMPRESSION.default
    encode_apart_from: int = CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM.default
    encoder_niceness: int = CHANGELOG_MATERIALIZATION_ENCODER_NICENESS.default
    max_tracked_keys: int = CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS.default
    ttl_cleanup_per_checkpoint: int = TTL_CLEANUP_KEYS_PER_CHECKPOINT.default
    snapshot_storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Config, *, periodic_materialization: bool = True) -> BackendSettings:
        """The settings ``cfg`` declares; periodic materialization only with a snapshot dir."""
        snapshot_dir = cfg.get(CHECKPOINTS_DIR) or None
        periodic = periodic_materialization and bool(snapshot_dir)
        return cls(
            max_parallelism=cfg.get(BACKEND_MAX_PARALLELISM),
            snapshot_dir=snapshot_dir,
            max_failures_allowed=cfg.get(CHANGELOG_MAX_FAILURES_ALLOWED),
            full_materialization_every=cfg.get(CHANGELOG_MATERIALIZATION_FULL_EVERY),
            materialization_interval=cfg.get(CHANGELOG_MATERIALIZATION_INTERVAL) if periodic else None,
            max_log_ratio=cfg.get(CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO) if periodic else 0.0,
            squash_updates=cfg.get(CHANGELOG_SQUASH_UPDATES),
            fork_replay_from=cfg.get(CHANGELOG_RESTORE_FORK_REPLAY_FROM),
            bridge_full_snapshots=cfg.get(CHANGELOG_MATERIALIZATION_BRIDGE),
            snapshot_compression=cfg.get(CHANGELOG_MATERIALIZATION_COMPRESSION),
            encode_apart_from=cfg.get(CHANGELOG_MATERIALIZATION_ENCODE_APART_FROM),
            encoder_niceness=cfg.get(CHANGELOG_MATERIALIZATION_ENCODER_NICENESS),
            max_tracked_keys=cfg.get(CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS),
            ttl_cleanup_per_checkpoint=cfg.get(TTL_CLEANUP_KEYS_PER_CHECKPOINT),
            snapshot_storage_options=dict(storage_options(cfg) or {}),
        )
