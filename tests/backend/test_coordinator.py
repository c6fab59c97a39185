"""Checkpoint coordinator: retention, shared-state discard, recovery."""

import time
import uuid

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.checkpoints import CheckpointCoordinator, CompletedCheckpoint
from dstl.spi import ConfigError, KeyGroupRange, load_storage
from tests.backend.helpers import restored_counts

ALL = KeyGroupRange(0, 128)


def run_job(config, checkpoints_dir, checkpoints=50, every=10):
    storage = load_storage(config, job_id="job")
    coordinator = CheckpointCoordinator(checkpoints_dir, "job", num_retained=2, config=config)
    backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=checkpoints_dir)
    state = backend.value_state("count")
    for checkpoint_id in range(1, checkpoints + 1):
        for key in range(checkpoint_id % 7, 200, 7):
            backend.set_current_key(key)
            state.update((state.value() or 0) + 1)
        if checkpoint_id % every == 0:
            backend.materialize().result(timeout=30)
        snapshot = backend.checkpoint(checkpoint_id).result(timeout=30)
        coordinator.complete(checkpoint_id, {"op/0": snapshot})
        backend.notify_checkpoint_complete(snapshot)
    expected = {}
    for key in range(200):
        backend.set_current_key(key)
        expected[key] = state.value()
    return storage, coordinator, backend, expected


def test_only_what_the_retained_checkpoints_reference_remains(tmp_path):
    config = {"dstl.storage": "memory", "dstl.memory.namespace": f"c-{uuid.uuid4().hex}"}
    checkpoints_dir = (tmp_path / "chk").as_uri()
    storage, coordinator, backend, _ = run_job(config, checkpoints_dir)
    retained = coordinator.retained
    assert [c.checkpoint_id for c in retained] == [49, 50]
    referenced_objects = {
        loc["object"]
        for c in retained
        for s in c.snapshots.values()
        for h in s.handles
        for loc in h.location_dicts
    }
    referenced_snapshots = {ref.path for c in retained for s in c.snapshots.values() for ref in s.references}
    assert set(storage.list_objects()) == referenced_objects
    on_disk = {str(p.relative_to(tmp_path / "chk")) for p in (tmp_path / "chk").rglob("*.snap")}
    # Checkpoint 49 still needs the snapshot taken at 40 and its bridge from 30, checkpoint 50 its
    # own and its bridge from 40 (full 30, incr 40, full 40, incr 50, full 50); 10-20 are gone.
    assert on_disk == referenced_snapshots and len(on_disk) == 5
    metadata = sorted(p.name for p in (tmp_path / "chk" / "job" / "checkpoints").iterdir())
    assert metadata == ["chk-000000000049.json", "chk-000000000050.json"]
    backend.close()
    storage.close()


