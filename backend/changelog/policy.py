"""When the log has grown enough to materialize: one rule for the backend and the Spark driver."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIN_MATERIALIZED_FOR_RATIO", "MaterializationPolicy"]

#: Below this much materialized state the log may grow to ratio x 1 MiB before materializing.
MIN_MATERIALIZED_FOR_RATIO = 1 << 20


@dataclass(frozen=True)
class MaterializationPolicy:
    """Materialize once the log a restore would replay outgrows ``max_log_ratio`` x the snapshots.

    Workloads that churn state (windows) would otherwise keep far more log than
    state. A ratio of 0 turns the rule off.
    """

    max_log_ratio: float

    def log_outgrew(self, log_bytes: int | float, materialized_bytes: int | float) -> bool:
        """Whether ``log_bytes`` of log over ``materialized_bytes`` of snapshots is due to materialize."""
        if self.max_log_ratio <= 0:
            return False
        return log_bytes > self.max_log_ratio * max(materialized_bytes, MIN_MATERIALIZED_FOR_RATIO)
