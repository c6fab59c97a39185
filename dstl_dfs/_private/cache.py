"""Download cache: one download per object, shared by concurrent readers, idle expiry."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from dstl.spi import StorageMetrics


@dataclass
class _Entry:
    ready: threading.Event = field(default_factory=threading.Event)
    data: bytes | None = None
    error: BaseException | None = None
    readers: int = 0
    last_used: float = field(default_factory=time.monotonic)


class DownloadCache:
    """Objects by key; an object is downloaded once however many readers want it.

    Entries in use are never evicted; idle ones expire after ``idle_timeout`` or
    when the cache holds more than ``max_bytes``.
    """

    def __init__(
        self, fetch: Callable[[str], bytes], *, idle_timeout: float, max_bytes: int, metrics: StorageMetrics
    ) -> None:
        self._fetch = fetch
        self._idle_timeout = idle_timeout
        self._max_bytes = max_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def acquire(self, key: str) -> bytes:
        """The object's bytes; pair with :meth:`release`."""
        with self._lock:
            self._expire(time.monotonic())  # an idle entry past its timeout is not served
            found = self._entries.get(key)
            owner = found is None
            entry = self._entries[key] = _Entry() if found is None else found
            entry.readers += 1
        if owner:
            self._metrics.inc("downloads")
            try:
                entry.data = self._fetch(key)
            except BaseException as exc:
                entry.error = exc
                with self._lock:
                    self._entries.pop(key, None)
            finally:
                entry.ready.set()
        else:
            self._metrics.inc("download_cache_hits")
            entry.ready.wait()
        if entry.error is not None:
            with self._lock:
                entry.readers -= 1
            raise entry.error
        return cast(bytes, entry.data)  # set before ``ready`` whenever ``error`` is not

    def release(self, key: str) -> None:
        """The reader is done with ``key``; expire idle entries."""
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.readers -= 1
                entry.last_used = now
            self._expire(now)

    def invalidate(self, key: str) -> None:
        """Forget ``key`` (it was deleted)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.readers <= 0:
                del self._entries[key]

    def _expire(self, now: float) -> None:
        idle = [(e.last_used, k) for k, e in self._entries.items() if e.readers <= 0 and e.ready.is_set()]
        held = sum(len(e.data or b"") for e in self._entries.values())
        for last_used, key in sorted(idle):
            if now - last_used > self._idle_timeout or held > self._max_bytes:
                held -= len(self._entries[key].data or b"")
                del self._entries[key]
        self._metrics.set_gauge("download_cache_bytes", held)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
