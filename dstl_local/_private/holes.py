"""Freeing the disk blocks of byte ranges inside a file, keeping its size (hole punching).

A segment holds the change sets of every writer of an instance, so it can be
deleted only once all of them were discarded; until then the discarded ones
would hold their disk space. ``fallocate(FALLOC_FL_PUNCH_HOLE)`` frees the whole
blocks inside such ranges at once. Where the kernel or file system cannot punch
holes (not Linux, or EOPNOTSUPP), nothing is freed early: the segment's deletion
still frees everything.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys
from collections.abc import Iterable

log = logging.getLogger(__name__)

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def _fallocate():  # noqa: ANN202 - a ctypes function or None
    if not sys.platform.startswith("linux"):
        return None
    try:  # the process's own symbols: the C library Python runs on
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int
    return function


_FALLOCATE = _fallocate()


def merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges merged into sorted, disjoint ``(start, end)`` intervals."""
    intervals: list[tuple[int, int]] = []
    for offset, length in sorted(ranges):
        end = offset + length
        if intervals and offset <= intervals[-1][1]:
            if end > intervals[-1][1]:
                intervals[-1] = (intervals[-1][0], end)
        else:
            intervals.append((offset, end))
    return intervals


def punch_holes(path: os.PathLike[str] | str, intervals: Iterable[tuple[int, int]]) -> int:
    """Free the whole file-system blocks inside each ``(start, end)`` interval; returns bytes freed.

    Bytes of partly covered blocks stay; the file's size does not change, and reads
    of a hole return zeros. A missing file or a file system without hole punching
    frees nothing and is not an error.
    """
    if _FALLOCATE is None:
        return 0
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return 0
    freed = 0
    try:
        block = os.fstat(fd).st_blksize  # Linux (the only one punching) never reports 0
        for start, end in intervals:
            first = -(-start // block) * block
            last = end // block * block
            if last <= first:
                continue
            if _FALLOCATE(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, first, last - first) != 0:
                error = ctypes.get_errno()
                if error not in (errno.EOPNOTSUPP, errno.ENOSYS):
                    log.warning("could not free discarded bytes of %s: %s", path, os.strerror(error))
                return freed
            freed += last - first
    finally:
        os.close(fd)
    return freed
