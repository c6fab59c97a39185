"""Materialization in the background, past the checkpoint: later checkpoints move onto the new chain."""

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend, rebase
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.spi import KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)


def _state(backend):
    counts, items = backend.value_state("count"), backend.list_state("items")
    found = {}
    for key in range(200):
        backend.set_current_key(key)
        found[key] = (counts.value(), items.get())
    return found


def _batch(backend, batch):
    """Batch 1 writes every key, later ones a few (so an incremental is smaller than the state)."""
    counts, items = backend.value_state("count"), backend.list_state("items")
    for key in range(batch, 200, 1 if batch == 1 else 10):
        backend.set_current_key(key)
        counts.update((counts.value() or 0) + batch)
        items.add(batch)  # not idempotent: replaying a change twice would show


def _restored(storage, snapshots, snapshot, epoch):
    backend = ChangelogKeyedStateBackend(
        storage, "op", ALL, epoch=epoch, delegate=HeapDelegate(), snapshot_dir=snapshots
    )
    backend.restore(BackendSnapshot.from_json(snapshot.to_json()))
    return backend


def test_a_later_checkpoint_moves_onto_a_snapshot_its_batch_did_not_wait_for(tmp_path, memory_config):
    snapshots = (tmp_path / "chk").as_uri()
    with load_storage(memory_config, job_id="job") as storage:
        delegate = LmdbDelegate(tmp_path / "copy")
        first = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=1, delegate=delegate, snapshot_dir=snapshots
        )
        _batch(first, 1)
        checkpoint1, rebased = first.checkpoint_materializing(1)
        first.close(wait_for_materialization=False)
        assert checkpoint1.materialized == ()  # the checkpoint did not wait for the snapshot
        # The next batch runs on the same working copy while the snapshot may still be written.
        second = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=2, delegate=delegate, snapshot_dir=snapshots
        )
        second.resume(checkpoint1, first.registrations())
        _batch(second, 2)
        checkpoint2 = second.checkpoint(2).result(timeout=30)
        expected = _state(second)
        second.close()
        moved = rebase(checkpoint2, checkpoint1, rebased.result(timeout=30))
        assert moved is not None and len(moved.materialized) == 1 and moved.materialized[0].sqn > 0
        assert moved.handles[1:] == checkpoint2.handles[1:] and moved.handles[0] != checkpoint2.handles[0]
        for epoch, snapshot in enumerate((checkpoint2, moved), start=3):
            restored = _restored(storage, snapshots, snapshot, epoch)
            assert _state(restored) == expected
            restored.close()
        # A third batch resumed from the moved checkpoint continues the new chain incrementally.
        third = ChangelogKeyedStateBackend(
            storage,
            "op",
            ALL,
            epoch=5,
            delegate=delegate,
            snapshot_dir=snapshots,
            full_materialization_every=5,
        )
        third.resume(moved, second.registrations())
        _batch(third, 3)
        third.materialize().result(timeout=30)
        checkpoint3 = third.checkpoint(3).result(timeout=30)
        assert (
            checkpoint3.materialized[0] == moved.materialized[0]
            and "-incr-" in checkpoint3.materialized[-1].path
        )
        expected = _state(third)
        third.close()
        restored = _restored(storage, snapshots, checkpoint3, 6)
        assert _state(restored) == expected
        restored.close()
        delegate.close()


def test_rebase_refuses_what_does_not_continue_the_materialized_checkpoint(tmp_path, memory_config):
    snapshots = (tmp_path / "chk").as_uri()
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, epoch=1, snapshot_dir=snapshots)
        _batch(backend, 1)
        checkpoint1 = backend.checkpoint(1).result(timeout=30)
        _batch(backend, 2)
        checkpoint2, rebased = backend.checkpoint_materializing(2)
        new_chain = rebased.result(timeout=30)
        backend.close()
        assert rebase(checkpoint2, checkpoint2, new_chain) is not None
        assert rebase(checkpoint1, checkpoint2, new_chain) is None, "an older checkpoint moved ahead"
        other = BackendSnapshot(3, checkpoint2.handles, new_chain.materialized)
        assert rebase(other, checkpoint2, new_chain) is None, "a checkpoint on another chain moved"
        lost = BackendSnapshot(3, (checkpoint1.handles[0],), ())
        assert rebase(lost, checkpoint2, new_chain) is None


def test_a_checkpoint_stays_on_its_chain_when_the_snapshot_started_for_it_completes_first(
    tmp_path, memory_config
):
    # the snapshot checkpoint_materializing starts may be done before the checkpoint reads its
    # chain (a small state, a busy machine): the checkpoint is still the one on the chain as it was
    import time

    snapshots = (tmp_path / "chk").as_uri()
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=1, delegate=LmdbDelegate(tmp_path / "copy"), snapshot_dir=snapshots
        )
        _batch(backend, 1)
        expected = _state(backend)
        due = backend.maybe_materialize

        def after_the_snapshot_completed():
            due()
            deadline = time.monotonic() + 30
            while backend.materializer.running and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not backend.materializer.running

        backend.maybe_materialize = after_the_snapshot_completed
        checkpoint, rebased = backend.checkpoint_materializing(1)
        assert checkpoint.materialized == ()  # not the snapshot it did not wait for
        moved = rebased.result(timeout=30)
        assert len(moved.materialized) == 1
        backend.close()
        for epoch, snapshot in enumerate((checkpoint, moved), start=2):
            restored = _restored(storage, snapshots, snapshot, epoch)
            assert _state(restored) == expected  # each change applied once
            restored.close()
