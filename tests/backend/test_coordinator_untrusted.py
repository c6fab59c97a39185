"""The coordinator reads untrusted documents: no silent rollback, no deletion outside the job."""

import json
import uuid

import pytest

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.checkpoints import CheckpointCoordinator, CompletedCheckpoint
from dstl.spi import CorruptedError, InvalidHandleError, StorageError, load_storage
from tests.backend.helpers import restored_counts
from tests.backend.test_coordinator import run_job


@pytest.fixture
def finished_job(tmp_path):
    """A job of 25 checkpoints (materialized every 10), closed; returns (config, dir, expected)."""
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    checkpoints_dir = (tmp_path / "chk").as_uri()
    storage, _, backend, expected = run_job(config, checkpoints_dir, checkpoints=25, every=10)
    backend.close()
    storage.close()
    return config, checkpoints_dir, expected


def _metadata(tmp_path, checkpoint_id):
    return tmp_path / "chk" / "job" / "checkpoints" / f"chk-{checkpoint_id:012d}.json"


def _restored_values(config, checkpoints_dir, checkpoint):
    with load_storage(config, job_id="job") as storage:
        return restored_counts(storage, checkpoints_dir, checkpoint.snapshots["op/0"], config, epoch=7)


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_a_damaged_latest_checkpoint_fails_recovery_naming_file_and_setting(finished_job, tmp_path, damage):
    config, checkpoints_dir, expected = finished_job
    latest = _metadata(tmp_path, 25)
    original = latest.read_bytes()
    latest.write_bytes(
        {"truncate": original[: len(original) // 2], "empty": b"", "garbage": b"\xff\xfe"}[damage]
    )
    snapshots_before = sorted((tmp_path / "chk").rglob("*.snap"))
    coordinator = CheckpointCoordinator(checkpoints_dir, "job", num_retained=2, config=config)
    with pytest.raises(CorruptedError) as info:
        coordinator.recover()
    assert info.value.location.endswith("chk-000000000025.json")
    assert "state.checkpoints.on-damaged=previous" in str(info.value)
    assert sorted((tmp_path / "chk").rglob("*.snap")) == snapshots_before, "deleted as orphans"
    # Repaired, the checkpoint restores in full: nothing it references was deleted.
    latest.write_bytes(original)
    repaired = CheckpointCoordinator(checkpoints_dir, "job", num_retained=2, config=config).recover()
    assert repaired.checkpoint_id == 25
    assert _restored_values(config, checkpoints_dir, repaired) == expected


def test_previous_rolls_back_explicitly_and_deletes_nothing(finished_job, tmp_path, caplog):
    config, checkpoints_dir, _ = finished_job
    latest = _metadata(tmp_path, 25)
    original = latest.read_bytes()
    latest.write_bytes(original[:10])
    snapshots_before = sorted((tmp_path / "chk").rglob("*.snap"))
    coordinator = CheckpointCoordinator(
        checkpoints_dir, "job", num_retained=2, config=config, on_damaged="previous"
    )
    recovered = coordinator.recover()
    assert recovered.checkpoint_id == 24
    assert coordinator.rolled_back_from == 25
    assert "ROLLBACK" in caplog.text and "chk-000000000025.json" in caplog.text
    assert sorted((tmp_path / "chk").rglob("*.snap")) == snapshots_before
    assert latest.exists(), "the damaged document was removed"


def test_num_retained_one_and_a_damaged_latest_is_not_an_empty_start(finished_job, tmp_path):
    config, checkpoints_dir, _ = finished_job
    _metadata(tmp_path, 24).unlink()
    _metadata(tmp_path, 25).write_text("")
    with pytest.raises(CorruptedError, match="continue from no checkpoint"):
        CheckpointCoordinator(checkpoints_dir, "job", num_retained=1, config=config).recover()


def test_a_document_whose_id_disagrees_with_its_file_name_is_damaged(finished_job, tmp_path):
    config, checkpoints_dir, _ = finished_job
    # An older document copied over checkpoint 25's file (it says it is 24).
    _metadata(tmp_path, 25).write_bytes(_metadata(tmp_path, 24).read_bytes())
    with pytest.raises(CorruptedError, match="it says it is checkpoint 24"):
        CheckpointCoordinator(checkpoints_dir, "job", num_retained=2, config=config).recover()


def test_a_forged_snapshot_ref_cannot_delete_another_jobs_files(tmp_path, memory_config):
    root = tmp_path / "chk"
    victim = root / "otherjob" / "checkpoints" / "chk-000000000005.json"
    victim.parent.mkdir(parents=True)
    victim.write_text("{}")
    coordinator = CheckpointCoordinator(root.as_uri(), "job", num_retained=1, config=memory_config)
    forged = BackendSnapshot.from_dict(
        {
            "checkpoint_id": 1,
            "handles": [],
            "materialized": [
                {
                    "path": "otherjob/checkpoints/chk-000000000005.json",
                    "key_groups": [0, 128],
                    "sqn": 0,
                    "size": 2,
                }
            ],
        }
    )
    coordinator.complete(1, {"op/0": forged})
    coordinator.complete(2, {})
    assert victim.exists(), "the coordinator deleted another job's file"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        (b'{"version": 1, "checkpoint_id": 1, "snapshots": {"\xff": 1}}', "not UTF-8"),
        ('{"version": 1, "checkpoint_id": true, "snapshots": {}}', "checkpoint_id"),
        ('{"version": 1, "checkpoint_id": -1, "snapshots": {}}', "non-negative"),
        ('{"checkpoint_id": 1, "snapshots": {}}', "version"),
        ('{"version": 1, "checkpoint_id": 1, "checkpoint_id": 2, "snapshots": {}}', "duplicate key"),
        ('{"version": 1, "checkpoint_id": 1, "snapshots": {}, "pad": "' + "x" * (20 << 20) + '"}', "bytes"),
        (
            '{"version": 1, "checkpoint_id": 1, "snapshots": {"a": {"checkpoint_id": -5, "handles": []}}}',
            "-5",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "checkpoint_id": 1,
                    "snapshots": {
                        "a": {
                            "checkpoint_id": 1,
                            "handles": [],
                            "materialized": [{"path": 7, "key_groups": [0, 1], "sqn": 0, "size": 1}],
                        }
                    },
                }
            ),
            "path must be a string",
        ),
    ],
)
def test_checkpoint_documents_are_validated_strictly(text, says):
    with pytest.raises(InvalidHandleError, match=says):
        CompletedCheckpoint.from_json(text)


