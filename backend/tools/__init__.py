"""Tools over a job's checkpoints: ``dstl inspect`` (read only) and ``dstl savepoint``."""

from __future__ import annotations

from .inspection import describe_change, describe_checkpoint, handle_changes, json_safe, state_entries

__all__ = ["describe_change", "describe_checkpoint", "handle_changes", "json_safe", "state_entries"]
