"""Background work gives way to the process's foreground work (a batch keeps the GIL)."""

import threading
import time

import pytest

from dstl.backend import foreground
from dstl.backend.changelog.materializer import Materializer
from dstl.backend.delegate import SECTION_ENTRIES, HeapDelegate, LmdbDelegate, StateView
from dstl.backend.materialization import MaterializationRef
from dstl.backend.pacing import MOST_PAUSE_S, Pacer, give_way, in_background, pace, paced, yielding

from .helpers import FakeTarget, stored_state


def test_with_no_foreground_work_giving_way_costs_no_wait():
    assert give_way(most=5.0) == 0.0


def test_background_waits_for_the_foreground_to_end_and_no_longer():
    entered, release = threading.Event(), threading.Event()

    def batch():
        with foreground():
            entered.set()
            release.wait(10)

    runner = threading.Thread(target=batch)
    runner.start()
    assert entered.wait(10)
    threading.Timer(0.2, release.set).start()
    waited = give_way(most=10.0)
    assert release.is_set()  # it returned when the foreground ended (not before), not at ``most``
    assert waited < 5.0
    runner.join(10)
    assert give_way(most=10.0) == 0.0


def test_a_foreground_that_never_rests_delays_each_step_by_at_most_the_bound():
    with foreground(), foreground():  # nested blocks count
        began = time.perf_counter()
        assert 0.08 < give_way(most=0.1) < 5.0
        assert time.perf_counter() - began < 5.0
    assert give_way(most=10.0) == 0.0


def test_paced_steps_give_way_every_n_calls(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr("dstl.backend.pacing.give_way", lambda: pauses.append(1) or 0.0)
    seen: list[int] = []
    step = paced(seen.append, 3)
    for i in range(7):
        step(i)
    assert seen == list(range(7)) and len(pauses) == 2


def test_a_pacer_keeps_its_share_beside_a_foreground_that_never_rests(monkeypatch):
    pauses: list[float] = []
    now = [0.0]

    def give_way(most):  # the foreground never rests: each pause lasts as long as it may
        pauses.append(most)
        now[0] += most
        return most

    monkeypatch.setattr("dstl.backend.pacing.give_way", give_way)
    pace = Pacer(share=0.1, clock=lambda: now[0])
    for step in (0.01, 0.002, 0.2):  # each step's time, then the pause after it
        now[0] += step
        pace()
    # Each pause is at most nine times the step before it (a tenth of the time is the loop's),
    # never more than MOST_PAUSE_S.
    assert [round(p, 6) for p in pauses] == [0.09, 0.018, MOST_PAUSE_S]
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            Pacer(share=share)


class CountingView(StateView):
    """A view that counts the sections a materialization has taken from it."""

    def __init__(self, view):
        self.view = view
        self.taken = 0

    def state_names(self):
        return self.view.state_names()

    def entries(self, state, key_group):
        return self.view.entries(state, key_group)

    def get(self, state, key_group, key):
        return self.view.get(state, key_group, key)

    def sections(self, key_groups):
        for section in self.view.sections(key_groups):
            self.taken += 1
            yield section

    def close(self):
        self.view.close()


def test_a_materialization_takes_no_further_section_while_a_batch_runs(tmp_path, monkeypatch):
    monkeypatch.setattr("dstl.backend.pacing.MOST_PAUSE_S", 60.0)  # paused for the whole batch...
    monkeypatch.setattr("dstl.backend.pacing.BACKGROUND_SHARE", 1e-9)  # ...keeping next to no share
    delegate = HeapDelegate()
    target = FakeTarget(delegate)
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3)
    for i in range(SECTION_ENTRIES * 4):  # one key group: four sections
        delegate.put("v", 0, b"k%06d" % i, b"%d" % i)
        materializer.changed("v", 0, b"k%06d" % i)
    views: list[CountingView] = []

    def counted_view():
        views.append(CountingView(HeapDelegate.view(delegate)))
        return views[-1]

    delegate.view = counted_view
    with foreground():
        done = materializer.start()
        deadline = time.monotonic() + 10
        while not (views and views[0].taken) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # unpaced, the other three sections take a few ms
        assert views[0].taken == 1 and not done.done()
    ref = done.result(timeout=30)
    assert views[0].taken == 4 and ref.entries == SECTION_ENTRIES * 4

    copy = FakeTarget(HeapDelegate())
    Materializer(copy, (tmp_path / "snap").as_uri(), 3).load(ref)
    assert stored_state(copy.delegate) == stored_state(delegate)