def test_a_full_checkpoint_directory_is_a_storage_error(small_tmpfs):
    coordinator = CheckpointCoordinator(small_tmpfs.as_uri(), "job", num_retained=1)
    (small_tmpfs / "filler").write_bytes(b"\0" * ((2 << 20) - 8192))
    big = BackendSnapshot.from_dict({"checkpoint_id": 1, "handles": []})
    with pytest.raises(StorageError, match="not completed") as info:
        for checkpoint_id in range(1, 2000):
            coordinator.complete(checkpoint_id, {f"op/{n}-{uuid.uuid4().hex}": big for n in range(200)})
    assert info.value.retriable
    assert not list((small_tmpfs / "job" / "checkpoints").glob(".tmp-*"))


def test_time_progress_round_trips_and_documents_without_it_still_read():
    from dstl.backend.checkpoints import TimeProgress

    completed = CompletedCheckpoint(3, {}, TimeProgress(36_000, {"kg0-64": 41_000}, 30_000))
    again = CompletedCheckpoint.from_json(completed.to_json())
    assert again.time == TimeProgress(36_000, {"kg0-64": 41_000}, 30_000)
    before_late = json.loads(completed.to_json())
    del before_late["time"]["late_watermark_ms"]  # a release before Spark's late-row rule: reads as None
    assert CompletedCheckpoint.from_json(json.dumps(before_late)).time.late_watermark_ms is None
    earlier = json.loads(completed.to_json())
    del earlier["time"]  # written by a release before timers
    assert CompletedCheckpoint.from_json(json.dumps(earlier)).time == TimeProgress()


