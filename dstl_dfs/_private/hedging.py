"""Uploads one object with retries and hedging.

Attempt 1 starts at once. If it has not finished after ``upload.timeout``, a
second attempt races it (the slow one is not cancelled); a failed attempt is
retried after ``upload.next-attempt-delay``; at most ``upload.max-attempts``
attempts in all. The first success wins and every other attempt's object is
deleted once it lands, so names are unique and nothing is overwritten. The
upload fails only when its last attempt has failed, or when the deadline
(timeout x attempts) passes without a success.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from dstl.spi import StorageError, StorageMetrics

from .timers import TimerThread

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How uploads are retried: ``fixed`` hedges and retries, ``none`` makes one attempt."""

    kind: str
    timeout: float
    max_attempts: int
    next_attempt_delay: float

    @property
    def attempts(self) -> int:
        return 1 if self.kind == "none" else self.max_attempts


class HedgedUpload:
    """The attempts of one object upload; ``future`` yields the winning key."""

    def __init__(
        self,
        *,
        policy: RetryPolicy,
        pool: Executor,
        timers: TimerThread,
        metrics: StorageMetrics,
        key_for_attempt: Callable[[int], str],
        put: Callable[[str], None],
        delete: Callable[[str], None],
    ) -> None:
        self.future: Future[str] = Future()
        self._policy = policy
        self._pool = pool
        self._timers = timers
        self._metrics = metrics
        self._key_for_attempt = key_for_attempt
        self._put = put
        self._delete = delete
        self._lock = threading.Lock()
        self._started = 0
        self._finished = 0
        self._running: set[int] = set()
        self._errors: list[BaseException] = []
        self._winner: str | None = None
        self._began = time.perf_counter()
        self._timer_ids: list[int] = []

    def start(self) -> Future[str]:
        """Start attempt 1 (and the deadline under the fixed policy)."""
        if self._policy.kind != "none":
            deadline = self._policy.timeout * self._policy.attempts
            self._timer_ids.append(self._timers.schedule(deadline, self._deadline_passed))
        self._start_attempt()
        return self.future

    def _start_attempt(self) -> None:
        with self._lock:
            if self.future.done() or self._started >= self._policy.attempts:
                return
            self._started += 1
            attempt = self._started
            self._running.add(attempt)
        key = self._key_for_attempt(attempt)
        if self._policy.kind != "none":
            self._timer_ids.append(self._timers.schedule(self._policy.timeout, lambda: self._hedge(attempt)))
        self._pool.submit(self._run_attempt, attempt, key)

    def _hedge(self, attempt: int) -> None:
        with self._lock:
            slow = attempt in self._running and not self.future.done()
        if slow:
            self._metrics.inc("upload_hedges")
            log.debug(
                "upload attempt %d slower than %.3fs: starting a hedged attempt",
                attempt,
                self._policy.timeout,
            )
            self._start_attempt()

    def _run_attempt(self, attempt: int, key: str) -> None:
        error: BaseException | None = None
        try:
            self._put(key)
        except BaseException as exc:
            error = exc
        with self._lock:
            self._running.discard(attempt)
            self._finished += 1
            if error is None and self._winner is None and not self.future.done():
                self._winner = key
                won = True
            else:
                won = False
                if error is not None:
                    self._errors.append(error)
            all_failed = self._finished == self._started and self._started >= self._policy.attempts
        if error is None and not won:
            self._discard_loser(key)
            return
        if won:
            self._finish_success(key)
            return
        self._metrics.inc("upload_failures")
        if all_failed:
            self._fail()
        elif self._policy.kind != "none":
            self._timer_ids.append(
                self._timers.schedule(self._policy.next_attempt_delay, self._retry_if_needed)
            )

    def _retry_if_needed(self) -> None:
        with self._lock:
            needed = not self.future.done() and not self._running
        if needed:
            self._start_attempt()

    def _finish_success(self, key: str) -> None:
        for timer_id in self._timer_ids:
            self._timers.cancel(timer_id)
        self._metrics.observe("upload_latency_s", time.perf_counter() - self._began)
        self._metrics.observe("upload_attempts", self._started)
        self.future.set_result(key)

    def _discard_loser(self, key: str) -> None:
        try:
            self._delete(key)
            self._metrics.inc("hedge_losers_deleted")
        except Exception as exc:
            log.warning("could not delete the losing upload %s: %s", key, exc)

    def _fail(self) -> None:
        with self._lock:
            if self.future.done():
                return
            last = self._errors[-1] if self._errors else None
            attempts = self._started
        self._metrics.observe("upload_attempts", attempts)
        message = f"upload failed after {attempts} attempt(s)"
        error = StorageError(f"{message}: {last}" if last else message, retriable=True)
        self.future.set_exception(error)

    def _deadline_passed(self) -> None:
        with self._lock:
            if self.future.done():
                return
            self._errors.append(
                StorageError(
                    f"no attempt succeeded within {self._policy.timeout * self._policy.attempts:.3f}s"
                )
            )
            # Attempts still running may land later: they are deleted as losers.
            self._winner = "<deadline>"
        self._fail()
