"""Savepoint documents are untrusted: adopting one writes only under the job's own snapshots."""

import json

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.materialization import MaterializationRef
from dstl.backend.savepoints import SAVEPOINT_FILE, Savepoint, adopt_savepoint
from dstl.spi import KeyGroupRange


def test_an_instance_name_cannot_steer_where_the_copy_is_written(tmp_path):
    source = tmp_path / "savepoint"
    (source / "demo" / "snapshots").mkdir(parents=True)
    (source / "demo" / "snapshots" / "a.snap").write_bytes(b"snapshot bytes")
    ref = MaterializationRef("demo/snapshots/a.snap", KeyGroupRange(0, 128), 1, 14, 1)
    forged = Savepoint("demo", 7, 128, {"../../../escaped": BackendSnapshot(7, (), (ref,))})
    (source / SAVEPOINT_FILE).write_text(forged.to_json())
    assert json.loads((source / SAVEPOINT_FILE).read_text())["checkpoint"]["snapshots"]

    target = tmp_path / "job-state"
    adopted = adopt_savepoint(str(source), target.as_uri(), "job", 128)
    (copied,) = adopted.snapshots["../../../escaped"].materialized
    assert copied.path.startswith("job/snapshots/savepoint-7-")
    assert (target / copied.path).read_bytes() == b"snapshot bytes"
    assert not list(tmp_path.rglob("escaped*"))
