"""The local-cluster helpers of the benches: a stopped application leaves nothing in pyspark's work dir."""

import uuid
from pathlib import Path

import pyspark

from bench.spark_cluster import remove_executor_dirs


def test_a_stopped_applications_executor_dirs_are_removed_and_no_other():
    work = Path(pyspark.__file__).parent / "work"
    app, other = f"app-test-{uuid.uuid4().hex[:8]}", f"app-test-{uuid.uuid4().hex[:8]}"
    copy = work / app / "0" / "dstl-wc" / "state"
    copy.mkdir(parents=True)
    (copy / "data.mdb").write_bytes(b"x" * 1024)
    (work / other).mkdir()
    try:
        remove_executor_dirs(app)
        remove_executor_dirs(None)  # a session that never started: nothing to do
        assert not (work / app).exists() and (work / other).is_dir()
    finally:
        remove_executor_dirs(other)
    assert not (work / other).exists()
