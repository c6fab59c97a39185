"""An instance's kept output: replayed for its own batch only, read back as untrusted bytes."""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import replace

import pyarrow as pa
import pytest

from dstl.backend.spark._private.kept_output import (
    KEPT_OUTPUT_FILE,
    KeptKey,
    _compressed,
    keep_output,
    kept_output,
)
from dstl.spi import DstlError

KEY = KeptKey(run_id=7, batch_id=3, plan_digest="abc")
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("__dstl_report", pa.string())])


def _batch(rows: int = 5) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([f"k{i}" for i in range(rows)]), pa.array(range(rows)), pa.nulls(rows, pa.string())],
        schema=SCHEMA,
    )


def _stream(batch: pa.RecordBatch, **options) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _schema_only() -> bytes:
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, SCHEMA).close()
    return sink.getvalue().to_pybytes()


def _file(record: bytes, stream: bytes) -> bytes:
    return struct.pack("<I", len(record)) + record + stream


def test_the_kept_output_is_replayed_for_its_own_batch(tmp_path):
    batches = [_batch(5), _batch(2)]
    keep_output(tmp_path, KEY, batches, '{"report": 1}')
    replayed, report = kept_output(tmp_path, KEY, SCHEMA)
    assert report == '{"report": 1}'
    assert [b.to_pydict() for b in replayed] == [b.to_pydict() for b in batches]


@pytest.mark.parametrize(
    "other",
    [KeptKey(8, 3, "abc"), KeptKey(7, 4, "abc"), KeptKey(7, 3, "abd")],
    ids=["another run", "another batch", "another instance plan"],
)
def test_another_batchs_output_is_not_replayed_and_is_no_warning(tmp_path, caplog, other):
    keep_output(tmp_path, KEY, [_batch()], "{}")
    with caplog.at_level(logging.WARNING):
        assert kept_output(tmp_path, other, SCHEMA) is None
        assert kept_output(tmp_path / "missing", KEY, SCHEMA) is None
    assert not caplog.records


def _record(key: KeptKey = KEY) -> bytes:
    return b'{"run": %d, "batch": %d, "plan": "%s", "report": "{}"}' % (
        key.run_id,
        key.batch_id,
        key.plan_digest.encode(),
    )


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"", "no record"),
        (b"\xff\xff\xff\x7fjunk", "no record"),
        (_file(b"[1, 2", _stream(_batch())), "not valid JSON"),
        (_file(b'{"run": 7}', _stream(_batch())), "damaged record"),
        (_file(_record(), b"not arrow at all"), "damaged Arrow stream"),
        (_file(_record(), _stream(_batch())[:-100]), "damaged Arrow stream"),
        (_file(_record(), _stream(_batch(), compression="zstd")), "not an uncompressed record batch"),
        (_file(_record(), _stream(pa.record_batch({"k": ["a"]}))), "is not the output's"),
        (_file(_record(), _schema_only()), "no record batch"),
    ],
    ids=[
        "empty",
        "huge record",
        "bad json",
        "record",
        "not arrow",
        "truncated",
        "compressed",
        "schema",
        "no batch",
    ],
)
def test_a_damaged_or_hostile_file_is_ignored_with_a_warning_naming_it(tmp_path, caplog, content, named):
    (tmp_path / KEPT_OUTPUT_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert kept_output(tmp_path, KEY, SCHEMA) is None
    assert any(
        named in record.getMessage() and KEPT_OUTPUT_FILE in record.getMessage() for record in caplog.records
    )


def test_a_compressed_body_is_refused_before_it_is_decoded():
    """Only an uncompressed body's decoded size is bounded by the bytes stored."""
    plain, packed = _stream(_batch(1000)), _stream(_batch(1000), compression="zstd")
    kinds = {}
    for name, data in (("plain", plain), ("zstd", packed)):
        for message in pa.ipc.MessageReader.open_stream(pa.BufferReader(data)):
            kinds[name, message.type] = _compressed(message.metadata.to_pybytes())
    assert kinds == {
        ("plain", "schema"): True,  # no record batch: refused too
        ("plain", "record batch"): False,
        ("zstd", "schema"): True,
        ("zstd", "record batch"): True,
    }
    for garbage in (b"", b"\x00", b"\xff" * 64, struct.pack("<I", 1 << 30) + b"\x00" * 12):
        assert _compressed(garbage)


def test_a_link_or_fifo_in_its_place_is_never_followed(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "secret"
    target.write_bytes(_file(_record(), _stream(_batch())))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / KEPT_OUTPUT_FILE).symlink_to(target)
    with caplog.at_level(logging.WARNING):
        assert kept_output(copy, KEY, SCHEMA) is None
    (copy / KEPT_OUTPUT_FILE).unlink()
    os.mkfifo(copy / KEPT_OUTPUT_FILE)  # would block a plain open
    with caplog.at_level(logging.WARNING):
        assert kept_output(copy, KEY, SCHEMA) is None
    assert len(caplog.records) == 2


def test_keeping_never_writes_through_a_link(tmp_path):
    outside = tmp_path / "outside"
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / KEPT_OUTPUT_FILE).with_suffix(f".tmp{os.getpid()}").symlink_to(outside)
    with pytest.raises(DstlError, match="not a regular file: remove it"):
        keep_output(copy, KEY, [_batch()], "{}")
    assert not outside.exists()


