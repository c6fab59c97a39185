"""Sticky placement: home executors (driver side), and the fallback when the gateway cannot pin."""

import logging

import pytest

from dstl.backend.spark._private import affinity
from dstl.backend.spark._private.affinity import ExecutorHomes
from tests.backend.spark.test_query import assert_exact, local_config, run

A, B, C = ("0", "10.0.0.1"), ("1", "10.0.0.2"), ("2", "10.0.0.3")


def test_instances_are_spread_and_keep_their_home_while_it_lives():
    homes = ExecutorHomes()
    first = homes.assign(4, [A, B])
    assert first == {
        0: "executor_10.0.0.1_0",
        1: "executor_10.0.0.2_1",
        2: "executor_10.0.0.1_0",
        3: "executor_10.0.0.2_1",
    }
    assert homes.assign(4, [B, A]) == first  # the order executors are listed in does not matter
    # A new executor takes no instance away from a live one: moving would cost a restore.
    assert homes.assign(4, [A, B, C]) == first


def test_a_lost_executor_moves_only_its_instances_to_the_least_loaded():
    homes = ExecutorHomes()
    homes.assign(4, [A, B])
    after = homes.assign(4, [A, C])  # B died, C replaced it
    assert after[0] == after[2] == "executor_10.0.0.1_0"
    assert after[1] == after[3] == "executor_10.0.0.3_2"


def test_rescale_and_no_executors():
    homes = ExecutorHomes()
    homes.assign(2, [A, B])
    grown = homes.assign(3, [A, B])
    assert grown[0] == "executor_10.0.0.1_0" and grown[1] == "executor_10.0.0.2_1"
    assert grown[2] in {"executor_10.0.0.1_0", "executor_10.0.0.2_1"}
    assert homes.assign(1, [A, B]) == {0: "executor_10.0.0.1_0"}
    assert homes.assign(3, []) == {}  # local mode: the driver only, no preference


@pytest.mark.parametrize("failing", ["executor list", "after the JVM RDD is built"])
def test_without_the_gateway_the_query_falls_back_to_spark_placement(
    spark, tmp_path, monkeypatch, caplog, failing
):
    def unavailable(*args, **kwargs):
        raise RuntimeError("no JVM gateway here (Spark Connect?)")

    if failing == "executor list":
        monkeypatch.setattr(affinity, "live_executors", unavailable)
    else:  # an executor to pin to (local mode has none: it would shuffle in the JVM, no gateway needed)
        import pyspark.serializers

        monkeypatch.setattr(affinity, "live_executors", lambda sc: [("0", "127.0.0.1")])
        monkeypatch.setattr(pyspark.serializers, "PairDeserializer", unavailable)
    workdir = tmp_path / "job"
    with caplog.at_level(logging.WARNING, logger="dstl.backend.spark"):
        progress = run(spark, workdir, local_config(tmp_path), 3)
    assert len(progress) == 3
    said = [r for r in caplog.records if "sticky placement is not available" in r.getMessage()]
    assert len(said) == 1, caplog.text  # once per query, not per batch
    assert_exact(spark, workdir)


def test_spark_placement_by_config_gives_the_same_state(spark, tmp_path):
    workdir = tmp_path / "job"
    progress = run(spark, workdir, local_config(tmp_path, **{"dstl.spark.placement": "spark"}), 4)
    assert [p.warm_instances for p in progress[1:]] == [p.instances for p in progress[1:]]
    assert_exact(spark, workdir)
