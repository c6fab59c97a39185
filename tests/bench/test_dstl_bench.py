"""The benchmark harness runs and writes its report (no timing is asserted here)."""

from bench.dstl_bench import main, percentile


def test_percentile_nearest_rank():
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 50) == 50.0
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 99.9) == 100.0
    assert percentile([3.0], 90) == 3.0


def test_quick_run_writes_report_and_plot(tmp_path):
    assert main(["--quick", "--storage", "local", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "dstl-bench-local.md").read_text()
    assert "## Append throughput" in report and "## Persist latency (ms)" in report
    assert "100 B x 1 writer(s)" in report and "p99/floor p99" in report
    assert (tmp_path / "dstl-bench-local.png").stat().st_size > 1000


def test_dfs_bench_quick_run_writes_report(tmp_path):
    from bench.dfs_bench import main as dfs_main

    assert dfs_main(["--quick", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "dfs-bench-s3.md").read_text()
    assert "raw put_object" in report and "retry-policy=none" in report and "p99.9" in report


def test_quick_run_on_kafka_uses_the_produce_floor(tmp_path):
    assert main(["--quick", "--storage", "kafka", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "dstl-bench-kafka.md").read_text()
    assert "floor: raw produce+flush" in report


def test_backend_bench_quick_run_compares_three_configurations(tmp_path):
    from bench.backend_bench import main as backend_main

    assert backend_main(["--quick", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "backend-bench.md").read_text()
    for row in ("| changelog |", "| full snapshot |", "| incremental snapshot |"):
        assert row in report
    assert "lower than full snapshots" in report
    assert (tmp_path / "backend-bench.png").stat().st_size > 1000


def test_spark_bench_measures_the_warm_path(spark, tmp_path):
    from bench.spark_bench import measure

    progress = measure(spark, 3000, 200, 3, tmp_path)
    assert [p.keys_touched for p in progress] == [3000, 200, 200, 200]
    assert all(p.warm_instances == p.instances for p in progress[1:]), (
        "later batches must reuse working copies"
    )
    # Warm: nothing read back (a time bound here would only measure the machine's load).
    assert all(
        p.restored_bytes == 0 and p.full_restores == 0 and p.checkpoint_ms > 0 for p in progress[1:]
    ), progress


def test_paper_bench_small_preset_reports_every_configuration_and_target(tmp_path):
    from bench.paper_bench import CONFIGURATIONS
    from bench.paper_bench import main as paper_main

    assert paper_main(["--preset", "small", "--no-spark", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "paper-small.md").read_text()
    for workload in ("## value", "## window"):
        assert workload in report
    for configuration in CONFIGURATIONS:
        assert report.count(f"| {configuration} |") == 2, configuration
    assert "recovery" in report and ("MET" in report)
    assert (tmp_path / "paper-small.png").stat().st_size > 1000


def test_spark_stores_comparison_runs_the_same_job_on_every_engine(spark, tmp_path):
    from bench.spark_stores import compare, speedups

    try:
        results = compare(spark, tmp_path, batches=2, rows=300)
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    assert [r.key for r in results] == [
        "dstl-batch",
        "dstl-per-key",
        "floor",
        "jvm-count",
        "transformWithState",
        "applyInPandasWithState",
        "transformWithStateInPandas",
    ]
    assert [r.rows for r in results] == [600] * 7
    assert all(len(r.commit_ms) == 2 for r in results)
    figures = results[0].figures()
    for field in (
        "records_per_s",
        "batch_p50_ms",
        "batch_p99_ms",
        "commit_p50_ms",
        "commit_p99_ms",
        "state_bytes",
        "state_disk_bytes",
    ):
        assert figures[field] >= 0, field
    assert len(speedups(results)) == 6  # every goal's engines ran
    stateful = [r for r in results if r.key != "floor"]  # the floor keeps no state
    assert all(r.state_bytes > 0 and r.state_disk_bytes > 0 for r in stateful), [
        (r.engine, r.state_bytes, r.state_disk_bytes) for r in stateful
    ]


def test_kafka_fencing_bench_compares_the_designs(tmp_path):
    from bench.kafka_fencing import main as fencing_main

    assert fencing_main(["--quick", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "kafka-fencing.md").read_text()
    for design in ("raw produce+flush", "transaction per persist", "claims end offset", "dstl persist"):
        assert f"| {design}" in report
    assert "measured persists: 0" in report  # its partition is its own: no request
    assert "| fresh producer per claim | 10 |" in report and "| kept producer | 10 |" in report


def test_lmdb_materialization_and_restore_memory_do_not_grow_with_the_state():
    """Streamed materialization holds a section, not the state: peak anonymous memory stays flat."""
    from bench.scale_bench import CHECKPOINTS, UPDATES_PER_CHECKPOINT, run_probe

    mb = 1 << 20
    small, large = run_probe("lmdb", 100_000), run_probe("lmdb", 800_000)
    maps = run_probe("lmdb", 400_000, map_entries=100_000)  # 4 maps of 100k entries: each in parts
    updates = CHECKPOINTS * UPDATES_PER_CHECKPOINT  # inserted by the timed updates, at most
    for figures, keys in ((small, 100_000), (large, 800_000), (maps, 400_000)):
        assert keys <= figures["restored_keys"] <= keys + updates, figures
        assert figures["checkpoint_p99_ms"] > 0 and figures["update_us_per_op"] > 0
    for figures in (small, large, maps):
        # 800k x 200 B is 153 MB of state; the whole-state decode took about 4x that.
        assert figures["materialize_peak_anon"] < 32 * mb, figures
        assert figures["restore_peak_anon"] < 32 * mb, figures
    assert large["materialize_peak_anon"] < small["materialize_peak_anon"] + 8 * mb, (small, large)


def test_spark_figures_verdicts_and_materialization_cost_from_synthetic_runs():
    from bench.spark_stores import StoreResult, materialization_cost, speedups, summary_rows

    dstl = StoreResult("dstl-batch", "dstl batch", batch_ms=[5000, 100, 150, 100, 100], rows=50)
    dstl.batch_rows, dstl.materializing = [10] * 5, [False, False, True, False, False]
    per_key = StoreResult("dstl-per-key", "dstl per key", batch_ms=[900, 300, 300], batch_rows=[10] * 3)
    hdfs = StoreResult("applyInPandasWithState", "HDFS", batch_ms=[100, 500, 500], batch_rows=[10] * 3)
    floor = StoreResult("floor", "floor", batch_ms=[50, 80, 80, 80, 80], batch_rows=[10] * 5)
    rows = StoreResult("transformWithState", "row-based", batch_ms=[100, 400, 400], batch_rows=[10] * 3)
    results = [dstl, per_key, hdfs]
    assert dstl.records_per_s == 40 / 0.45  # the first batch is left out
    assert speedups(results) == [  # only the goals whose baseline ran
        "dstl-batch: 89 records/s = 4.44x applyInPandasWithState's (20); target 5x: NOT MET.",
        "dstl-per-key: 33 records/s = 1.67x applyInPandasWithState's (20); target 2x: NOT MET.",
    ]
    assert speedups([dstl, per_key, floor, rows]) == [
        "dstl-batch: batch p50 100 ms = 1.25x floor's (80 ms); target at most 1.3x: MET.",
        "dstl-batch: 89 records/s = 3.56x transformWithState's (25); target 5x: NOT MET.",
        "dstl-per-key: 33 records/s = 1.33x transformWithState's (25); target 2x: NOT MET.",
    ]
    line = materialization_cost(dstl)
    assert (
        "1 of 4 batches materialized" in line
        and "(1.50x)" in line
        and "the batch after one: p50 100 ms" in line
    )
    assert materialization_cost(hdfs) is None
    assert len(summary_rows(results)) == 3


def test_spark_figures_over_several_runs_and_a_loaded_state():
    from bench.spark_stores import StoreResult, goal_spread, spread_rows

    def run(dstl_ms: float, floor_ms: float) -> list[StoreResult]:
        dstl = StoreResult("dstl-batch", "dstl batch", batch_ms=[9000, 9000, dstl_ms, dstl_ms], warm_up=2)
        floor = StoreResult("floor", "floor", batch_ms=[9000, 9000, floor_ms, floor_ms], warm_up=2)
        for result in (dstl, floor):
            result.batch_rows = [1000, 1000, 10, 10]
        return [dstl, floor]

    runs = [run(100, 100), run(150, 100), run(120, 80)]
    assert runs[0][0].records_per_s == 20 / 0.2  # the loading batches are left out
    assert runs[0][0].figures()["batch_p50_ms"] == 100 and runs[0][0].figures()["warm_up_batches"] == 2
    assert spread_rows(runs) == [
        ["dstl batch", "120 (100-150)", "83 (67-100)"],
        ["floor", "100 (80-100)", "100 (100-125)"],
    ]
    assert goal_spread(runs) == [
        "dstl-batch batch time / floor's: 1.50x (1.00-1.50) over 3 runs; target at most 1.3x: NOT MET."
    ]


def test_inputs_load_the_state_first_then_mostly_update(tmp_path):
    import json

    from bench.spark_stores import write_inputs

    load = write_inputs(tmp_path, batches=2, rows=400, state_keys=1000)
    files = sorted(tmp_path.glob("*.json"))
    keys = [[json.loads(line)["k"] for line in f.read_text().splitlines()] for f in files]
    assert load == 3 and [len(k) for k in keys] == [400, 400, 200, 400, 400]
    loaded = [k for batch in keys[:load] for k in batch]
    assert loaded == [f"k{i}" for i in range(1000)]  # every key once, new
    for batch in keys[load:]:
        updates = sum(int(k[1:]) < 1000 for k in batch)
        assert 0.6 * len(batch) < updates < len(batch)  # mostly updates of loaded keys, some new
    assert write_inputs(tmp_path / "plain", batches=1, rows=10) == 0


def test_random_keys_are_the_same_job_spelled_as_scattered_ids(tmp_path):
    import json

    from bench.spark_stores import write_inputs

    def keys(shape):
        write_inputs(tmp_path / shape, batches=3, rows=300, key_shape=shape)
        files = sorted((tmp_path / shape).glob("*.json"))
        return [json.loads(line)["k"] for f in files for line in f.read_text().splitlines()]

    sequential, scattered = keys("sequential"), keys("random")
    spelled = dict(zip(sequential, scattered, strict=True))
    assert len(set(spelled.values())) == len(spelled), "two keys were spelled alike"
    assert [spelled[k] for k in sequential] == scattered  # the same keys, repeated alike
    assert sorted(scattered[:50]) != scattered[:50], "new keys still come in order"


def test_scale_bench_timer_and_collection_tables_run(tmp_path):
    from bench.scale_bench import main as scale_main

    assert scale_main(["--timers", "200,400", "--delegates", "lmdb,heap", "--results", str(tmp_path)]) == 0
    report = (tmp_path / "scale-timers.md").read_text()
    assert "| lmdb | 400 |" in report and "next expiry ×" in report
    assert scale_main(["--collections", "1000,2000", "--delegates", "heap", "--results", str(tmp_path)]) == 0
    assert "| heap | 2,000 |" in (tmp_path / "scale-collections.md").read_text()


def test_recovery_figures_count_from_the_kill_to_the_batch_where_the_lost_instances_ran_again_and_to_steady():
    from bench.recovery_bench import _summary

    def batch(batch_id, ms, ended, caught_up=0, full=0):
        return {
            "batch_id": batch_id,
            "batch_ms": ms,
            "ended_s": ended,
            "caught_up": caught_up,
            "full_restores": full,
            "state_rows": 10 * batch_id,
        }

    batches = [batch(0, 900, 10.0), batch(1, 100, 11.0), batch(2, 120, 12.0), batch(3, 300, 13.5)]
    batches += [batch(4, 2500, 16.0, full=1), batch(5, 110, 16.2)]
    figures = _summary("kill", {"batches": batches, "at_s": 12.5}, slice(1, 3))
    assert figures["steady_ms"] == 110 and figures["state_rows"] == 50
    assert figures["back_s"] == 3.5 and figures["recovery"]["batch_id"] == 4
    assert figures["after_ms"] == [300, 2500, 110]
    assert figures["steady_again_s"] == 3.7  # batch 5: the first at the steady batch time again
    unmoved = _summary("kill", {"batches": batches[:4], "at_s": 12.5}, slice(1, 3))
    assert unmoved["back_s"] is None and unmoved["steady_again_s"] is None
    slow = batches[:5] + [batch(5, 200, 16.4), batch(6, 137, 16.6)]  # 200 ms is over 1.25x 110 ms
    assert _summary("kill", {"batches": slow, "at_s": 12.5}, slice(1, 3))["steady_again_s"] == 4.1
    recovered_fast = batches[:4] + [batch(4, 130, 16.0, full=1)]  # the moved batch itself is steady
    assert _summary("kill", {"batches": recovered_fast, "at_s": 12.5}, slice(1, 3))["steady_again_s"] == 3.5
    assert "back_s" not in _summary("rescale", {"batches": batches}, slice(1, 3))
