"""Model check: random operation sequences against a reference model of the contract."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dstl.conformance.testing import read_changes
from dstl.spi import KeyGroupRange, TruncatedError

KG = KeyGroupRange(0, 6)
_operators = itertools.count()


def test_writer_matches_reference_model(storage, sut):
    class WriterModel(RuleBasedStateMachine):
        @initialize()
        def start(self):
            self.writer = storage.create_writer(f"model-{next(_operators)}", KG)
            self.initial = self.writer.initial_sqn()
            self.active = self.initial
            self.open_changes = []
            self.change_sets = {}
            self.lowest = self.initial
            self.checkpoint = 0
            self.counter = 0

        def _rollover(self):
            if self.open_changes:
                self.change_sets[self.active] = self.open_changes
                self.open_changes = []
                self.active += 1

        @rule(key_group=st.integers(-1, 5), size=st.sampled_from([0, 3, 40, 300]))
        def append(self, key_group, size):
            self.counter += 1
            data = f"{self.counter}".encode().ljust(size, b"~")
            if key_group < 0:
                self.writer.append_meta(data)
            else:
                self.writer.append(key_group, data)
            self.open_changes.append((key_group, data))

        @rule()
        def boundary(self):
            self._rollover()
            assert self.writer.next_sqn() == self.active

        @rule(data=st.data())
        def persist(self, data):
            self._rollover()
            start = data.draw(st.integers(self.lowest, self.active), label="start")
            self.checkpoint += 1
            handle = self.writer.persist(start, self.checkpoint).result(timeout=sut.timeout)
            assert (handle.sqn_range.start, handle.sqn_range.end) == (start, self.active)
            expected = [
                (sqn, kg, d)
                for sqn in sorted(self.change_sets)
                if sqn >= start
                for kg, d in self.change_sets[sqn]
            ]
            assert read_changes(storage, handle) == expected
            self.last = handle

        @precondition(lambda self: self.lowest > self.initial)
        @rule()
        def persist_below_truncation(self):
            try:
                self.writer.persist(self.lowest - 1, self.checkpoint + 1)
            except TruncatedError:
                return
            raise AssertionError("persist below the truncation point did not raise TruncatedError")

        @rule(data=st.data())
        def truncate(self, data):
            before = data.draw(st.integers(self.lowest, self.active), label="before")
            self.writer.truncate(before)
            self.lowest = before
            for sqn in [s for s in self.change_sets if s < before]:
                del self.change_sets[sqn]

        @rule(data=st.data())
        def confirm_or_reset(self, data):
            start = data.draw(st.integers(self.initial, self.active), label="start")
            end = data.draw(st.integers(start, self.active), label="end")
            if data.draw(st.booleans(), label="confirm"):
                self.writer.confirm(start, end, self.checkpoint)
            else:
                self.writer.reset(start, end, self.checkpoint)

        @invariant()
        def last_appended(self):
            if self.counter:
                assert self.writer.last_appended_sqn() is not None

        def teardown(self):
            self.writer.close()

    run_state_machine_as_test(
        WriterModel,
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
