"""Reads and listings with a deadline per attempt and retries on transient errors.

Object-store clients can stall (a GET whose body never comes) or fail in ways
that clear up on a second try (5xx, resets, a body damaged in transit). Every
read and fencing listing of the DFS storage goes through :class:`BoundedCalls`,
so the caller waits at most ``attempts x timeout`` (plus short pauses) and then
gets a retriable :class:`~dstl.spi.StorageError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from dstl.spi import StorageError, StorageMetrics

T = TypeVar("T")


class BoundedCalls:
    """Runs calls on its own threads, each attempt bounded by ``timeout`` seconds.

    A stalled attempt is abandoned (its thread finishes or fails on its own); the
    next attempt starts at once on another thread.
    """

    def __init__(self, *, timeout: float, attempts: int, metrics: StorageMetrics, threads: int = 8) -> None:
        self._timeout = timeout
        self._attempts = attempts
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dstl-dfs-read")

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried on retriable errors and stalls.

        :raises StorageError: non-retriable errors at once; retriable ones (and
            stalls) after the last attempt, naming ``what``.
        """
        last: StorageError | None = None
        for attempt in range(self._attempts):
            if attempt:
                self._metrics.inc("read_retries")
                time.sleep(min(0.05 * 2 ** (attempt - 1), 1.0))
            future = self._pool.submit(fn)
            try:
                return future.result(timeout=self._timeout)
            except FutureTimeout:
                future.cancel()
                self._metrics.inc("read_timeouts")
                last = StorageError(f"{what} took longer than {self._timeout:g}s", retriable=True)
            except StorageError as exc:
                if not exc.retriable:
                    raise
                last = exc
        msg = f"{what} failed after {self._attempts} attempt(s): {last}"
        raise StorageError(msg, retriable=True) from last

    def close(self) -> None:
        """Stop accepting calls; running ones finish on their own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
