"""Storage configs the backend tests run on: fast tier and integration tier."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(params=["memory", "local", "filesystem"])
def storage_config(request, tmp_path):
    """Config of each in-process storage (fast tier)."""
    if request.param == "memory":
        return {"dstl.storage": "memory", "dstl.memory.namespace": f"b-{uuid.uuid4().hex}"}
    if request.param == "local":
        return {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "local")}
    return {"dstl.storage": "filesystem", "dstl.dfs.base-path": (tmp_path / "dfs").as_uri()}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.slow) for name in ("kafka", "s3")])
def service_storage_config(request):
    """Config of the storages on real services: Kafka (Tansu) and S3 (moto) (integration tier)."""
    return request.getfixturevalue("kafka_config" if request.param == "kafka" else "s3_config")


@pytest.fixture
def spawned(monkeypatch):
    """The snapshot encoder processes started (their command lines)."""
    from dstl.backend.changelog import snapshot_encoding

    commands = []
    real = snapshot_encoding.subprocess.Popen

    def counted(command, *args, **kwargs):
        commands.append(command)
        return real(command, *args, **kwargs)

    monkeypatch.setattr(snapshot_encoding.subprocess, "Popen", counted)
    return commands
