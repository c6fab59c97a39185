"""Discard accounting: a segment is deleted once every change set in it was discarded.

Discards are appended to ``<segment>.discarded`` (offset and length per change
set), so any process may discard and the accounting survives restarts. A segment
is deleted only when it is sealed, its discarded change sets cover the whole file
and no open writer of this process still reuses one of its change sets.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from .segments import QUARANTINED_SUFFIX, SEALED_SUFFIX, sealed_size

DISCARDED_SUFFIX = ".discarded"


class DiscardTracker:
    """Pins (in-process) and discards (persistent) of change sets in segments."""

    def __init__(self, segments_dir: Path) -> None:
        self._dir = segments_dir
        self._lock = threading.Lock()
        self._pins: Counter[tuple[str, int]] = Counter()
        self._pinned_segments: Counter[str] = Counter()

    def pin(self, segment: str, offset: int) -> None:
        """An open writer reuses the change set at ``offset``."""
        with self._lock:
            self._pins[(segment, offset)] += 1
            self._pinned_segments[segment] += 1

    def unpin(self, locations: Iterable[tuple[str, int]]) -> list[str]:
        """Writers stopped reusing these change sets; returns segments to re-check."""
        touched = []
        with self._lock:
            for segment, offset in locations:
                if self._pins[(segment, offset)] > 0:
                    self._pins[(segment, offset)] -= 1
                    self._pinned_segments[segment] -= 1
                    if self._pinned_segments[segment] == 0:
                        touched.append(segment)
        return touched

    def discard(self, entries: dict[str, set[tuple[int, int]]]) -> list[str]:
        """Record discarded ``(offset, length)`` per segment; returns deleted segments."""
        for segment, ranges in entries.items():
            path = self._dir / (segment + DISCARDED_SUFFIX)
            with open(path, "a", encoding="ascii") as file:
                file.write("".join(f"{offset} {length}\n" for offset, length in sorted(ranges)))
        return [segment for segment in entries if self.collect(segment)]

    def fully_discarded(self, segment: str, size: int) -> bool:
        """Whether discards cover the first ``size`` bytes of ``segment`` (its whole content so far)."""
        return size > 0 and self._covered(self._dir / (segment + DISCARDED_SUFFIX)) >= size

    @staticmethod
    def _covered(discarded: Path) -> int:
        """Bytes the discard file covers (each change set counted once)."""
        covered: dict[int, int] = {}
        try:
            lines = discarded.read_text(encoding="ascii").splitlines()
        except FileNotFoundError:
            return 0
        for line in lines:
            offset, _, length = line.partition(" ")
            if offset.isdigit() and length.isdigit():
                covered[int(offset)] = int(length)
        return sum(covered.values())

    def collect(self, segment: str, *, orphaned: bool = False) -> bool:
        """Delete ``segment`` if nothing needs it any more; True when deleted.

        :param orphaned: the caller knows no live handle needs any change set in it
            (orphan collection): a sealed, unpinned segment goes whatever its discards say.
        """
        path = self._dir / segment
        with self._lock:
            if self._pinned_segments[segment] > 0:
                return False
        lock_fd = os.open(self._dir / "gc.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            sealed = path.with_name(segment + SEALED_SUFFIX)
            discarded = path.with_name(segment + DISCARDED_SUFFIX)
            if path.with_name(segment + QUARANTINED_SUFFIX).exists():
                return False  # kept for inspection: it holds damaged data
            size = sealed_size(path) if path.exists() else None
            if size is None:
                return False
            if not orphaned and size > 0 and (not discarded.exists() or self._covered(discarded) < size):
                return False
            path.unlink()
            discarded.unlink(missing_ok=True)
            sealed.unlink(missing_ok=True)
            return True
        finally:
            os.close(lock_fd)
