"""Stable placement: instance of a key group, rescale unions, names; routing agrees with Spark."""

import pytest

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.keygroups import key_group_for, key_group_range_for_instance
from dstl.backend.spark import instance_for_key_group, routing_exprs
from dstl.backend.spark.placement import instance_name, parse_instance_name, snapshot_for_range
from dstl.spi import ChangelogHandle, KeyGroupRange, SequenceNumberRange


@pytest.mark.parametrize("parallelism", [1, 2, 3, 7, 128])
def test_instance_of_a_key_group_is_the_one_whose_range_holds_it(parallelism):
    for key_group in range(128):
        instance = instance_for_key_group(key_group, parallelism, 128)
        assert key_group in key_group_range_for_instance(instance, parallelism, 128)


def _snapshot(start, end):
    handle = ChangelogHandle.create(
        storage_id="memory",
        log_id=f"op.kg{start}-{end}",
        key_groups=KeyGroupRange(start, end),
        sqn_range=SequenceNumberRange(0, 1),
        epoch=1,
        locations=[{"object": f"o{start}"}],
    )
    return BackendSnapshot(5, (handle,))


def test_rescaled_instance_restores_from_every_overlapping_snapshot():
    snapshots = {
        instance_name(KeyGroupRange(s, e)): _snapshot(s, e) for s, e in ((0, 43), (43, 86), (86, 128))
    }
    same = snapshot_for_range(snapshots, KeyGroupRange(43, 86))
    assert same is snapshots["kg43-86"], (
        "an unchanged range keeps its own snapshot (warm path stays possible)"
    )
    union = snapshot_for_range(snapshots, KeyGroupRange(0, 64))
    assert [h.log_id for h in union.handles] == ["op.kg0-43", "op.kg43-86"]
    assert snapshot_for_range({}, KeyGroupRange(0, 64)) is None
    with pytest.raises(ValueError, match="not an instance name"):
        parse_instance_name("../etc")


def test_rows_routed_in_spark_reach_the_instance_owning_their_key_group(spark):
    key_group, instance = routing_exprs(["user"], 3, 128)
    rows = (
        spark.range(300)
        .selectExpr("concat('user-', cast(id as string)) as user")
        .selectExpr("user", f"{key_group} as kg", f"{instance} as instance")
        .collect()
    )
    for row in rows:
        assert row["kg"] == key_group_for(row["user"], 128)
        assert row["kg"] in key_group_range_for_instance(row["instance"], 3, 128)
