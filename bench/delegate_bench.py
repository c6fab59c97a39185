"""Heap vs. LMDB working state: mutation cost, and getting state into a new process.

With heap state a process that takes over a partition restores from the DSTL
(replay); with LMDB it opens the host's file. Both measured in the same run.

    python -m bench.delegate_bench [--keys N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid

from rich.console import Console

from bench.dstl_bench import _table
from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.spi import KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)

_REOPEN = """
import sys, time
from dstl.backend.delegate import LmdbDelegate
started = time.perf_counter()
delegate = LmdbDelegate(sys.argv[1])
n = sum(1 for _ in delegate.entries("v", int(sys.argv[2])))
print(time.perf_counter() - started)
"""

_RESTORE = """
import sys, time
from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.spi import KeyGroupRange, load_storage
config = {"dstl.storage": "local", "dstl.local.dir": sys.argv[1]}
snapshot = BackendSnapshot.from_json(open(sys.argv[2]).read())
with load_storage(config, job_id="bench") as storage:
    started = time.perf_counter()
    backend = ChangelogKeyedStateBackend(storage, "restored", KeyGroupRange(0, 128), epoch=1)
    backend.restore(snapshot)
    print(time.perf_counter() - started)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        config = {"dstl.storage": "local", "dstl.local.dir": f"{workdir}/log"}
        with load_storage(config, job_id="bench") as storage:
            for name, delegate in (("heap", HeapDelegate()), ("lmdb", LmdbDelegate(f"{workdir}/lmdb"))):
                backend = ChangelogKeyedStateBackend(
                    storage, f"op-{name}-{uuid.uuid4().hex[:4]}", ALL, delegate=delegate
                )
                state = backend.value_state("v")
                started = time.perf_counter()
                for key in range(args.keys):
                    backend.set_current_key(key)
                    state.update(key)
                updates = args.keys / (time.perf_counter() - started)
                snapshot = backend.checkpoint(1).result(timeout=120)
                backend.close()
                if name == "heap":
                    path = f"{workdir}/snapshot.json"
                    with open(path, "w") as handle:
                        handle.write(snapshot.to_json())
                    cmd = [sys.executable, "-c", _RESTORE, f"{workdir}/log", path]
                    how = "restore from the DSTL (replay)"
                else:
                    delegate.close()
                    cmd = [sys.executable, "-c", _REOPEN, f"{workdir}/lmdb", "0"]
                    how = "open the host's LMDB file"
                took = float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip())
                rows.append([name, f"{updates:,.0f}", how, f"{took * 1000:.1f}"])
    console.print(
        _table(
            f"working state of {args.keys:,} keys",
            ["delegate", "updates/s", "new process gets state by", "ms"],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
