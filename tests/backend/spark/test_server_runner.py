"""The Connect side of a query: the pickled ``foreachBatch`` function and the progress records."""

from __future__ import annotations

import pickle
import threading

import pytest

from dstl.backend.spark._private.runner import QuerySpec
from dstl.backend.spark._private.server_runner import KEPT_RECORDS, ProgressRecords, ServerSideRunner
from dstl.backend.spark.progress import BatchProgress
from dstl.spi import Config, InvalidHandleError


def progress_of(batch_id: int) -> BatchProgress:
    return BatchProgress.from_instances(batch_id, [], 1234, 56.5, {"plan": 1.5}, 99, (7, 8192))


def test_records_read_back_as_written_and_only_the_newest_are_kept(tmp_path):
    records = ProgressRecords(str(tmp_path), "job")
    for batch_id in range(KEPT_RECORDS + 5):
        records.write(progress_of(batch_id))
    reader = ProgressRecords(str(tmp_path), "job")  # another process: nothing cached
    assert reader.read(KEPT_RECORDS + 4) == progress_of(KEPT_RECORDS + 4)
    assert reader.read(5) == progress_of(5)
    assert [reader.read(batch_id) for batch_id in range(5)] == [None] * 5
    assert len(list((tmp_path / "job" / "progress").iterdir())) == KEPT_RECORDS


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"batch_id": 3}', "lacks"),
        (progress_of(3).to_json().replace('"rows"', '"rowz"').encode(), "unknown fields"),
        (progress_of(3).to_json().replace('"rows": 0', '"rows": "many"').encode(), "'rows' is 'many'"),
        (progress_of(3).to_json().replace('"materialized": []', '"materialized": [1]').encode(), "not tuple"),
        (b" " * (2 << 20), "more than"),
    ],
)
def test_a_damaged_record_is_an_error_naming_the_file(tmp_path, content, problem):
    ProgressRecords(str(tmp_path), "job").write(progress_of(3))
    (tmp_path / "job" / "progress" / "3.json").write_bytes(content)
    with pytest.raises(InvalidHandleError, match=problem) as raised:
        ProgressRecords(str(tmp_path), "job").read(3)
    assert "3.json" in str(raised.value)


class HoldsALock:
    """Stands for a built runner: locks cannot be pickled."""

    lock = threading.Lock()


def test_the_function_is_pickled_without_the_runner_it_built():
    spec = QuerySpec("job", "stateful", ("user",), "user string", dict, print)
    function = ServerSideRunner(Config({"dstl.storage": "local"}), spec)
    function._runner = HoldsALock()  # type: ignore[assignment]
    copy = pickle.loads(pickle.dumps(function))
    assert copy._runner is None
    assert copy._spec == spec
    assert copy._config == {"dstl.storage": "local"}
