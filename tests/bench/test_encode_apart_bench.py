"""bench.encode_apart_bench at a small size: both modes snapshot the same state, figures written."""

import json


def test_both_modes_snapshot_the_same_state_and_write_their_figures(tmp_path):
    from bench.encode_apart_bench import main

    figures, plot = tmp_path / "apart.json", tmp_path / "apart.png"
    assert (
        main(
            [
                "--keys",
                "30000",
                "--batch-keys",
                "2000",
                "--heap-mb",
                "4",
                "--json",
                str(figures),
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    results = {result["mode"]: result for result in json.loads(figures.read_text())["results"]}
    assert set(results) == {"in the task's process", "encoder process"}
    here, apart = results["in the task's process"], results["encoder process"]
    # the same seeded batches before each snapshot: the same state, the same object
    assert here["snapshot_mb"] == apart["snapshot_mb"] > 0
    assert all(result["batch_alone_p50_ms"] > 0 and result["snapshot_s"] > 0 for result in results.values())
    assert plot.stat().st_size > 0
