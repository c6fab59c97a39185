"""Metrics: the required counters exist and move."""

from __future__ import annotations

import os

from dstl.conformance.testing import persist
from dstl.spi import REQUIRED_COUNTERS, KeyGroupRange


def test_required_counters_exist(storage):
    counters = storage.metrics.counters()
    missing = [name for name in REQUIRED_COUNTERS if name not in counters]
    assert not missing, f"missing counters: {missing}"


def test_counters_move(storage, sut):
    writer = storage.create_writer("op", KeyGroupRange(0, 2))
    before = storage.metrics.counters()
    writer.append(0, os.urandom(100))  # incompressible: what is uploaded is at least what was written
    writer.append(1, b"y")
    handle = persist(writer, 0, 1, sut.timeout)
    after = storage.metrics.counters()
    assert after["appends"] - before["appends"] == 2
    assert after["persists"] - before["persists"] == 1
    assert after["uploads"] > before["uploads"]
    assert after["uploaded_bytes"] - before["uploaded_bytes"] >= 101
    storage.discard([handle])
    assert storage.metrics.counter("discarded_change_sets") > before["discarded_change_sets"]
