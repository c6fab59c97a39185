"""The snapshot encoder process: ``python -m dstl.backend.changelog.encoder_process <request file>``.

Started by :mod:`.snapshot_encoding` for a view detached onto a spooled copy. It reads
its :class:`~.snapshot_encoding.EncodeRequest`, opens the copy read-only, encodes the
snapshot object into a file inside the spool at a lower CPU priority, and writes msgpack
messages to stdout: ``{"sections": 0}`` first (it came up), ``{"sections": n}`` after each
section (what the parent's stall bound watches), then ``{"size", "entries", "expired"}`` or
``{"error"}``. It writes nothing outside the spool and gives up when the requesting process
is gone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from ..delegate import StateView, read_copy
from ..materialization import SnapshotWriter
from .changed_keys import ChangedKeysView
from .snapshot_encoding import ENCODED_NAME, EncodeRequest, Expiry, encode_sections

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Encode the snapshot ``argv[0]`` (a request file) asks for; 0 when it was written."""
    out = sys.stdout.buffer

    def send(message: dict[str, Any]) -> None:
        out.write(msgpack.packb(message, use_bin_type=True))
        out.flush()

    send({"sections": 0})  # up: the parent encodes in its own process when no message ever comes
    try:
        request = EncodeRequest.decode(Path(argv[0]).read_bytes())
        os.nice(request.niceness)
        report = _encode(request, send)
    except Exception as exc:  # reported, then a non-zero exit: the parent retries the materialization
        send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    send(report)
    return 0


def _encode(request: EncodeRequest, send: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    sections = 0

    def between() -> None:
        nonlocal sections
        if os.getppid() != request.parent:  # the task's process died: nobody uploads this
            msg = "the materializing process ended"
            raise RuntimeError(msg)
        sections += 1
        send({"sections": sections})

    view: StateView = read_copy(request.spool)
    if request.changes is not None:
        view = ChangedKeysView.over(view, request.changes)
    expiry = Expiry(request.ttl_states, request.now, request.most)
    try:
        with (Path(request.spool) / ENCODED_NAME).open("wb") as stream:
            writer = SnapshotWriter(stream, request.codec)
            encode_sections(view, request.key_groups, writer, expiry, between)
            size = writer.finish(request.meta)
    finally:
        view.close()
    return {"size": size, "entries": writer.entries, "expired": expiry.found}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