@pytest.mark.parametrize(
    "time_doc",
    [
        "soon",
        {"watermark_ms": "0", "next_timers": {}},
        {"watermark_ms": True, "next_timers": {}},
        {"watermark_ms": 1 << 63, "next_timers": {}},
        {"watermark_ms": 0, "next_timers": {"kg0-64": 1.5}},
        {"watermark_ms": 0, "next_timers": {"": 5}},
        {"watermark_ms": 0, "next_timers": {"kg0-64": -(1 << 63)}},
        {"watermark_ms": 0},
        {"next_timers": {}},  # no watermark_ms: was a KeyError in recover(), inspect and savepoints
        {"watermark_ms": 0, "next_timers": {}, "late_watermark_ms": "0"},
        {"watermark_ms": 0, "next_timers": {}, "late_watermark_ms": False},
        {"watermark_ms": 0, "next_timers": {}, "late_watermark_ms": 1 << 63},
    ],
)
def test_a_forged_time_field_is_refused_naming_it(time_doc):
    doc = json.loads(CompletedCheckpoint(3, {}).to_json())
    doc["time"] = time_doc
    with pytest.raises(InvalidHandleError, match="'time'"):
        CompletedCheckpoint.from_json(json.dumps(doc))


def test_after_a_rollback_nothing_the_damaged_checkpoint_needs_is_deleted_until_it_is_gone(
    finished_job, tmp_path
):
    config, checkpoints_dir, expected = finished_job
    latest = _metadata(tmp_path, 25)
    original = latest.read_bytes()
    latest.write_bytes(original[:10])
    coordinator = CheckpointCoordinator(
        checkpoints_dir,
        "job",
        num_retained=1,
        config=config,
        on_damaged="previous",
        orphan_interval=0.0,  # collect at every completion
        orphan_grace=60.0,
    )
    base = coordinator.recover()
    assert base.checkpoint_id == 24
    # The job goes on from 24 (Spark's own batch ids run ahead): completions subsume and collect.
    for checkpoint_id in (30, 31, 32):
        coordinator.complete(checkpoint_id, base.snapshots)
    assert coordinator.collect_orphans() == 0
    # Repaired, checkpoint 25 still restores in full.
    latest.write_bytes(original)
    repaired = CompletedCheckpoint.from_json(latest.read_bytes())
    assert _restored_values(config, checkpoints_dir, repaired) == expected
    # Once the damaged document is gone, collection resumes.
    latest.unlink()
    coordinator.collect_orphans()
    assert not coordinator._damage_pending()


def _state_dir(where, tmp_path, request):
    local = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    if where == "file":
        return (tmp_path / "state").as_uri(), local
    s3 = request.getfixturevalue("s3_endpoint")
    options = {
        "state.checkpoints.storage-options.key": s3.access_key,
        "state.checkpoints.storage-options.secret": s3.secret_key,
        "state.checkpoints.storage-options.client_kwargs": json.dumps({"endpoint_url": s3.url}),
    }
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log"), **options}
    return f"s3://{s3.bucket}/lease-{uuid.uuid4().hex[:8]}", config


@pytest.mark.parametrize("where", ["file", "s3"])
def test_a_second_driver_on_one_state_directory_fences_the_first(tmp_path, request, where):
    from dstl.spi import FencedError

    directory, config = _state_dir(where, tmp_path, request)
    old = CheckpointCoordinator(directory, "job", config=config, num_retained=2)
    old.recover()
    old.complete(1, {})
    new = CheckpointCoordinator(directory, "job", config=config, num_retained=2)
    assert new.recover().checkpoint_id == 1
    assert new.generation > old.generation
    with pytest.raises(FencedError, match="another driver of job job"):
        old.complete(2, {})
    new.complete(2, {})
    # even a driver that never took the lease cannot overwrite a document
    stray = CheckpointCoordinator(directory, "job", config=config, num_retained=2)
    with pytest.raises(FencedError, match="exists already"):
        stray.complete(2, {})
    third = CheckpointCoordinator(directory, "job", config=config, num_retained=2)
    assert third.recover().checkpoint_id == 2 and third.generation == new.generation + 1


def test_driver_generations_continue_from_the_run_counter_of_earlier_releases(tmp_path, memory_config):
    (tmp_path / "state" / "job").mkdir(parents=True)
    (tmp_path / "state" / "job" / "runs").write_text("41")
    coordinator = CheckpointCoordinator((tmp_path / "state").as_uri(), "job", config=memory_config)
    coordinator.recover()
    assert coordinator.generation == 42
