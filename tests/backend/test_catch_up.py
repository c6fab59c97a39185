"""Catch-up: a working copy left behind (its instance ran elsewhere) applies only what came since."""

import itertools

import pytest

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend, catch_up_delta, rebase
from dstl.backend.delegate import LmdbDelegate
from dstl.spi import KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)


class Host:
    """One executor's working copy of the instance, and the checkpoint it holds."""

    def __init__(self, path):
        self.delegate = LmdbDelegate(path, map_size=64 << 20)
        self.held = None
        self.registrations = {}


@pytest.fixture
def job(tmp_path, memory_config):
    storage = load_storage(memory_config, job_id="job")
    yield storage, (tmp_path / "chk").as_uri(), [Host(tmp_path / "a"), Host(tmp_path / "b")]
    storage.close()


def _batch(storage, snapshots, host, batch, previous, model, *, materialize=False, full_every=5, bridge=True):
    """One batch of the instance on ``host``: bring the copy to ``previous``, update, checkpoint."""
    backend = ChangelogKeyedStateBackend(
        storage,
        "op",
        ALL,
        epoch=batch,
        delegate=host.delegate,
        snapshot_dir=snapshots,
        full_materialization_every=full_every,
        bridge_full_snapshots=bridge,
    )
    how = "fresh"
    if previous is not None and host.held == previous:
        backend.resume(previous, host.registrations)
        how = "warm"
    elif previous is not None and host.held is not None:
        read = backend.catch_up(host.held, previous, host.registrations)
        how = "caught_up" if read is not None else "full"
        if read is None:
            host.delegate.clear()
            backend.restore(previous)
    elif previous is not None:
        host.delegate.clear()
        backend.restore(previous)
        how = "full"
    counts = backend.value_state("count")
    items = backend.list_state("items")
    for key in range(batch % 5, 300, 5):
        backend.set_current_key(key)
        counts.update((counts.value() or 0) + batch)
        items.add(batch)
        model.setdefault(key, [0, []])
        model[key][0] += batch
        model[key][1].append(batch)
    backend.set_current_key(7)
    counts.clear()
    model.pop(7, None)
    if materialize:
        backend.materialize().result(timeout=30)
    snapshot = backend.checkpoint(batch).result(timeout=30)
    host.held, host.registrations = snapshot, backend.registrations()
    for key in range(300):
        backend.set_current_key(key)
        expected = model.get(key)
        assert counts.value() == (expected[0] if expected else None), (batch, key, how)
        if key != 7:
            assert items.get() == (expected[1] if expected else []), (batch, key, how)
    backend.close()
    return snapshot, how


def test_a_copy_left_behind_catches_up_across_logs_and_incremental_snapshots(job):
    storage, snapshots, (a, b) = job
    model = {}
    plan = [  # (host, materialize, how the copy is brought up)
        (a, False, "fresh"),
        (b, False, "full"),  # b has no copy yet
        (b, False, "warm"),
        (a, False, "caught_up"),  # a holds checkpoint 0: replays the logs of 1 and 2 only
        (b, True, "caught_up"),  # and materializes: the chain starts with a full snapshot
        (a, False, "full"),  # a's copy predates the first snapshot: nothing bridges a log alone
        (b, True, "caught_up"),  # log of 5, then an incremental snapshot
        (a, False, "caught_up"),  # applies the incremental snapshot, then the log after it
    ]
    previous = None
    for batch, (host, materialize, expected_how) in enumerate(plan):
        previous, how = _batch(storage, snapshots, host, batch, previous, model, materialize=materialize)
        assert how == expected_how, f"batch {batch}: {how}"
    assert len(previous.materialized) == 2  # full + incremental: the last catch-up used both


@pytest.mark.parametrize("bridge", [True, False])
def test_a_copy_of_the_previous_chain_catches_up_through_the_bridge(job, bridge):
    storage, snapshots, (a, b) = job
    model = {}
    plan = [  # (host, materialize, how the copy is brought up)
        (a, True, "fresh"),  # full snapshot F0 (no chain before it: no bridge)
        (b, False, "full"),
        (a, True, "caught_up"),  # the state doubled: full F1, bridged by F0 and the keys changed since
        (b, True, "caught_up" if bridge else "full"),  # b holds F0 + log: the bridge continues it
        (a, False, "caught_up"),  # b's incremental on F1
    ]
    previous = None
    for batch, (host, materialize, expected_how) in enumerate(plan):
        previous, how = _batch(
            storage,
            snapshots,
            host,
            batch,
            previous,
            model,
            materialize=materialize,
            full_every=2,
            bridge=bridge,
        )
        assert how == expected_how, f"batch {batch}: {how}"
        if batch == 2:
            assert "-full-" in previous.materialized[0].path and len(previous.materialized) == 1
            assert len(previous.bridge) == (2 if bridge else 0)
            bridged = previous
    assert len(previous.materialized) == 2
    assert previous.bridge == bridged.bridge  # carried by the checkpoints on the new chain


