"""fsspec storage options reach every file system of state checkpoints (no environment needed)."""

import json
import uuid

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.checkpoints import CheckpointCoordinator
from dstl.backend.filesystems import checkpoint_fs, put_local_file
from dstl.spi import Config, KeyGroupRange, load_storage


def test_options_under_a_prefix_parse_json_values():
    config = Config(
        {
            "state.checkpoints.storage-options.anon": "true",
            "state.checkpoints.storage-options.client_kwargs": '{"endpoint_url": "http://127.0.0.1:9"}',
            "state.checkpoints.storage-options.profile": "dev",
        }
    )
    assert config.options_under("state.checkpoints.storage-options.") == {
        "anon": True,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "profile": "dev",
    }


def test_checkpoint_fs_passes_them_to_fsspec(tmp_path):
    fs, _ = checkpoint_fs(tmp_path.as_uri(), {"state.checkpoints.storage-options.auto_mkdir": "true"})
    assert fs.auto_mkdir is True


@pytest.mark.timeout(120)
def test_snapshots_and_checkpoints_on_s3_with_only_storage_options(s3_endpoint, tmp_path, monkeypatch):
    """The endpoint and keys come from the config: the environment has none (AWS would be asked)."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    prefix = f"opts-{uuid.uuid4().hex[:8]}"
    options = {
        "state.checkpoints.dir": f"s3://{s3_endpoint.bucket}/{prefix}",
        "state.checkpoints.storage-options.key": s3_endpoint.access_key,
        "state.checkpoints.storage-options.secret": s3_endpoint.secret_key,
        "state.checkpoints.storage-options.client_kwargs": json.dumps({"endpoint_url": s3_endpoint.url}),
    }
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log"), **options}
    with load_storage(config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend.from_config(storage, "op", KeyGroupRange(0, 128), config)
        counts = backend.value_state("counts")
        for n in range(50):
            backend.set_current_key(n)
            counts.update(n)
        backend.materialize().result(timeout=60)
        snapshot = backend.checkpoint(1).result(timeout=60)
        coordinator = CheckpointCoordinator(options["state.checkpoints.dir"], "job", config=config)
        coordinator.complete(1, {"op/0": snapshot})
        backend.close()
    keys = [
        item["Key"]
        for item in s3_endpoint.client().list_objects_v2(Bucket=s3_endpoint.bucket, Prefix=prefix)["Contents"]
    ]
    assert any(key.endswith(".snap") for key in keys), keys
    assert any("/checkpoints/chk-" in key for key in keys), keys


def test_a_local_file_is_renamed_into_a_local_directory(tmp_path):
    fs, root = checkpoint_fs((tmp_path / "snapshots").as_uri())
    fs.makedirs(root, exist_ok=True)
    source = tmp_path / "encoded.part"
    source.write_bytes(b"snapshot bytes")
    inode = source.stat().st_ino
    put_local_file(fs, str(source), f"{root}/a.snap")
    placed = tmp_path / "snapshots" / "a.snap"
    assert placed.read_bytes() == b"snapshot bytes" and placed.stat().st_ino == inode  # moved, not copied
    assert not source.exists()


@pytest.mark.timeout(120)
def test_a_local_file_is_uploaded_to_s3_and_removed_here(s3_endpoint, tmp_path):
    prefix = f"put-{uuid.uuid4().hex[:8]}"
    fs, root = checkpoint_fs(
        f"s3://{s3_endpoint.bucket}/{prefix}",
        {
            "state.checkpoints.storage-options.key": s3_endpoint.access_key,
            "state.checkpoints.storage-options.secret": s3_endpoint.secret_key,
            "state.checkpoints.storage-options.client_kwargs": json.dumps({"endpoint_url": s3_endpoint.url}),
        },
    )
    source = tmp_path / "encoded.part"
    source.write_bytes(b"snapshot bytes")
    put_local_file(fs, str(source), f"{root}/a.snap")
    body = s3_endpoint.client().get_object(Bucket=s3_endpoint.bucket, Key=f"{prefix}/a.snap")["Body"].read()
    assert body == b"snapshot bytes" and not source.exists()
