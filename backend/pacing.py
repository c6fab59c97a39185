"""Foreground work of a process, and the background work that gives way to it.

A materialization runs in a thread beside the task that processes the next batch, and
both need CPython's GIL. A background loop that holds it turns each of the task's own
releases (an LMDB commit, an Arrow call, a write) into a wait of up to the interpreter's
switch interval: over 3M keys that made a 300 ms batch of CPU take 1.3-2.6 s. So a task
marks its work as foreground, and the background loops pause between their steps while
it runs: they do their work in the gaps between batches, and the batch keeps the core.

Foreground work that waits on background work (the LMDB map grows only once the views
a materialization reads are closed) lifts the pause meanwhile (:func:`yielding`), or it
would wait for the background a step per :data:`MOST_PAUSE_S`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec

_P = ParamSpec("_P")

__all__ = [
    "BACKGROUND_SHARE",
    "MOST_PAUSE_S",
    "Pacer",
    "foreground",
    "give_way",
    "in_background",
    "pace",
    "paced",
    "yielding",
]

#: The longest a background step waits for the foreground to finish: a process whose
#: foreground never rests still advances its materialization, a step per this long.
MOST_PAUSE_S = 0.5
#: The least share of the wall time a :class:`Pacer`'s loop keeps while foreground work never
#: rests (back-to-back batches): without it, a step of a few ms per half second made a
#: materialization of 8M keys take many minutes, and the log a restore replays grew meanwhile.
BACKGROUND_SHARE = 0.1


class _Foreground:
    """How many foreground blocks run in the process, how many of them wait on background work."""

    def __init__(self) -> None:
        self.busy = 0
        self.waiting = 0
        self.rested = threading.Condition()

    def pausing(self) -> bool:
        """Whether background work pauses now: foreground work runs, none of it waiting on it."""
        return bool(self.busy) and not self.waiting


_FOREGROUND = _Foreground()


@contextmanager
def foreground() -> Iterator[None]:
    """Run the block as this process's foreground work (nested and concurrent blocks count).

    While any such block runs, the backend's background work of the process (a
    materialization's snapshot, the reading of a resumed log) pauses at its next step.
    """
    state = _FOREGROUND
    with state.rested:
        state.busy += 1
    try:
        yield
    finally:
        with state.rested:
            state.busy -= 1
            if not state.pausing():
                state.rested.notify_all()


@contextmanager
def yielding() -> Iterator[None]:
    """Run the block, in foreground work, as a wait on background work: the pause lifts meanwhile."""
    state = _FOREGROUND
    with state.rested:
        state.waiting += 1
        state.rested.notify_all()
    try:
        yield
    finally:
        with state.rested:
            state.waiting -= 1


def give_way(most: float | None = None) -> float:
    """Wait (at most ``most`` seconds, :data:`MOST_PAUSE_S` by default) while foreground work runs.

    Background loops call it between steps; with no foreground work it returns at once.
    Returns the seconds waited.
    """
    state = _FOREGROUND
    if not state.pausing():  # the common case: no lock taken
        return 0.0
    began = time.perf_counter()
    with state.rested:
        state.rested.wait_for(lambda: not state.pausing(), timeout=MOST_PAUSE_S if most is None else most)
    return time.perf_counter() - began


class Pacer:
    """Gives way to foreground work between a loop's steps, keeping at least ``share`` of the time.

    Each pause lasts at most what the step before it took times ``(1 - share) / share``
    (and :data:`MOST_PAUSE_S`): a loop beside foreground work that never rests still
    finishes within about its own time divided by ``share``.
    """

    def __init__(self, share: float | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        share = BACKGROUND_SHARE if share is None else share  # read now: a test may change it
        if not 0 < share <= 1:
            msg = f"a background share is in (0, 1], got {share}"
            raise ValueError(msg)
        self._ratio = (1 - share) / share
        self._clock = clock
        self._step_began = clock()

    def __call__(self) -> float:
        """Give way after a step; returns the seconds waited."""
        step = self._clock() - self._step_began
        waited = give_way(min(MOST_PAUSE_S, step * self._ratio))
        self._step_began = self._clock()
        return waited


def paced(step: Callable[_P, None], every: int) -> Callable[_P, None]:
    """``step``, giving way to foreground work after every ``every`` calls (a loop it does not own)."""
    calls = 0

    def call(*args: _P.args, **kwargs: _P.kwargs) -> None:
        nonlocal calls
        step(*args, **kwargs)
        calls += 1
        if not calls % every:
            give_way()

    return call


_THREAD = threading.local()  # ``pacer``: set while the thread runs work marked as background


@contextmanager
def in_background(share: float | None = None) -> Iterator[None]:
    """Run the block as background work of this thread: :func:`pace` then gives way in it.

    For work that runs in the foreground too (a restore: a task's own, or a standby
    copy's in a thread beside the worker's next task), whose loops call :func:`pace`.
    """
    previous = getattr(_THREAD, "pacer", None)
    _THREAD.pacer = Pacer(share)
    try:
        yield
    finally:
        _THREAD.pacer = previous


def pace() -> float:
    """Between two steps of work that may run in the background: give way there, never in the foreground.

    Returns the seconds waited (0 outside :func:`in_background`).
    """
    pacer = getattr(_THREAD, "pacer", None)
    return 0.0 if pacer is None else pacer()
