"""Thread-safe counters and latency histograms that storages expose as ``metrics``."""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["REQUIRED_COUNTERS", "StorageMetrics"]

#: Counters every storage must expose; the conformance suite checks that they move.
#: ``uploads`` counts durable writes (objects, fsync batches, transactions);
#: ``discarded_change_sets`` counts change-set locations passed to ``discard``.
REQUIRED_COUNTERS = (
    "appends",
    "persists",
    "persist_failures",
    "uploads",
    "uploaded_bytes",
    "discarded_change_sets",
)

_HISTOGRAM_WINDOW = 4096


class StorageMetrics:
    """Named counters, gauges and sliding-window histograms, safe to update from any thread.

    Storages may add their own names; :data:`REQUIRED_COUNTERS` always exist.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = dict.fromkeys(REQUIRED_COUNTERS, 0)
        self._histograms: dict[str, deque[float]] = {}
        self._gauges: dict[str, float] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name`` (created at zero when new)."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + amount

    def set_gauge(self, name: str, value: float) -> None:
        """Set gauge ``name`` (a level such as queued bytes) to ``value``."""
        with self._lock:
            self._gauges[name] = value

    def gauges(self) -> dict[str, float]:
        """A copy of every gauge."""
        with self._lock:
            return dict(self._gauges)

    def observe(self, name: str, value: float) -> None:
        """Record ``value`` in histogram ``name`` (keeps the latest samples)."""
        with self._lock:
            hist = self._histograms.get(name)
            if hist is None:
                hist = self._histograms[name] = deque(maxlen=_HISTOGRAM_WINDOW)
            hist.append(value)

    def counter(self, name: str) -> int:
        """Current value of counter ``name`` (0 when never incremented)."""
        with self._lock:
            return self._counters.get(name, 0)

    def counters(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counters)

    def percentiles(self, name: str, qs: tuple[float, ...] = (50, 90, 99)) -> dict[float, float]:
        """Nearest-rank percentiles of histogram ``name``; empty when it has no sample."""
        with self._lock:
            samples = sorted(self._histograms.get(name, ()))
        if not samples:
            return {}
        last = len(samples) - 1
        return {q: samples[min(last, round(q / 100 * last))] for q in qs}
