"""Following what a helper process writes, with a bound on how long it may stay silent.

The snapshot encoder (a process of its own) and a restore's forked squash both
report progress on a pipe while they work; a helper that says nothing for
:data:`STALL_SECONDS` is taken for hung, and its caller stops it and carries on
without it. ``poll()``, not ``select()``: a Spark worker may hold more than
FD_SETSIZE (1024) descriptors.
"""

from __future__ import annotations

import os
import select
from collections.abc import Iterator

__all__ = ["STALL_SECONDS", "Stalled", "chunks"]

#: A helper that writes nothing for this long is taken for hung. The encoder writes after each
#: section (a key group: at niceness 10 beside busy batches, about a tenth of a core, one of
#: 125k keys takes about a second); the squash after each change set it decodes.
STALL_SECONDS = 120.0


class Stalled(Exception):
    """The helper wrote nothing for :data:`STALL_SECONDS`."""


def chunks(fd: int) -> Iterator[bytes]:
    """What the helper writes to ``fd``, chunk by chunk, until it closes its end.

    :raises Stalled: nothing came for :data:`STALL_SECONDS` (read at the call).
    """
    bound_ms = STALL_SECONDS * 1000
    waiting = select.poll()
    waiting.register(fd, select.POLLIN)
    while True:
        if not waiting.poll(bound_ms):
            raise Stalled
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        yield chunk
