"""bench.bulk_state_bench at a small size: the batch's phases beside the store's floor and after a restore."""

import json


def test_the_batch_and_the_store_floor_are_measured_over_the_same_keys(tmp_path):
    from bench.bulk_state_bench import AFTER_RESTORE, FLOOR_PHASES, PHASES, main

    figures, table, plot = tmp_path / "bulk.json", tmp_path / "bulk.md", tmp_path / "bulk.png"
    arguments = ["--state-keys", "3000,6000", "--batch-keys", "2000"]
    assert main([*arguments, "--json", str(figures), "--markdown", str(table), "--plot", str(plot)]) == 0
    results = json.loads(figures.read_text())["results"]
    assert [r["state_keys"] for r in results] == [3000, 6000]
    for result in results:
        assert result["exact"], "the batch's counts did not read back as written"
        assert set(result["phases_ms"]) == set(PHASES) and set(result["floor_ms"]) == set(FLOOR_PHASES)
        assert all(ms > 0 for ms in [*result["phases_ms"].values(), *result["floor_ms"].values()])
        # the restored copy's batches read every key back (exact covers them too)
        assert result["restore_s"] > 0 and len(result["after_restore_ms"]) == AFTER_RESTORE
        assert all(set(after) == set(PHASES) for after in result["after_restore_ms"])
    assert table.read_text().count("\n| 3,000 |") == 1 and plot.stat().st_size > 1000
