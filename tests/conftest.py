"""Shared fixtures; service fixtures live in tests/fixtures and are registered here."""

from __future__ import annotations

import uuid

import pytest

pytest_plugins = [
    "tests.fixtures.thirdparty",
    "tests.fixtures.s3",
    "tests.fixtures.kafka",
    "tests.fixtures.spark",
    "tests.fixtures.docker",
    "tests.fixtures.disk",
]


@pytest.fixture
def memory_config() -> dict[str, str]:
    """Config of the memory storage in a namespace no other test uses."""
    return {"dstl.storage": "memory", "dstl.memory.namespace": f"test-{uuid.uuid4().hex}"}
