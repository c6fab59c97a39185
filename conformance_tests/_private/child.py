"""Child process of the conformance suite: writes, reports, then dies or exits.

Reads one JSON request from stdin and prints one JSON line per event, flushed, so
the parent knows exactly what had completed when the child was killed.

Modes:
- ``persist-then-kill``: append ``count`` changes, persist, print the handle,
  SIGKILL itself immediately.
- ``take-over``: create the writer with ``epoch`` (fencing older ones), append,
  persist, print the handle, exit normally.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from dstl.spi import Config, KeyGroupRange, load_storage

from ..testing import change_bytes


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Serve one request from stdin."""
    request = json.loads(sys.stdin.read())
    storage = load_storage(Config(request["config"]), job_id=request["job_id"])
    key_groups = KeyGroupRange(*request["key_groups"])
    writer = storage.create_writer(request["operator_id"], key_groups, epoch=request["epoch"])
    _emit({"event": "writer-created"})
    for index in range(request["count"]):
        writer.append(
            key_groups.start + index % len(key_groups), change_bytes(request["tag"], index, request["size"])
        )
        if index % 7 == 6:
            writer.next_sqn()
    handle = writer.persist(writer.initial_sqn(), 1).result(timeout=request["timeout"])
    _emit({"event": "persisted", "handle": handle.to_json()})
    if request["mode"] == "persist-then-kill":
        os.kill(os.getpid(), signal.SIGKILL)
    writer.close()
    storage.close()
    _emit({"event": "exited"})


if __name__ == "__main__":
    main()
