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
    # A new executor takes no instance away at once (moving would cost a restore): one instance of
    # the fullest keeps a warm-up copy there, refreshed by a task of its own (past the instances)
    assert homes.assign(4, [A, B, C]) == {**first, 4: "executor_10.0.0.3_2"}
    assert homes.standby_work == {4: (0,)}


@pytest.mark.parametrize("standby_replicas", [0, 1])
def test_an_idle_executor_gets_an_instance_once_its_copy_there_is_warm(standby_replicas):
    homes = ExecutorHomes(standby_replicas, own_directories=True)
    homes.assign(2, [A, B])
    homes.assign(2, [A])  # B died: its instance moves to A
    assert homes._homes == {0: A, 1: A}
    for _ in range(2):  # C replaced B: until a task on C says the copy is warm, A keeps both
        locations = homes.assign(2, [A, C])
        assert homes._homes == {0: A, 1: A} and locations[2] == "executor_10.0.0.3_2"
        assert 0 in homes.standby_work[2]
        homes.copies_at(C, [(0, False)])  # a task on C found it still cold
        homes.copies_at(A, [(0, True)])  # (word of another executor's copy does not count)
    homes.copies_at(C, [(0, True)])
    homes.assign(2, [A, C])
    assert homes._homes == {0: C, 1: A}, "the warm copy's instance did not move"
    if standby_replicas:  # its former home keeps the standby copy: the warmest after its own
        assert homes._standbys[0] == A
    balanced = homes.assign(2, [A, C])
    assert homes._homes == {0: C, 1: A} and 2 not in balanced and homes._warmups == {}


def test_balancing_moves_one_instance_a_batch_and_one_without_state_at_once():
    homes = ExecutorHomes()
    homes.assign(4, [A])
    homes.assign(4, [A, B])  # B is new: A has all four
    assert set(homes._homes.values()) == {A}
    homes.assign(4, [A, B], with_state=frozenset({0, 1}))  # 2 has no state: nothing to warm up
    assert homes._homes[2] == B and sum(home == A for home in homes._homes.values()) == 3
    homes.copies_at(B, [(0, True), (1, True)])
    homes.assign(4, [A, B], with_state=frozenset({0, 1}))
    assert homes._homes[0] == B and homes._homes[1] == A  # one move a batch
    homes.assign(4, [A, B], with_state=frozenset({0, 1}))
    assert [homes._homes[i] for i in range(4)] == [B, A, B, A]  # two apart no more
    lost = homes.assign(4, [B])  # a loss's moves are not balanced in the same batch
    assert set(lost.values()) == {"executor_10.0.0.2_1"}


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


A2 = ("3", "10.0.0.1")  # a second executor on A's host


def test_standbys_are_on_other_executors_and_a_lost_home_moves_to_its_standby():
    homes = ExecutorHomes(standby_replicas=1)
    first = homes.assign(4, [A, B, C])
    standbys = dict(homes._standbys)
    assert all(standbys[i] != homes._homes[i] for i in range(4))
    # each task keeps the standby copies of its executor (every task there names them all)
    for instance in range(4):
        kept = homes.standby_work[instance]
        assert all(standbys[other] == homes._homes[instance] for other in kept)
    assert sorted(i for work in {homes.standby_work[i] for i in range(4)} for i in work) == [0, 1, 2, 3]
    lost = homes._homes[0]
    survivors = [e for e in (A, B, C) if e != lost]
    after = homes.assign(4, survivors)
    # the lost executor's instances move to their standbys (which hold their state), the others stay
    for instance in range(4):
        if first[instance] == f"executor_{lost[1]}_{lost[0]}":
            assert after[instance] == f"executor_{standbys[instance][1]}_{standbys[instance][0]}"
        else:
            assert after[instance] == first[instance]
    assert all(homes._standbys[i] != homes._homes[i] and homes._standbys[i] in survivors for i in range(4))


def test_standbys_prefer_another_host_and_need_two_executors():
    homes = ExecutorHomes(standby_replicas=1)
    homes.assign(2, [A, A2, B])
    for instance in range(2):  # executors of one host may share the working directory's disk
        home, standby = homes._homes[instance], homes._standbys[instance]
        assert standby != home and (standby[1] != home[1] or home == B)
    homes.assign(2, [A])
    assert homes.standby_work == {} and homes._standbys == {}
    without = ExecutorHomes()  # standby_replicas=0, the default
    without.assign(2, [A, B])
    assert without._standbys == {} and without.standby_work == {}
    one_host = ExecutorHomes(standby_replicas=1)  # executors of a host share its working directory
    one_host.assign(2, [A, A2])
    assert one_host._standbys == {} and one_host.standby_work == {}
    own = ExecutorHomes(standby_replicas=1, own_directories=True)  # a relative working dir: one each
    own.assign(2, [A, A2])
    assert {i: own._standbys[i] for i in range(2)} == {0: own._homes[1], 1: own._homes[0]}
    assert own.standby_work == {0: (1,), 1: (0,)}


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


