"""The working-state delegate a config asks for (``state.backend.delegate``)."""

from __future__ import annotations

from dstl.spi import Config, ConfigError, KeyGroupRange, StateChangelogStorage, log_id_for, validate_name

from ..delegate import HeapDelegate, StateDelegate
from ..options import BACKEND_DELEGATE, BACKEND_LMDB_DIR, BACKEND_LMDB_MAP_SIZE

__all__ = ["delegate_for"]


def delegate_for(
    cfg: Config, storage: StateChangelogStorage, operator_id: str, key_groups: KeyGroupRange
) -> StateDelegate:
    """A heap delegate, or an empty LMDB one under ``state.backend.lmdb.dir`` for this instance."""
    if cfg.get(BACKEND_DELEGATE) != "lmdb":
        return HeapDelegate()
    return _lmdb_delegate(cfg, storage, operator_id, key_groups)


def _lmdb_delegate(
    cfg: Config, storage: StateChangelogStorage, operator_id: str, key_groups: KeyGroupRange
) -> StateDelegate:
    from ..delegate import LmdbDelegate

    base = cfg.get(BACKEND_LMDB_DIR)
    if not base:
        msg = "state.backend.delegate=lmdb needs state.backend.lmdb.dir: a directory on local disk"
        raise ConfigError(msg)
    job = getattr(storage, "job_id", "job")
    # Validated before anything is created: the names become directories under base.
    log_id_for(operator_id, key_groups)
    path = f"{base}/{validate_name(job, 'job id')}/{operator_id}/kg{key_groups.start}-{key_groups.end}"
    delegate = LmdbDelegate(path, map_size=cfg.get(BACKEND_LMDB_MAP_SIZE))
    # A file left by an earlier backend is at no known checkpoint (only the Spark working copy
    # vouches for one, with its stamp): this backend starts empty and restores into it.
    delegate.clear()
    return delegate
