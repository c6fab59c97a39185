"""Leader-based group commit: one write + fsync for every persist that is waiting.

The first persist to arrive becomes the leader and writes its batch itself, so an
uncontended persist pays no thread hand-off. Persists that arrive while the leader
is in ``fsync`` queue up and are written together by the next round: under load
many writers share one fsync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommitRequest:
    """One writer's change sets waiting for durability."""

    log_id: str
    epoch: int
    token: str
    owner: Callable[[], tuple[int, str] | None]
    blobs: list[bytes]
    future: Future[Any] = field(default_factory=Future)


class GroupCommitter:
    """Runs ``commit(batch)`` for queued requests, one batch at a time.

    ``commit`` must complete (or fail) every request's future.
    """

    def __init__(self, commit: Callable[[list[CommitRequest]], None]) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._queue: list[CommitRequest] = []
        self._leader = False

    def submit(self, request: CommitRequest) -> Future[Any]:
        """Queue ``request``; lead the commit rounds if no one else does."""
        with self._lock:
            self._queue.append(request)
            if self._leader:
                return request.future
            self._leader = True
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._leader = False
                    return request.future
            try:
                self._commit(batch)
            except BaseException as exc:
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
