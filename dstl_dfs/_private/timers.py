"""One thread running delayed callbacks (hedges, retries, deadlines, batch delays)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TimerThread:
    """Runs each callback once, no earlier than its delay; cancellable, shut down by close()."""

    def __init__(self, name: str) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(self, delay: float, callback: Callable[[], None]) -> int:
        """Run ``callback`` after ``delay`` seconds; returns an id for :meth:`cancel`."""
        timer_id = next(self._ids)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, timer_id, callback))
            self._cond.notify()
        return timer_id

    def cancel(self, timer_id: int) -> None:
        """Do not run the callback (no-op if it ran)."""
        with self._cond:
            self._cancelled.add(timer_id)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._closed:
                    return
                _, timer_id, callback = heapq.heappop(self._heap)
                if timer_id in self._cancelled:
                    self._cancelled.discard(timer_id)
                    continue
            try:
                callback()
            except Exception:
                log.exception("timer callback failed")

    def close(self) -> None:
        """Stop the thread; pending callbacks are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(5)