def test_the_key_names_the_run_the_batch_and_the_instances_own_plan():
    from dstl.backend.spark._private.protocol import InstancePlan, TaskPlan

    def plan(run_id=1, batch_id=2, materialize=False):
        instances = {0: InstancePlan(materialize=materialize).to_json()}
        return TaskPlan({}, "job", "op", ("k",), ("k",), 2, 128, batch_id, run_id, "/w", instances)

    first = plan()
    key = KeptKey.of(first, 0)
    assert key == KeptKey.of(first, 0) == KeptKey.of(replace(first, standbys={0: (1,)}), 0)
    assert KeptKey.of(first, 1) not in (key, None)  # an instance without a plan of its own
    assert KeptKey.of(first, 1) == KeptKey.of(first, 1)
    others = [
        KeptKey.of(plan(run_id=3), 0),
        KeptKey.of(plan(batch_id=3), 0),
        KeptKey.of(plan(materialize=True), 0),
        # the same run, batch and instance plan in another query sharing the working directory
        # (another checkpoint location of the job, or the same one recreated): never replayed
        KeptKey.of(plan(), 0),
    ]
    assert key not in others and len(set(others)) == 4


def test_an_output_that_cannot_be_kept_is_a_warning_not_a_failed_task(tmp_path, caplog):
    gone = tmp_path / "removed-copy"  # the write fails (no such directory): an OSError like a full disk
    with caplog.at_level(logging.WARNING):
        keep_output(gone, KEY, [_batch()], "{}")
    assert any("could not keep the output" in record.getMessage() for record in caplog.records)
    assert kept_output(gone, KEY, SCHEMA) is None


def test_a_query_never_replays_the_output_another_query_of_the_job_kept_in_the_shared_working_dir(
    spark, tmp_path
):
    """Two fresh checkpoint locations of one job, one working dir: both first batches have the same
    run, batch and (empty) instance plans. The second query must compute its own output."""
    from dstl.backend.spark.demo.pipeline import write_input_file
    from tests.backend.spark.test_query import ROWS, assert_exact, local_config, run

    config = local_config(tmp_path)  # one working dir for both
    first, second = tmp_path / "first", tmp_path / "second"
    write_input_file(first / "input", 0, ROWS // 2)  # other rows than the second query's first file
    run(spark, first, config, 1)
    run(spark, second, config, 2)
    assert_exact(spark, second)
