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
    assert [(owned, part) for owned, part in union.parts] == [
        (KeyGroupRange(0, 43), snapshots["kg0-43"]),
        (KeyGroupRange(43, 86), snapshots["kg43-86"]),
    ], "each overlapping snapshot, with the key groups its instance owned"
    assert [h.log_id for h in union.all_handles] == ["op.kg0-43", "op.kg43-86"]
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


@pytest.mark.parametrize(
    ("steps", "materializing"),
    [
        ([2, 3, 1], {(1, "kg43-86")}),  # one rescaled instance materialized, the others carry parts
        ([2, 3, 4, 1], set()),  # nobody materializes across three rescales: parts of parts
        ([2, 3, 4, 1], {(1, "kg0-43"), (2, "kg32-64"), (2, "kg96-128")}),
    ],
)
def test_rescaled_instances_restore_each_part_for_the_key_groups_its_instance_owned(
    tmp_path, memory_config, steps, materializing
):
    """Instances restore unions of what the previous ones checkpointed; every key stays exact."""
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.spi import load_storage

    snapshots_dir = (tmp_path / "chk").as_uri()
    model: dict[int, tuple[int, list[int], dict[str, int]]] = {}
    checkpoints: dict[str, BackendSnapshot] = {}
    epoch = 0
    with load_storage(memory_config, job_id="job") as storage:
        for step, parallelism in enumerate(steps):
            new_checkpoints = {}
            for instance in range(parallelism):
                key_groups = key_group_range_for_instance(instance, parallelism, 128)
                name = instance_name(key_groups)
                epoch += 1
                backend = ChangelogKeyedStateBackend(
                    storage, "op", key_groups, epoch=epoch, snapshot_dir=snapshots_dir
                )
                previous = snapshot_for_range(checkpoints, key_groups)
                if previous is not None:
                    backend.restore(BackendSnapshot.from_json(previous.to_json()))
                count, items = backend.value_state("n"), backend.list_state("l")
                pages = backend.map_state("m")
                for key in range(400):
                    if key_group_for(key, 128) not in key_groups:
                        continue
                    backend.set_current_key(key)
                    n, listed, paged = model.get(key, (0, [], {}))
                    assert (count.value() or 0, items.get(), dict(pages.items())) == (n, listed, paged), (
                        step,
                        name,
                        key,
                    )
                    if (key + step) % 3:
                        continue
                    count.update(n + 1)
                    items.add(step)
                    pages.put(f"p{step}", key)
                    model[key] = (n + 1, [*listed, step], {**paged, f"p{step}": key})
                if (step, name) in materializing:
                    backend.materialize().result(timeout=30)
                new_checkpoints[name] = backend.checkpoint(step).result(timeout=30)
                backend.close()
            checkpoints = new_checkpoints


def test_the_next_timer_of_an_instance_follows_its_key_groups_through_a_rescale():
    from dstl.backend.spark.placement import next_timer_for_range

    before = {"kg0-64": 5_000, "kg64-128": 3_000}
    assert next_timer_for_range(before, KeyGroupRange(0, 64)) == 5_000
    # parallelism 2 -> 3: the middle instance overlaps both old ones
    assert next_timer_for_range(before, KeyGroupRange(0, 43)) == 5_000
    assert next_timer_for_range(before, KeyGroupRange(43, 86)) == 3_000
    assert next_timer_for_range({"kg0-64": 5_000}, KeyGroupRange(64, 128)) is None
