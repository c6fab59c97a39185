"""Chaining futures without hand-written callbacks: a storage maps an upload's result to locations."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["mapped", "when_all"]

T = TypeVar("T")
R = TypeVar("R")


def mapped(future: Future[T], function: Callable[[T], R]) -> Future[R]:
    """A future of ``function(future's result)``; the source's failure, or the function's, fails it."""
    result: Future[R] = Future()

    def settle(done: Future[T]) -> None:
        try:
            result.set_result(function(done.result()))
        except BaseException as exc:  # the caller's future carries every failure, as the source would
            result.set_exception(exc)

    future.add_done_callback(settle)
    return result


def when_all(futures: list[Future[Any]], callback: Callable[[], None]) -> None:
    """Run ``callback`` once every future is done (at once when there is none)."""
    if not futures:
        callback()
        return
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            callback()

    for fut in futures:
        fut.add_done_callback(one_done)
