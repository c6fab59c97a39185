"""Soak: four jobs on one storage (one bucket, one directory), hundreds of checkpoints each.

Two of the four claim the same job id from different checkpoint locations, as a
team copying a job's settings would: the second is refused at its start and then
runs with the id its location derives. Every job churns writers (a new epoch
every few checkpoints, restored from its last checkpoint), leaves failed attempts
behind, materializes, and collects orphans every 20 checkpoints. At the end no job
lost an acknowledged change, each job's state equals its recomputation, and what
each job keeps on the storage is flat.
"""

from __future__ import annotations

import os
import time

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.checkpoints import CheckpointCoordinator
from dstl.backend.spark.job_identity import default_job_id
from dstl.spi import JobConflictError, KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)
CHECKPOINTS = int(os.environ.get("DSTL_SOAK_JOB_CHECKPOINTS", "500"))
KEYS = 200
FAILED_EVERY, COLLECT_EVERY, CHURN_EVERY, MATERIALIZE_EVERY = 10, 20, 25, 50
MARKS = (100, CHECKPOINTS)


class _Job:
    """One job: its checkpoint directory, coordinator, storage and backend, and the model of its state."""

    def __init__(self, name: str, job_id: str, config: dict[str, str], root, grace: float) -> None:
        self.name = name
        self.config = config
        self.directory = (root / name / "state").as_uri()
        self.coordinator = CheckpointCoordinator(
            self.directory, job_id, config=config, num_retained=2, orphan_interval=1e9, orphan_grace=grace
        )
        self.coordinator.recover()  # binds the job id on the storage: refused when another job holds it
        self.job_id = job_id
        self.storage = load_storage(config, job_id=job_id)
        self.backend = self._backend(epoch=1)
        self.model: dict[str, int] = {}
        self.footprint: dict[int, tuple[int, int]] = {}

    def _backend(self, epoch: int) -> ChangelogKeyedStateBackend:
        backend = ChangelogKeyedStateBackend(
            self.storage, "op", ALL, epoch=epoch, snapshot_dir=self.directory
        )
        latest = self.coordinator.latest()
        if latest is not None:
            backend.restore(latest.snapshots["op"], self.config)
        return backend

    def checkpoint(self, number: int) -> None:
        state = self.backend.value_state("count")
        for k in range(5):
            key = f"{self.name}-{(number * 7 + k) % KEYS}"
            self.backend.set_current_key(key)
            state.update(number * 10 + k)
            self.model[key] = number * 10 + k
        if number % MATERIALIZE_EVERY == 0:
            self.backend.materialize().result(timeout=60)
        snapshot = self.backend.checkpoint(number).result(timeout=60)
        self.coordinator.complete(number, {"op": snapshot})
        self.backend.notify_checkpoint_complete(snapshot)
        if number % FAILED_EVERY == 0:  # an attempt that persisted and died: its data is an orphan
            failed = self.storage.create_writer("failed", ALL, epoch=number)
            failed.append(3, f"lost attempt of {self.name} at {number}".encode() * 20)
            failed.persist(0, number).result(timeout=60)
            failed.close()
        if number % CHURN_EVERY == 0:  # the task moves: a new writer epoch, restored from the checkpoint
            self.backend.close()
            self.backend = self._backend(epoch=number + 1)
        if number % COLLECT_EVERY == 0:
            self.coordinator.collect_orphans()
        if number in MARKS:
            self.footprint[number] = _footprint(self.storage)

    def verify(self) -> None:
        self.backend.close()
        restored = self._backend(epoch=CHECKPOINTS + 10)
        state = restored.value_state("count")
        found = {}
        for key in self.model:
            restored.set_current_key(key)
            found[key] = state.value()
        restored.close()
        assert found == self.model, f"job {self.name} lost acknowledged changes"

    def close(self) -> None:
        self.storage.close()


def _footprint(storage) -> tuple[int, int]:
    """(objects or segments, bytes on disk or in the bucket) of the job, read from below the storage."""
    if hasattr(storage, "store"):  # filesystem: everything under the job's prefix
        keys = storage.store.list(f"{storage.job_id}/")
        return len(storage.list_objects()), sum(len(storage.store.get(key)) for key in keys)
    files = [p for p in storage.job_dir.rglob("*") if p.is_file()]
    return len(storage.list_objects()), sum(p.stat().st_blocks * 512 for p in files)


def _start(name: str, job_id: str, config: dict[str, str], root, grace: float) -> tuple[_Job, bool]:
    """The job under ``job_id``; if another location holds that id, refused, then under its own."""
    try:
        return _Job(name, job_id, config, root, grace), False
    except JobConflictError:
        return _Job(name, default_job_id((root / name / "state").as_uri()), config, root, grace), True


@pytest.mark.slow
@pytest.mark.parametrize("storage_id", ["local", "filesystem-s3"])
def test_four_jobs_on_one_storage_stay_apart_lose_nothing_and_stay_flat(storage_id, tmp_path, request):
    grace = 1.0 if storage_id == "local" else 3.0
    if storage_id == "local":
        # small segments roll often: a job keeps what its live handles need, not a 64 MB segment
        shared = {
            "dstl.storage": "local",
            "dstl.local.dir": str(tmp_path / "shared-log"),
            "dstl.local.segment-size": "16kb",
        }
    else:
        shared = {
            **request.getfixturevalue("s3_config"),
            "dstl.dfs.batch.persist-delay": "0ms",
            # one attempt of at most 3 s (a loaded machine's moto may take over 1 s): a 3 s grace holds
            "dstl.dfs.upload.max-attempts": "1",
            "dstl.dfs.upload.timeout": "3s",
        }
    ids = ["team", "team", "alpha", "beta"]  # the first two: the same id from two locations
    jobs, refused = [], []
    for index, job_id in enumerate(ids):
        job, was_refused = _start(f"job{index}", job_id, shared, tmp_path, grace)
        jobs.append(job)
        refused.append(was_refused)
    assert refused == [False, True, False, False]
    assert len({job.job_id for job in jobs}) == 4
    started = time.monotonic()
    try:
        for number in range(1, CHECKPOINTS + 1):
            for job in jobs:
                job.checkpoint(number)
        for job in jobs:
            job.verify()
    finally:
        for job in jobs:
            job.close()
    figures = {job.name: job.footprint for job in jobs}
    took = time.monotonic() - started
    print(f"multi-job soak {storage_id}: {CHECKPOINTS} checkpoints x 4 jobs in {took:.0f} s; "
          f"(objects, bytes) per job at {MARKS}: {figures}")
    for job in jobs:
        (early, early_bytes), (late, late_bytes) = job.footprint[MARKS[0]], job.footprint[MARKS[-1]]
        assert late <= early + 4, (job.name, job.footprint)
        assert late_bytes <= max(2 * early_bytes, early_bytes + (256 << 10)), (job.name, job.footprint)
