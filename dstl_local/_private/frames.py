"""Where change sets start in a segment, found by walking its frames from the start.

A discard names an offset and a length, and both come from a handle: untrusted
input. A frame header at that offset proves nothing, since change data can hold
bytes that look like one. Only the chain of frames from the segment's start
tells where change sets really begin. Discarding (and freeing the blocks of) a
range that is not one of them could destroy a live change set.

Segments only grow, so the walk is cached and continues where it stopped. It
steps over ranges already recorded as discarded, whose blocks may be holes now.
The walk stops at anything that is not a whole frame: a torn tail, a write in
flight, or damage.
"""

from __future__ import annotations

import bisect
import os
import threading
from array import array
from collections.abc import Callable
from pathlib import Path

from dstl.spi import CorruptedError
from dstl.spi.kit.changeset_format import CHANGE_SET_HEADER_SIZE, framed_size


class FrameIndex:
    """Per segment: the offsets and lengths of its change sets, as far as walked (16 bytes each)."""

    def __init__(self, directory: Path, discarded: Callable[[str], dict[int, int]]) -> None:
        self._dir = directory
        self._discarded = discarded
        self._lock = threading.Lock()
        self._walked: dict[str, tuple[int, array, array]] = {}  # segment -> (walked to, offsets, lengths)

    def length_at(self, segment: str, offset: int) -> int | None:
        """The stored length of the change set starting at ``offset``, or ``None`` when none starts there.

        :raises FileNotFoundError: when the segment is gone.
        """
        with self._lock:
            position, offsets, lengths = self._walked.get(segment) or (0, array("q"), array("q"))
            if offset >= position:
                position = self._walk(segment, position, offset, offsets, lengths)
                self._walked[segment] = (position, offsets, lengths)
            index = bisect.bisect_left(offsets, offset)
            return lengths[index] if index < len(offsets) and offsets[index] == offset else None

    def forget(self, segment: str) -> None:
        """The segment was deleted."""
        with self._lock:
            self._walked.pop(segment, None)

    def _walk(self, segment: str, position: int, until: int, offsets: array, lengths: array) -> int:
        """Record the frames from ``position`` through the one at ``until``; returns the position reached.

        Hole punching frees whole blocks, so a block boundary inside a discarded
        frame's header may zero only its tail: the magic left in front of zeroed
        lengths must not read as a frame (of the wrong size), see :func:`_frame_length`.
        """
        skips: dict[int, int] | None = None
        fd = os.open(self._dir / segment, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            while position <= until and position + CHANGE_SET_HEADER_SIZE <= size:
                try:
                    length = _frame_length(os.pread(fd, CHANGE_SET_HEADER_SIZE + 1, position), segment)
                except CorruptedError:
                    # A freed (zeroed) discarded change set, or damage: only a recorded discard is
                    # stepped over. A range is recorded before it is punched: read again on a miss.
                    if skips is None or position not in skips:
                        skips = self._discarded(segment)
                    recorded = skips.get(position)
                    if recorded is None:
                        break
                    length = recorded
                if position + length > size:
                    break  # a write in flight or a torn tail: not a change set (yet)
                offsets.append(position)
                lengths.append(length)
                position += length
        finally:
            os.close(fd)
        return position


def _frame_length(head: bytes, segment: str) -> int:
    """The stored length of the frame whose header (and first byte after it) is ``head``.

    A log id starts with a letter or digit, never NUL: a zero there means the header's
    tail is a hole (a discarded frame partly freed), whatever its first bytes say.

    :raises CorruptedError: when ``head`` is not the start of a frame.
    """
    length = framed_size(head, location=segment)
    if len(head) <= CHANGE_SET_HEADER_SIZE or head[CHANGE_SET_HEADER_SIZE] == 0:
        msg = "a frame header whose log id is zeroed (a partly freed discarded change set)"
        raise CorruptedError(msg, location=segment)
    return length