def test_foreground_work_waiting_on_the_background_lifts_the_pause(monkeypatch):
    monkeypatch.setattr("dstl.backend.pacing.MOST_PAUSE_S", 60.0)
    with foreground():
        assert give_way(most=0.05) > 0.04  # paused
        with yielding():
            assert give_way() == 0.0  # the foreground waits on it: no pause
        assert give_way(most=0.05) > 0.04


def test_the_lmdb_map_grows_while_a_paced_materialization_reads_its_view(tmp_path, monkeypatch):
    # Growing the map needs no view open on the live file: the full snapshot's view reads a
    # copy of the state (detached in a gap between batches), so neither waits for the other
    # a section per pause (a minute each here), and the snapshot is not given up.
    monkeypatch.setattr("dstl.backend.pacing.MOST_PAUSE_S", 60.0)
    delegate = LmdbDelegate(tmp_path / "lmdb", map_size=1 << 20)
    target = FakeTarget(delegate)
    materializer = Materializer(target, (tmp_path / "snap").as_uri(), 3)
    for i in range(SECTION_ENTRIES * 3):
        delegate.put("v", 0, b"k%06d" % i, b"%d" % i)
        materializer.changed("v", 0, b"k%06d" % i)
    outcome: list[MaterializationRef] = []

    def batch():
        with foreground():
            done = materializer.start()
            delegate.put("v", 1, b"big", b"x" * (2 << 20))  # more than the map holds
            outcome.append(done.result(timeout=30))

    runner = threading.Thread(target=batch, daemon=True)
    runner.start()
    runner.join(30)
    assert delegate.resizes >= 1 and delegate.get("v", 1, b"big") == b"x" * (2 << 20)
    assert len(outcome) == 1 and outcome[0].entries == SECTION_ENTRIES * 3  # the state at its start
    assert materializer.failed == 0 and not list(tmp_path.glob("lmdb.spool-*"))

    # The next one, an incremental, holds the big one.
    materializer.changed("v", 1, b"big")
    ref = materializer.start().result(timeout=30)
    assert ref.entries == 1 and len(materializer.chain) == 2


def test_work_paced_only_where_it_runs_in_the_background(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr("dstl.backend.pacing.give_way", lambda most=None: pauses.append(most) or 0.0)
    assert pace() == 0.0 and not pauses  # a task's own work (e.g. its restore): never paused
    with in_background():
        pace()
        with in_background(share=0.5):  # nested: the inner block's pacer, then the outer's again
            pace()
        pace()
    pace()
    assert len(pauses) == 3


def test_a_restore_in_the_background_takes_no_further_section_while_a_batch_runs(tmp_path, monkeypatch):
    monkeypatch.setattr("dstl.backend.pacing.MOST_PAUSE_S", 60.0)  # paused for the whole batch...
    monkeypatch.setattr("dstl.backend.pacing.BACKGROUND_SHARE", 1e-9)  # ...keeping next to no share
    source = HeapDelegate()
    for key_group in range(4):  # four key groups: four sections
        source.put("v", key_group, b"k%d" % key_group, b"%d" % key_group)
    ref = Materializer(FakeTarget(source), (tmp_path / "snap").as_uri(), 3).start().result(timeout=30)
    loaded: list[int] = []

    class CountingDelegate(HeapDelegate):
        def write_batch(self, state, key_group, entries):
            super().write_batch(state, key_group, entries)
            loaded.append(key_group)

    def restore(delegate, background):
        with in_background() if background else foreground():
            Materializer(FakeTarget(delegate), (tmp_path / "snap").as_uri(), 3).load(ref)

    mine = CountingDelegate()
    with foreground():
        restore(mine, background=False)  # the task's own restore is not held back by its batch
        assert len(loaded) == 4
        loaded.clear()
        standby = CountingDelegate()
        thread = threading.Thread(target=restore, args=(standby, True))
        thread.start()
        deadline = time.monotonic() + 10
        while not loaded and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # unpaced, the other three sections take a few ms
        assert len(loaded) == 1 and thread.is_alive()
    thread.join(30)
    assert len(loaded) == 4 and stored_state(standby) == stored_state(source) == stored_state(mine)
