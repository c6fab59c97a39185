"""Discard accounting: a segment is deleted once every change set in it was discarded.

Discards are appended to ``<segment>.discarded`` (offset and length per change
set), so any process may discard and the accounting survives restarts. A segment
is deleted only when it is sealed, its discarded change sets cover the whole file
and no open writer of this process still reuses one of its change sets. Until
then the blocks that only discarded change sets occupy are freed at once (holes
punched into the segment), so the disk holds what live handles need, not what a
segment once held; recovery skips those ranges.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from .frames import FrameIndex
from .holes import merged, punch_holes
from .segments import QUARANTINED_SUFFIX, SEALED_SUFFIX, sealed_size

DISCARDED_SUFFIX = ".discarded"


class DiscardTracker:
    """Pins (in-process) and discards (persistent) of change sets in segments."""

    def __init__(self, segments_dir: Path) -> None:
        self._dir = segments_dir
        self._lock = threading.Lock()
        self._pins: Counter[tuple[str, int]] = Counter()
        self._pinned_segments: Counter[str] = Counter()
        self._held: dict[str, set[int]] = {}  # discarded while pinned: freed when unpinned
        self._parse_lock = threading.Lock()
        self._parsed: dict[Path, tuple[int, dict[int, int]]] = {}  # discard file -> (bytes parsed, ranges)
        #: Where change sets really start: a discard is accounted (and freed) only at one of them.
        self.frames = FrameIndex(segments_dir, self.discarded_ranges)

    def pin(self, segment: str, offset: int) -> None:
        """An open writer reuses the change set at ``offset``."""
        with self._lock:
            self._pins[(segment, offset)] += 1
            self._pinned_segments[segment] += 1

    def unpin(self, locations: Iterable[tuple[str, int]]) -> list[str]:
        """Writers stopped reusing these change sets; returns segments to re-check.

        Change sets discarded while pinned have their blocks freed now.
        """
        touched = []
        released: dict[str, set[int]] = {}
        with self._lock:
            for segment, offset in locations:
                if self._pins[(segment, offset)] > 0:
                    self._pins[(segment, offset)] -= 1
                    self._pinned_segments[segment] -= 1
                    if self._pinned_segments[segment] == 0:
                        touched.append(segment)
                    if not self._pins[(segment, offset)] and offset in self._held.get(segment, ()):
                        self._held[segment].discard(offset)
                        released.setdefault(segment, set()).add(offset)
        for segment, offsets in released.items():
            self.reclaim(segment, offsets)
        return touched

    def discard(self, entries: dict[str, set[tuple[int, int]]]) -> list[str]:
        """Record discarded ``(offset, length)`` per segment; returns deleted segments."""
        for segment, ranges in entries.items():
            path = self._dir / (segment + DISCARDED_SUFFIX)
            with open(path, "a", encoding="ascii") as file:
                file.write("".join(f"{offset} {length}\n" for offset, length in sorted(ranges)))
            # Recorded first, punched after: whoever reads a hole finds its range recorded.
            self.reclaim(segment, (offset for offset, _ in ranges))
        return [segment for segment in entries if self.collect(segment)]

    def reclaim(self, segment: str, touched: Iterable[int]) -> int:
        """Free the blocks of ``segment`` that only discarded, unpinned change sets occupy; bytes freed.

        :param touched: offsets of the change sets just discarded or unpinned: only the runs
            of discarded change sets that contain one of them are punched (the others were
            punched when they were touched).
        """
        discarded = self.discarded_ranges(segment)
        with self._lock:
            pinned = {offset for (name, offset), count in self._pins.items() if name == segment and count}
            # Remembered so that unpin frees them (pins and this memory are this process's).
            self._held.setdefault(segment, set()).update(pinned.intersection(discarded))
        starts = sorted(touched)
        runs = merged((offset, length) for offset, length in discarded.items() if offset not in pinned)
        return punch_holes(self._dir / segment, [run for run in runs if _contains_any(run, starts)])

    def discarded_ranges(self, segment: str) -> dict[int, int]:
        """``offset -> length`` of the change sets of ``segment`` recorded as discarded."""
        return self._ranges(self._dir / (segment + DISCARDED_SUFFIX))

    def fully_discarded(self, segment: str, size: int) -> bool:
        """Whether discards cover the first ``size`` bytes of ``segment`` (its whole content so far)."""
        return size > 0 and self._covered(self._dir / (segment + DISCARDED_SUFFIX)) >= size

    def _covered(self, discarded: Path) -> int:
        """Bytes the discard file covers (each change set counted once), counting only real change sets.

        The file is read back from disk, so it is untrusted (a dead instance's file, or
        one written by hand): a range counts only where the segment's chain of frames
        has a change set of exactly that offset and length.
        """
        segment = discarded.name.removesuffix(DISCARDED_SUFFIX)
        covered = 0
        for offset, length in self._ranges(discarded).items():
            try:
                real = self.frames.length_at(segment, offset)
            except FileNotFoundError:
                return 0
            if real == length:
                covered += length
        return covered

    def _ranges(self, discarded: Path) -> dict[int, int]:
        """The discard file's ranges (a copy); only lines appended since the last call are parsed.

        The file is append-only (any process appends), so what was parsed stays valid
        while the file exists: a discard costs what it adds, not the segment's history.
        """
        with self._parse_lock:
            done, ranges = self._parsed.get(discarded, (0, {}))
            try:
                with open(discarded, "rb") as file:
                    if os.fstat(file.fileno()).st_size < done:  # deleted and made anew
                        done, ranges = 0, {}
                    file.seek(done)
                    tail = file.read()
            except FileNotFoundError:
                self._parsed.pop(discarded, None)
                return {}
            complete = tail.rfind(b"\n") + 1  # a line being appended right now is read next time
            for line in tail[:complete].decode("ascii", errors="replace").splitlines():
                offset, _, length = line.partition(" ")
                if offset.isdigit() and length.isdigit():
                    ranges[int(offset)] = int(length)
            self._parsed[discarded] = (done + complete, ranges)
            return dict(ranges)

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
            with self._lock:
                self._held.pop(segment, None)
            with self._parse_lock:
                self._parsed.pop(discarded, None)
            self.frames.forget(segment)
            return True
        finally:
            os.close(lock_fd)


def _contains_any(run: tuple[int, int], sorted_offsets: list[int]) -> bool:
    """Whether one of ``sorted_offsets`` lies in the ``(start, end)`` run."""
    index = bisect.bisect_left(sorted_offsets, run[0])
    return index < len(sorted_offsets) and sorted_offsets[index] < run[1]
