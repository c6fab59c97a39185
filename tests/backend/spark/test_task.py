"""A task brings its working copy up: it moves onto a background snapshot of its run, or removes it."""

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.spark._private.task import _bring_up
from dstl.backend.spark._private.working_copy import WorkingCopy
from dstl.spi import KeyGroupRange, load_storage


def test_a_task_moves_onto_an_offer_of_its_run_and_removes_any_other(tmp_path, memory_config):
    snapshots = tmp_path / "chk"
    copy = WorkingCopy(tmp_path / "wc", "kg0-128", map_size=1 << 24)
    stamp = {"registrations": {"v": ("value", "msgpack")}}
    with load_storage(memory_config, job_id="job") as storage:

        def batch(epoch, previous, run_id):
            """One task: bring up, change a key, checkpoint while materializing, offer the result."""
            backend = ChangelogKeyedStateBackend(
                storage,
                "op",
                KeyGroupRange(0, 128),
                epoch=epoch,
                delegate=copy.delegate,
                snapshot_dir=snapshots.as_uri(),
            )
            how, _ = _bring_up(
                backend,
                copy,
                stamp,
                previous,
                warm=previous is not None,
                committed=True,
                cfg=None,
                run_id=run_id,
            )
            backend.set_current_key(epoch)
            backend.value_state("v").update(epoch)
            checkpoint, rebased = backend.checkpoint_materializing(epoch)
            backend.close(wait_for_materialization=False)
            copy.offer(checkpoint, rebased.result(timeout=30), run_id)
            return how, checkpoint

        def written_by_the_offer():
            run_id, checkpoint, rebased, _ = copy.take_offer()
            copy.offer(checkpoint, rebased, run_id)  # put back
            return [snapshots / ref.path for ref in rebased.references if ref not in checkpoint.references]

        how, first = batch(1, None, run_id=1)
        assert how == "fresh"
        first_snapshot = written_by_the_offer()
        assert first_snapshot and all(path.exists() for path in first_snapshot)

        how, second = batch(2, first, run_id=1)
        assert how == "rebased", "the next task did not move onto the completed snapshot"
        assert {snapshots / ref.path for ref in second.references} >= set(first_snapshot)

        stale = written_by_the_offer()
        how, _ = batch(3, first, run_id=1)  # batch 2 was not committed: its offer continues nothing
        assert how == "warm" and not any(path.exists() for path in stale), "an unusable snapshot stayed"
        assert all(path.exists() for path in first_snapshot), "a snapshot a checkpoint references was removed"

        other_run = written_by_the_offer()
        how, _ = batch(4, first, run_id=2)  # a restarted job never moves onto an earlier run's snapshot
        assert how == "warm" and not any(path.exists() for path in other_run)
