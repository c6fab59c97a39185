"""Per-batch figures reach Prometheus under Flink's metric names, over HTTP on loopback."""

import urllib.request

import pytest

from dstl.backend.spark import BatchProgress, PrometheusExporter
from dstl.backend.spark._private.protocol import InstanceStats

pytest.importorskip("prometheus_client")


def _progress(batch_id, **extra):
    stats = [
        {
            "instance": "kg0-64",
            "rows": 10,
            "keys": 4,
            "restore": "warm",
            "materialized": batch_id == 2,
            "restore_ms": 0,
            "checkpoint_ms": 3.5,
            "materialization_ms": 0,
            "persisted_bytes": 700,
            "timers_fired": 2,
            "storage": {"uploads": 1, "persist_failures": 0, "upload_latency_p99_s": 0.004},
            **extra,
        }
    ]
    return BatchProgress.from_instances(
        batch_id, [InstanceStats.from_dict(s) for s in stats], 9_000, 120.0, watermark_ms=42_000
    )


def test_the_exporter_serves_flinks_names_with_the_latest_figures():
    exporter = PrometheusExporter("demo", port=0)
    try:
        for batch_id in (1, 2, 3):
            exporter(_progress(batch_id))
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        exporter.close()
    assert 'dstl_lastCheckpointDuration{query="demo"} 3.5' in text
    assert 'dstl_lastCheckpointSize{query="demo"} 700.0' in text
    assert 'dstl_lastCheckpointFullSize{query="demo"} 9000.0' in text
    assert 'dstl_lastBatchId{query="demo"} 3.0' in text
    assert 'dstl_currentWatermark{query="demo"} 42000.0' in text
    assert 'dstl_uploadLatenciesNanos{query="demo"} 4e+06' in text
    assert 'dstl_numberOfUploadRequests_total{query="demo"} 3.0' in text
    assert 'dstl_numberOfStartedMaterialization_total{query="demo"} 1.0' in text
    assert 'dstl_numberOfTimersFired_total{query="demo"} 6.0' in text
    assert 'dstl_numberOfRecordsIn_total{query="demo"} 30.0' in text
