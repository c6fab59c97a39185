"""The working copy's stamp: what it names is trusted only when it is intact."""

import json

import pytest

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.spark._private.working_copy import WorkingCopy, snapshot_digest


@pytest.fixture
def copy(tmp_path):
    return WorkingCopy(tmp_path, "op-kg0-64", map_size=1 << 20)


def test_a_marked_copy_names_its_checkpoint_and_registrations(copy):
    snapshot = BackendSnapshot(7, ())
    copy.mark(snapshot, {"totals": ("value", "msgpack")})
    expected = {"totals": ("value", "msgpack")}
    assert copy.stamp() == {"digest": snapshot_digest(snapshot), "registrations": expected}
    copy.invalidate()
    assert copy.stamp() is None


@pytest.mark.parametrize(
    "registrations",
    [{"totals": 5}, {"totals": ["value"]}, {"totals": ["value", 1]}, {"totals": "value"}, ["totals"]],
)
def test_a_damaged_stamp_means_no_known_checkpoint(copy, registrations):
    copy.mark(BackendSnapshot(7, ()), {"totals": ("value", "msgpack")})
    stamp_file = copy.path / "dstl-stamp.json"
    doc = json.loads(stamp_file.read_text())
    stamp_file.write_text(json.dumps({**doc, "registrations": registrations}))
    assert copy.stamp() is None
    stamp_file.write_text("{not json")
    assert copy.stamp() is None