def test_an_instance_that_ran_off_its_home_makes_the_driver_ask_for_the_executors_again(monkeypatch):
    from dstl.backend.spark._private.protocol import InstanceStats, Restore

    asked: list[int] = []
    monkeypatch.setattr(affinity, "live_executors", lambda sc: asked.append(1) or [A, B])
    homes = ExecutorHomes(standby_replicas=1)
    homes.live_executors(None)
    homes.live_executors(None)
    assert len(asked) == 1  # known for EXECUTORS_TTL seconds
    homes.noticed(
        [InstanceStats("kg0-64", 1, 1, Restore.WARM), InstanceStats("kg64-128", 1, 1, Restore.FRESH)]
    )
    homes.live_executors(None)
    assert len(asked) == 1
    homes.noticed([InstanceStats("kg0-64", 1, 1, Restore.CAUGHT_UP)])  # it ran where its copy was not
    homes.live_executors(None)
    assert len(asked) == 2


def test_an_instance_that_ran_off_its_home_makes_the_executor_it_ran_on_its_home(monkeypatch):
    from types import SimpleNamespace

    from dstl.backend.spark._private.protocol import InstanceStats, Restore

    ran = {11: "1", 12: "1", 13: "9"}  # task attempt -> executor id, as Spark's status store has it
    monkeypatch.setattr(affinity, "_task_executors", lambda sc, stages: ran)
    homes = ExecutorHomes()
    homes.jvm = SimpleNamespace(context=None)
    homes._executors = [A, B]
    homes.assign(3, [A, B])
    assert homes._homes == {0: A, 1: B, 2: A}
    tasks = [(0, 11, 5, ()), (1, 12, 5, ()), (2, 13, 5, ())]  # 0 ran on B, 2 on an executor now gone
    homes.observed(tasks)
    homes.noticed([InstanceStats("kg0-43", 1, 1, Restore.WARM)])
    assert homes._homes == {0: A, 1: B, 2: A}, "every instance found its copy warm: nothing moved"
    homes.observed(tasks)
    homes.noticed([InstanceStats("kg0-43", 1, 1, Restore.FULL)])
    assert homes._homes == {0: B, 1: B, 2: A}  # its copy there is the latest now
    homes.noticed([InstanceStats("kg0-43", 1, 1, Restore.FULL)])  # the tasks are a batch's: used once
    assert homes._homes == {0: B, 1: B, 2: A}


def test_a_batch_with_copies_and_a_moved_instance_asks_the_status_store_once(monkeypatch):
    from types import SimpleNamespace

    from dstl.backend.spark._private.protocol import InstanceStats, Restore

    asked: list[set[int]] = []
    monkeypatch.setattr(
        affinity, "_task_executors", lambda sc, stages: asked.append(stages) or {11: "1", 12: "1"}
    )
    homes = ExecutorHomes(standby_replicas=1)
    homes.jvm = SimpleNamespace(context=None)
    homes._executors = [A, B]
    homes.assign(2, [A, B])
    homes.observed([(0, 11, 5, ((1, True),)), (1, 12, 5, ())])  # a task keeping a copy: looked up
    homes.noticed([InstanceStats("kg0-64", 1, 1, Restore.CAUGHT_UP)])
    assert asked == [{5}] and homes._homes[0] == B  # the move used the first look-up
    homes.observed([(0, 11, 6, ()), (1, 12, 6, ())])  # no copies: nothing looked up until needed
    homes.noticed([InstanceStats("kg0-64", 1, 1, Restore.FULL)])
    assert asked == [{5}, {6}]


def test_a_standby_is_asked_to_refresh_once_per_interval_and_a_new_one_at_once(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(affinity.time, "monotonic", lambda: now[0])
    homes = ExecutorHomes(standby_replicas=1, refresh_interval=10.0)
    homes.assign(2, [A, B], with_state=frozenset())  # no state yet: nothing to refresh, nor counted
    assert homes.standby_work == {}
    now[0] += 1
    homes.assign(2, [A, B], with_state=frozenset({0, 1}))
    assert homes.standby_work == {0: (1,), 1: (0,)}
    now[0] += 4
    homes.assign(2, [A, B])
    assert homes.standby_work == {}  # refreshed 4 s ago
    now[0] += 6
    homes.assign(2, [A, B])
    assert homes.standby_work == {0: (1,), 1: (0,)}
    now[0] += 1
    locations = homes.assign(2, [A, C])  # B died: its instance moved to A; their standbys are new on C
    assert all(homes._homes[i] == A and homes._standbys[i] == C for i in range(2))
    # C is home to no instance: a task of its own (a partition past the instances) keeps both copies
    assert homes.standby_only == {2: C} and locations[2] == "executor_10.0.0.3_2"
    assert homes.standby_work == {2: (0, 1)}


def test_the_executor_list_is_read_without_a_java_exception(spark, monkeypatch):
    # iterating a Java list through py4j ends on an exception PySpark converts in dozens of
    # round trips (35-50 ms, on every few batches' plan); by index there is none
    from pyspark.errors.exceptions import captured

    converted = []
    convert = captured.convert_exception
    monkeypatch.setattr(captured, "convert_exception", lambda e: converted.append(e) or convert(e))
    assert affinity.live_executors(spark.sparkContext) == []  # local mode: the driver alone, excluded
    jvm = spark.sparkContext._jvm
    items = jvm.java.util.ArrayList()
    for item in ("a", "b", "c"):
        items.add(item)
    assert list(affinity._java_list_items(items)) == ["a", "b", "c"]
    assert converted == []
