"""Recovery time as a restarted job sees it: a fresh process restores a checkpoint.

Timing a restore inside the process that just ran the workload measures that
process's memory state (a million live entries of the old backend, a fragmented
heap) as much as the restore. A recovery starts from an empty process, so each
probe is one: it restores once and reports the seconds of ``restore()`` alone
(interpreter start and imports excluded, as a long-lived worker has them already).

    python -m bench.restore_probe REQUEST.json   # prints {"seconds": ..., "entries": ...}
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.spi import KeyGroupRange, load_storage


def measure(
    snapshot: BackendSnapshot,
    storage_config: dict[str, str],
    snapshot_dir: str,
    key_groups: KeyGroupRange,
    workdir: Path,
    *,
    repeat: int = 3,
    timeout: float = 600,
) -> tuple[float, int]:
    """Median restore seconds over ``repeat`` fresh processes, and the entries restored."""
    request = workdir / f"restore-{snapshot.checkpoint_id}.json"
    request.write_text(
        json.dumps(
            {
                "snapshot": snapshot.to_json(),
                "storage": storage_config,
                "snapshot_dir": snapshot_dir,
                "key_groups": [key_groups.start, key_groups.end],
            }
        )
    )
    request.chmod(0o600)  # the storage config may hold credentials
    seconds, entries = [], set()
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-m", "bench.restore_probe", str(request)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            msg = f"restore probe failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            raise RuntimeError(msg)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        seconds.append(report["seconds"])
        entries.add(report["entries"])
    if len(entries) != 1:
        msg = f"restores disagree on the number of entries: {sorted(entries)}"
        raise AssertionError(msg)
    return statistics.median(seconds), entries.pop()


def _probe(request: dict[str, Any]) -> dict[str, Any]:
    snapshot = BackendSnapshot.from_json(request["snapshot"])
    key_groups = KeyGroupRange(*request["key_groups"])
    # A job of its own: the probe's writer (every backend has one) touches nothing of the checkpoint's.
    with load_storage(request["storage"], job_id=f"restore-probe-{uuid.uuid4().hex[:8]}") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", key_groups, epoch=1, snapshot_dir=request["snapshot_dir"]
        )
        began = time.perf_counter()
        backend.restore(snapshot, request["storage"])
        seconds = time.perf_counter() - began
        view = backend.delegate.snapshot()
        entries = sum(len(group) for groups in view.values() for group in groups.values())
        backend.close()
    return {"seconds": seconds, "entries": entries}


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(Path(sys.argv[1]).read_text()))))
