"""Soak: thousands of checkpoints with a new writer epoch each, as Spark makes them.

Per batch, two operator instances each get a writer with a new epoch, persist,
and the checkpoint before the last two is discarded (``num-retained`` 2); every
tenth batch an attempt fails after persisting (its data is an orphan), and every
hundredth the coordinator's orphan collection runs. What the storage keeps
(files, objects, markers, bytes) must be flat after warm-up. Figures are printed
at 100, 1,000 and the last batch for the record.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from dstl.conformance.testing import persist, read_data
from dstl.spi import KeyGroupRange, load_storage

KG = KeyGroupRange(0, 64)
BATCHES = int(os.environ.get("DSTL_SOAK_BATCHES", "2000"))
MARKS = sorted({100, 1000, BATCHES} & set(range(1, BATCHES + 1)))


def _footprint(storage, root: Path | None) -> tuple[int, int]:
    """(files or objects the job holds, bytes) — read from below the storage."""
    if root is not None:
        files = [p for p in root.rglob("*") if p.is_file()]
        return len(files), sum(p.stat().st_size for p in files)
    if hasattr(storage, "markers"):  # filesystem on S3: data objects and epoch markers
        keys = storage.store.list(f"{storage.job_id}/")
        return len(keys), sum(len(storage.store.get(k)) for k in keys if "/data/" in k)
    objects = storage.list_objects()
    return len(objects), 0


def _churn(storage, root):
    retained: list[list] = []
    figures = {}
    for batch in range(1, BATCHES + 1):
        handles = []
        for instance in range(2):
            writer = storage.create_writer(f"op{instance}", KG, epoch=batch * 10)
            writer.append(batch % 64, f"batch {batch} instance {instance}".encode() * 4)
            handles.append(persist(writer, 0, batch))
            writer.close()
        if batch % 10 == 0:  # a failed attempt: persisted, then lost; nobody discards it
            failed = storage.create_writer("op0", KG, epoch=batch * 10 + 1)
            failed.append(0, b"lost attempt")
            persist(failed, 0, batch)
            failed.close()
        retained.append(handles)
        if len(retained) > 2:
            storage.discard(retained.pop(0))
        if batch % 100 == 0:
            time.sleep(0.01)  # the cutoff lies after the last failed attempt
            storage.collect_orphans([h for hs in retained for h in hs], older_than=time.time())
        if batch in MARKS:
            figures[batch] = _footprint(storage, root)
    for handles in retained:
        for handle in handles:
            assert read_data(storage, handle), "a retained checkpoint lost its data"
    return figures


def _report(storage_id, figures):
    rows = ", ".join(f"{batch}: {count} files/objects, {size} B" for batch, (count, size) in figures.items())
    print(f"soak {storage_id} ({BATCHES} checkpoints): {rows}")


def _assert_flat(figures):
    first, last = figures[MARKS[0]], figures[MARKS[-1]]
    assert last[0] <= first[0] + 2, figures
    assert last[1] <= max(first[1] * 2, first[1] + 64 * 1024), figures


@pytest.mark.slow
@pytest.mark.parametrize("storage_id", ["memory", "local", "filesystem-file", "filesystem-s3"])
def test_storage_footprint_stays_flat_under_writer_churn(storage_id, tmp_path, request):
    root = None
    if storage_id == "memory":
        config = {"dstl.storage": "memory", "dstl.memory.namespace": f"soak-{uuid.uuid4().hex}"}
    elif storage_id == "local":
        root = tmp_path / "local"
        config = {"dstl.storage": "local", "dstl.local.dir": str(root), "dstl.local.segment-size": "16kb"}
    elif storage_id == "filesystem-file":
        root = tmp_path / "dfs"
        config = {"dstl.storage": "filesystem", "dstl.dfs.base-path": root.as_uri()}
    else:
        config = request.getfixturevalue("s3_config")
    if storage_id.startswith("filesystem"):
        config = {**config, "dstl.dfs.batch.persist-delay": "0ms"}  # one writer: nothing to batch
    with load_storage(config, job_id="soak") as storage:
        figures = _churn(storage, root)
    _report(storage_id, figures)
    _assert_flat(figures)


@pytest.mark.slow
def test_kafka_process_state_stays_flat_under_writer_churn(kafka_config):
    """The broker keeps what retention and compaction keep; the storage process must stay flat."""
    batches = min(BATCHES, 500)
    with load_storage(kafka_config, job_id="soak") as storage:
        sizes = {}
        for batch in range(1, batches + 1):
            for instance in range(2):
                writer = storage.create_writer(f"op{instance}", KG, epoch=batch)
                writer.append(batch % 64, b"x" * 64)
                persist(writer, 0, batch)
                writer.close()
            if batch in (100, batches):
                ledgers = sum(len(ledger._ours) for ledger in storage._ledgers.values())
                sizes[batch] = (
                    len(storage.claims.owners),
                    len(storage._writers),
                    storage.claims.kept,
                    ledgers,
                )
    print(
        f"soak kafka ({batches} checkpoints): owners/open writers/kept claim producers/ledger entries {sizes}"
    )
    assert sizes[batches][:3] == sizes[100][:3] == (2, 0, 2)
    assert sizes[batches][3] <= sizes[100][3] + 8
