"""Recovery time as a restarted job sees it: a fresh process restores a checkpoint.

Timing a restore inside the process that just ran the workload measures that
process's memory state (a million live entries of the old backend, a fragmented
heap) as much as the restore. A recovery starts from an empty process, so each
probe is one: it restores once and reports the seconds of ``restore()`` alone
(interpreter start and imports excluded, as a long-lived worker has them already).

    python -m bench.restore_probe REQUEST.json [--size]   # prints {"seconds", "entries"[, "state_bytes"]}

With ``--size`` the probe then (untimed) writes the restored state as one full
snapshot: its size is the "size of the state" the report compares checkpoints with.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.checkpointing import entry_count
from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.spi import KeyGroupRange, load_storage


@dataclass(frozen=True)
class RestoreFigures:
    """Median restore seconds, the entries every restore produced, the state's full-snapshot bytes."""

    seconds: float
    entries: int
    state_bytes: int


def measure(
    snapshot: BackendSnapshot,
    storage_config: dict[str, str],
    snapshot_dir: str,
    key_groups: KeyGroupRange,
    workdir: Path,
    *,
    job_id: str,
    repeat: int = 3,
    timeout: float = 600,
) -> RestoreFigures:
    """Restore in ``repeat`` fresh processes (the first also sizes the state)."""
    request = workdir / f"restore-{snapshot.checkpoint_id}.json"
    request.write_text(
        json.dumps(
            {
                "snapshot": snapshot.to_json(),
                "storage": storage_config,
                "snapshot_dir": snapshot_dir,
                "job_id": job_id,
                "key_groups": [key_groups.start, key_groups.end],
            }
        )
    )
    request.chmod(0o600)  # the storage config may hold credentials
    seconds, entries, state_bytes = [], set(), 0
    for attempt in range(repeat):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.restore_probe",
                str(request),
                *(["--size"] if attempt == 0 else []),
            ],
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
        state_bytes = report.get("state_bytes", state_bytes)
    if len(entries) != 1:
        msg = f"restores disagree on the number of entries: {sorted(entries)}"
        raise AssertionError(msg)
    return RestoreFigures(statistics.median(seconds), entries.pop(), state_bytes)


def _probe(request: dict[str, Any], *, size: bool) -> dict[str, Any]:
    snapshot = BackendSnapshot.from_json(request["snapshot"])
    key_groups = KeyGroupRange(*request["key_groups"])
    # The checkpoint's job (a restore reads only its own job's snapshots), an operator of its own:
    # the probe's writer (every backend has one) claims no log of the checkpoint's.
    with load_storage(request["storage"], job_id=request["job_id"]) as storage:
        backend = ChangelogKeyedStateBackend(
            storage,
            f"restore-probe-{uuid.uuid4().hex[:8]}",
            key_groups,
            epoch=1,
            snapshot_dir=request["snapshot_dir"],
        )
        began = time.perf_counter()
        backend.restore(snapshot, request["storage"])
        report = {"seconds": time.perf_counter() - began, "entries": entry_count(backend.delegate)}
        if size:  # the first materialization after a restore is a full snapshot
            report["state_bytes"] = backend.materialize().result(timeout=600).size
        backend.close()
    return report


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(Path(sys.argv[1]).read_text()), size="--size" in sys.argv[2:])))