def test_a_lost_attempts_copy_is_no_ancestor(job):
    storage, snapshots, (a, b) = job
    model = {}
    first, _ = _batch(storage, snapshots, a, 0, None, model)
    lost_model = {k: [v[0], list(v[1])] for k, v in model.items()}
    lost, _ = _batch(storage, snapshots, b, 1, first, lost_model)  # its checkpoint never completes
    retried, _ = _batch(storage, snapshots, a, 2, first, model)
    assert catch_up_delta(lost, retried) is None
    assert catch_up_delta(first, retried) is not None


def test_a_handle_a_later_checkpoint_carries_over_is_the_one_the_copy_holds(job):
    # A materialization that lands before its own checkpoint is taken leaves that checkpoint on
    # the new chain already; the next one, rebased onto the same snapshot, carries the log tail
    # over as a handle reporting 0 bytes uploaded. A copy holding the first still catches up.
    from dataclasses import replace

    storage, snapshots, (a, _) = job
    model = {}
    held, _ = _batch(storage, snapshots, a, 0, None, model, materialize=True)
    later, _ = _batch(storage, snapshots, a, 1, held, model)
    known = len(held.handles)
    assert known and all(h.incremental_size for h in held.handles)
    assert later.handles[:known] == held.handles and len(later.handles) > known
    carried = replace(
        later, handles=tuple(replace(h, incremental_size=0) for h in held.handles) + later.handles[known:]
    )
    delta = catch_up_delta(held, carried)
    assert delta is not None, "a carried-over handle read as another log"
    assert delta.handles == later.handles[known:] and delta.materialized == ()


def _entries(delegate):
    return {
        (state, kg, key): entry
        for state in ("count", "items")
        for kg in range(ALL.start, ALL.end)
        for key, entry in delegate.entries(state, kg)
    }


def test_a_copy_holding_the_checkpoint_a_background_snapshot_was_taken_at_catches_up_on_the_log(job):
    # The instance's next checkpoint moves onto a snapshot completed after its own (rebase). A copy
    # that holds the checkpoint the snapshot was taken at holds all it holds: loading it would take
    # back what the copy applied after it was taken; only the log after the copy's checkpoint applies.
    storage, snapshots, (a, b) = job
    epochs = itertools.count(1)  # one log, one writer at a time: each backend fences the one before

    def instance_batch(batch, previous, in_background):
        """A batch of the instance on ``a``; its base moved onto the snapshot its previous batch began."""
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=next(epochs), delegate=a.delegate, snapshot_dir=snapshots
        )
        if previous is None:
            base = None
        else:
            base = rebase(previous, previous, a.offer) if a.offer is not None else previous
            assert base is not None
            backend.resume(base, a.registrations)
        counts, items = backend.value_state("count"), backend.list_state("items")
        for key in range(300) if batch == 0 else range(batch % 5, 300, 5):  # the snapshots after: incremental
            backend.set_current_key(key)
            counts.update((counts.value() or 0) + batch)
            items.add(batch)
        a.offer = None
        if in_background:
            checkpoint, rebased = backend.checkpoint_materializing(batch)
            a.offer = rebased.result(timeout=30)
        else:
            checkpoint = backend.checkpoint(batch).result(timeout=30)
        a.registrations = backend.registrations()
        backend.close()
        return checkpoint

    def refresh(target):
        """Bring b's copy to ``target`` as a standby does: catch up, or restore in full."""
        backend = ChangelogKeyedStateBackend(
            storage, "op", ALL, epoch=next(epochs), delegate=b.delegate, snapshot_dir=snapshots
        )
        how = "full"
        if b.held is None:
            backend.restore(target)
        elif backend.catch_up(b.held, target, b.registrations) is not None:
            how = "caught_up"
        else:
            b.delegate.clear()
            backend.restore(target)
        b.held, b.registrations = target, backend.registrations()
        backend.close()
        assert _entries(b.delegate) == _entries(a.delegate), f"{how}: b's copy is not the checkpoint's state"
        return how

    a.offer = None
    previous = instance_batch(0, None, True)  # S0 taken at checkpoint 0, completes after it
    assert refresh(previous) == "full" and not previous.materialized
    previous = instance_batch(1, previous, True)  # on S0; S1 taken at checkpoint 1
    assert len(previous.materialized) == 1
    assert refresh(previous) == "caught_up"  # b holds 0, where S0 was taken: the log of 1 only
    previous = instance_batch(2, previous, True)  # on S0, S1; S2 taken at 2
    assert refresh(previous) == "caught_up"  # b holds 1, where S1 was taken: the log of 2 only
    previous = instance_batch(3, previous, True)  # on S0..S2; S3 taken at 3
    previous = instance_batch(4, previous, False)  # on S0..S3
    assert len(previous.materialized) == 4
    assert refresh(previous) == "caught_up"  # b holds 2: S2 was taken there, S3 after: S3, then the log


def test_a_later_checkpoint_never_catches_up_to_an_earlier_one_on_a_longer_chain(job):
    storage, snapshots, (a, _) = job
    model = {}
    earlier, _ = _batch(storage, snapshots, a, 0, None, model, materialize=True)
    later, _ = _batch(storage, snapshots, a, 1, earlier, model)
    # a forged pair: the earlier checkpoint with a snapshot more than the later one's chain
    longer = BackendSnapshot(
        earlier.checkpoint_id, later.handles, (*later.materialized, *earlier.materialized)
    )
    assert catch_up_delta(later, longer) is None
