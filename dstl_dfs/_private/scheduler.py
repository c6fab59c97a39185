"""Batches persist requests of many writers into one upload.

A batch is drained ``batch.persist-delay`` after its first request, or at once
when ``batch.persist-size-threshold`` bytes are queued. Bytes queued or in flight
above ``upload.max-in-flight`` make the storage unavailable: submitting blocks
(interruptibly) until uploads complete.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from dstl.spi import ClosedError, StorageError, StorageMetrics

from .timers import TimerThread


@dataclass
class UploadRequest:
    """One writer's encoded change sets (with their SQNs) waiting for an upload."""

    log_id: str
    epoch: int
    token: str
    blobs: list[tuple[int, bytes]]
    future: Future[Any] = field(default_factory=Future)

    @property
    def size(self) -> int:
        return sum(len(b) for _, b in self.blobs)


class BatchingScheduler:
    """Collects requests and hands each batch to ``upload_batch`` (which settles them)."""

    def __init__(
        self,
        *,
        delay: float,
        size_threshold: int,
        max_in_flight: int,
        timers: TimerThread,
        metrics: StorageMetrics,
        upload_batch: Callable[[list[UploadRequest], Callable[[], None]], None],
    ) -> None:
        self._delay = delay
        self._size_threshold = size_threshold
        self._max_in_flight = max_in_flight
        self._timers = timers
        self._metrics = metrics
        self._upload_batch = upload_batch
        self._cond = threading.Condition()
        self._queue: list[UploadRequest] = []
        self._queued_bytes = 0
        self._in_flight = 0
        self._drain_scheduled = False
        self._closed = False

    def available(self) -> bool:
        """Whether a new request would be accepted without blocking."""
        with self._cond:
            return self._queued_bytes + self._in_flight < self._max_in_flight

    def wait_available(self, timeout: float | None = None) -> bool:
        """Block until available (True) or ``timeout`` passes (False); interruptible."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed and self._queued_bytes + self._in_flight >= self._max_in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                # Short waits keep KeyboardInterrupt and close() responsive.
                self._cond.wait(0.1 if remaining is None else min(0.1, remaining))
            if self._closed:
                msg = "storage closed while waiting for upload capacity"
                raise ClosedError(msg)
            return True

    def submit(self, request: UploadRequest) -> Future[Any]:
        """Queue ``request`` (blocking while the storage is unavailable)."""
        if not self.available():
            self._metrics.inc("backpressure_waits")
            self.wait_available()
        drain_now = False
        with self._cond:
            if self._closed:
                msg = "storage is closed"
                raise ClosedError(msg)
            self._queue.append(request)
            self._queued_bytes += request.size
            self._metrics.set_gauge("queued_bytes", self._queued_bytes)
            if self._queued_bytes >= self._size_threshold or self._delay <= 0:
                drain_now = True
            elif not self._drain_scheduled:
                self._drain_scheduled = True
                self._timers.schedule(self._delay, self.drain)
        if drain_now:
            self.drain()
        return request.future

    def drain(self) -> None:
        """Upload everything queued now, as one batch."""
        with self._cond:
            self._drain_scheduled = False
            batch, self._queue = self._queue, []
            size, self._queued_bytes = self._queued_bytes, 0
            self._in_flight += size
            self._metrics.set_gauge("queued_bytes", 0)
            self._metrics.set_gauge("in_flight_bytes", self._in_flight)
        if not batch:
            return

        def done() -> None:
            with self._cond:
                self._in_flight -= size
                self._metrics.set_gauge("in_flight_bytes", self._in_flight)
                self._cond.notify_all()

        self._metrics.observe("batch_requests", len(batch))
        self._metrics.observe("batch_bytes", size)
        try:
            self._upload_batch(batch, done)
        except BaseException as exc:
            done()
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(StorageError(f"upload could not start: {exc}"))

    def close(self) -> None:
        """Upload what is queued and refuse new requests."""
        self.drain()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
