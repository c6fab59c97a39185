"""A backend's tunables as one frozen object, read from a config once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dstl.spi import Config

from ..filesystems import storage_options
from ..options import option_default

__all__ = ["BackendSettings"]


@dataclass(frozen=True)
class BackendSettings:
    """The keyword arguments of :class:`ChangelogKeyedStateBackend` a config decides (``state.*``)."""

    max_parallelism: int = option_default("state.backend.max-parallelism")
    snapshot_dir: str | None = None
    max_failures_allowed: int = option_default("state.changelog.max-failures-allowed")
    materialization_interval: float | None = None
    full_materialization_every: int = option_default("state.changelog.materialization.full-every")
    max_log_ratio: float = option_default("state.changelog.materialization.max-log-ratio")
    squash_updates: bool = option_default("state.changelog.squash-updates")
    fork_replay_from: int = option_default("state.changelog.restore.fork-replay-from")
    bridge_full_snapshots: bool = option_default("state.changelog.materialization.bridge")
    snapshot_compression: str = option_default("state.changelog.materialization.compression")
    max_tracked_keys: int = option_default("state.changelog.materialization.max-tracked-keys")
    ttl_cleanup_per_checkpoint: int = option_default("state.ttl.cleanup.keys-per-checkpoint")
    snapshot_storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Config, *, periodic_materialization: bool = True) -> BackendSettings:
        """The settings ``cfg`` declares; periodic materialization only with a snapshot dir."""
        snapshot_dir = cfg["state.checkpoints.dir"] or None
        periodic = periodic_materialization and bool(snapshot_dir)
        return cls(
            max_parallelism=int(cfg["state.backend.max-parallelism"]),
            snapshot_dir=snapshot_dir,
            max_failures_allowed=int(cfg["state.changelog.max-failures-allowed"]),
            full_materialization_every=int(cfg["state.changelog.materialization.full-every"]),
            materialization_interval=float(cfg["state.changelog.materialization.interval"])
            if periodic
            else None,
            max_log_ratio=float(cfg["state.changelog.materialization.max-log-ratio"]) if periodic else 0.0,
            squash_updates=bool(cfg["state.changelog.squash-updates"]),
            fork_replay_from=int(cfg["state.changelog.restore.fork-replay-from"]),
            bridge_full_snapshots=bool(cfg["state.changelog.materialization.bridge"]),
            snapshot_compression=str(cfg["state.changelog.materialization.compression"]),
            max_tracked_keys=int(cfg["state.changelog.materialization.max-tracked-keys"]),
            ttl_cleanup_per_checkpoint=int(cfg["state.ttl.cleanup.keys-per-checkpoint"]),
            snapshot_storage_options=dict(storage_options(cfg) or {}),
        )
