"""Which job a Spark checkpoint location holds: its job id, derived once and recorded with it.

Two queries with default settings must never share a job id: the id names their
logs on a shared storage (one bucket, one local directory) and their working
copies, so sharing it, each would restore, discard and collect the other's data.
The default is therefore derived from the checkpoint location, and whatever id a
location starts with is recorded in it (``dstl-job-id``) and kept for good.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from dstl.spi import ConfigError, DstlError, validate_name

from ..documents import read_regular_file
from ..filesystems import checkpoint_fs

__all__ = ["JOB_ID_FILE", "default_job_id", "resolve_job_id"]

#: The record of the location's job id, in the checkpoint location (Spark ignores it).
JOB_ID_FILE = "dstl-job-id"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_RECORD = 512


def default_job_id(location_url: str) -> str:
    """A job id of the checkpoint location: its last path component and a digest of the whole URL."""
    normalized = location_url.rstrip("/")
    tail = _UNSAFE.sub("-", normalized.rsplit("/", 1)[-1]).strip("-._")[:40].strip("-._") or "job"
    digest = hashlib.sha256(normalized.encode()).hexdigest()[:12]
    return f"{tail}-{digest}"


def resolve_job_id(
    checkpoint_location: str,
    requested: str | None,
    config: Mapping[str, Any] | None = None,
    *,
    legacy_state_dir: str | None = None,
) -> str:
    """The job id of ``checkpoint_location``: the recorded one, else chosen now and recorded.

    Chosen in this order: ``requested``; the only job of ``legacy_state_dir`` (a
    location first started by a dstl that did not record its id); the default
    derived from the location.

    :raises ConfigError: when ``requested`` differs from the recorded id (the state
        is under the recorded one), or the record is damaged.
    """
    if requested is not None:
        validate_name(requested, "job id")
    fs, root = checkpoint_fs(checkpoint_location, config)
    path = f"{root}/{JOB_ID_FILE}"
    recorded = _read_record(fs, path)
    if recorded is None:
        chosen = (
            requested or _legacy_job(legacy_state_dir, config) or default_job_id(fs.unstrip_protocol(root))
        )
        fs.makedirs(root, exist_ok=True)
        try:
            fs.pipe_file(path, chosen.encode(), mode="create")
        except FileExistsError:  # another driver recorded one first: that one holds
            recorded = _read_record(fs, path)
        else:
            return chosen
    if recorded is None:
        msg = f"{path} vanished while the job id was being recorded: start the query again"
        raise ConfigError(msg)
    if requested is not None and requested != recorded:
        msg = (
            f"job_id={requested!r} differs from the job id {recorded!r} recorded in {checkpoint_location} "
            f"({JOB_ID_FILE}): its state and logs are under the recorded one. Leave job_id unset (or pass "
            f"{recorded!r}), or use a new checkpoint location for a new job"
        )
        raise ConfigError(msg)
    return recorded


def _read_record(fs: Any, path: str) -> str | None:
    """The recorded job id, ``None`` when there is none (the record is untrusted: checked)."""
    try:
        data = read_regular_file(fs, path, f"the job id record {path}", max_bytes=_MAX_RECORD)
        return validate_name(data.decode("utf-8").strip(), "recorded job id")
    except FileNotFoundError:
        return None
    except (OSError, DstlError, UnicodeDecodeError) as exc:
        msg = (
            f"the job id recorded in {path} is damaged ({exc}): restore the file, or remove it and pass the "
            "job's id as job_id"
        )
        raise ConfigError(msg) from exc


def _legacy_job(state_dir: str | None, config: Mapping[str, Any] | None) -> str | None:
    """The only job with checkpoints under ``state_dir`` (started before ids were recorded), if any."""
    if not state_dir:
        return None
    state_fs, root = checkpoint_fs(state_dir, config)
    if not state_fs.isdir(root):
        return None
    jobs = [
        entry.rsplit("/", 1)[-1]
        for entry in state_fs.ls(root, detail=False)
        if state_fs.isdir(f"{entry}/checkpoints")
    ]
    return jobs[0] if len(jobs) == 1 else None