def test_recover_removes_orphans_and_restores_the_latest(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    checkpoints_dir = (tmp_path / "chk").as_uri()
    storage, coordinator, backend, expected = run_job(config, checkpoints_dir, checkpoints=25, every=10)
    backend.close()
    storage.close()
    # A crash left a half-written metadata file and an orphan snapshot behind.
    (tmp_path / "chk" / "job" / "checkpoints" / ".tmp-deadbeef").write_text("{")
    orphan = tmp_path / "chk" / "job" / "snapshots" / "op" / "op.kg0-128-sqn999-orphan.snap"
    orphan.write_bytes(b"DSTM")
    recovered = CheckpointCoordinator(checkpoints_dir, "job", num_retained=2, config=config)
    latest = recovered.recover()
    assert latest is not None and latest.checkpoint_id == 25
    assert not orphan.exists()
    assert not (tmp_path / "chk" / "job" / "checkpoints" / ".tmp-deadbeef").exists()
    with load_storage(config, job_id="job") as storage:
        assert (
            restored_counts(storage, checkpoints_dir, latest.snapshots["op/0"], config, epoch=1) == expected
        )


def test_metadata_round_trip_and_validation():
    import pytest

    from dstl.spi import InvalidHandleError

    empty = CompletedCheckpoint(3, {})
    assert CompletedCheckpoint.from_json(empty.to_json()) == empty
    with pytest.raises(InvalidHandleError):
        CompletedCheckpoint.from_json('{"checkpoint_id": "x", "snapshots": {}}')


def test_coordinator_from_config(tmp_path):
    config = {"state.checkpoints.dir": tmp_path.as_uri(), "state.checkpoints.num-retained": "3"}
    coordinator = CheckpointCoordinator.from_config(config, "job")
    assert coordinator.num_retained == 3
    with pytest.raises(ConfigError, match="state.checkpoints.dir"):
        CheckpointCoordinator.from_config({}, "job")
    with pytest.raises(ConfigError, match="num-retained"):
        CheckpointCoordinator.from_config({**config, "state.checkpoints.num-retained": "0"}, "job")


@pytest.mark.parametrize("storage_id", ["memory", "local", "filesystem"])
def test_recovery_collects_what_failed_attempts_left(tmp_path, storage_id):
    config = {
        "memory": {"dstl.storage": "memory", "dstl.memory.namespace": f"o-{uuid.uuid4().hex}"},
        "local": {
            "dstl.storage": "local",
            "dstl.local.dir": str(tmp_path / "log"),
            "dstl.local.segment-size": "8kb",
            "dstl.changelog.compression": "none",  # segments roll by what is stored: keep it what is written
        },
        "filesystem": {
            "dstl.storage": "filesystem",
            "dstl.dfs.base-path": (tmp_path / "dfs").as_uri(),
            "dstl.dfs.upload.max-attempts": "1",  # an upload takes at most 1s: the grace may be that short
        },
    }[storage_id]
    checkpoints_dir = (tmp_path / "chk").as_uri()
    storage, coordinator, backend, expected = run_job(config, checkpoints_dir, checkpoints=12, every=5)
    # Attempts that failed after persisting: their data is referenced by no checkpoint.
    for attempt in range(5):
        zombie = storage.create_writer("failed-attempt", ALL, epoch=attempt)
        zombie.append(3, b"z" * 3000)
        zombie.persist(0, 100 + attempt).result(timeout=30)
        zombie.close()
    backend.close()
    before = len(storage.list_objects())
    storage.close()  # the job stopped; a restarted one recovers
    storage = load_storage(config, job_id="job")
    time.sleep(1.1)  # older than the shortest grace
    recovered = CheckpointCoordinator(checkpoints_dir, "job", num_retained=2, config=config, orphan_grace=1)
    latest = recovered.recover()
    referenced = {
        loc.get("object") or loc.get("segment").rsplit("/", 1)[-1]
        for c in recovered.retained
        for s in c.snapshots.values()
        for h in s.handles
        for loc in h.location_dicts
    }
    left = set(storage.list_objects())
    assert left <= {name.rsplit("/", 1)[-1] for name in referenced} | referenced, (before, left, referenced)
    assert len(left) < before, "nothing was collected"
    assert restored_counts(storage, checkpoints_dir, latest.snapshots["op/0"], config, epoch=9) == expected
    storage.close()


def test_a_grace_shorter_than_an_upload_may_take_is_refused(tmp_path):
    from dstl.backend.checkpoints.coordinator import MIN_ORPHAN_GRACE

    checkpoints_dir = (tmp_path / "chk").as_uri()
    config = {"dstl.storage": "filesystem", "dstl.dfs.base-path": (tmp_path / "dfs").as_uri()}
    for grace in (0, 0.5):
        with pytest.raises(ConfigError, match="orphan-collection.grace"):
            CheckpointCoordinator(checkpoints_dir, "job", config=config, orphan_grace=grace)
    with pytest.raises(ConfigError, match="orphan-collection.grace"):
        grace = {"state.checkpoints.orphan-collection.grace": "0s", "state.checkpoints.dir": checkpoints_dir}
        CheckpointCoordinator.from_config({**config, **grace}, "job")
    # filesystem's uploads may take timeout x attempts + delays (1s x 3 + 0.5s x 2 by default)
    coordinator = CheckpointCoordinator(checkpoints_dir, "job", config=config, orphan_grace=MIN_ORPHAN_GRACE)
    with pytest.raises(ConfigError, match=r"upload of storage 'filesystem' may take \(4s\)"):
        coordinator.recover()
    coordinator = CheckpointCoordinator(checkpoints_dir, "job", config=config, orphan_grace=4)
    assert coordinator.recover() is None


@pytest.mark.parametrize("storage_id", ["memory", "local", "filesystem-s3"])
def test_two_checkpoint_directories_cannot_share_a_job_id_on_one_storage(tmp_path, request, storage_id):
    from dstl.spi import JobConflictError

    config = {
        "memory": lambda: {"dstl.storage": "memory", "dstl.memory.namespace": f"b-{uuid.uuid4().hex}"},
        "local": lambda: {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "shared")},
        "filesystem-s3": lambda: request.getfixturevalue("s3_config"),
    }[storage_id]()
    first = CheckpointCoordinator((tmp_path / "a").as_uri(), "job", config=config)
    first.recover()
    second = CheckpointCoordinator((tmp_path / "b").as_uri(), "job", config=config)
    with pytest.raises(JobConflictError) as refused:
        second.recover()
    assert first.url in str(refused.value) and second.url in str(refused.value)
    assert CheckpointCoordinator((tmp_path / "a").as_uri(), "job", config=config).recover() is None
    CheckpointCoordinator((tmp_path / "b").as_uri(), "other", config=config).recover()  # its own id: fine
