"""Model check: random operation sequences against a reference model of the contract.

Two writers of different logs (any epochs) interleave appends of arbitrary bytes
(also empty, as ``bytes``, ``bytearray`` or ``memoryview``), boundaries, persists,
truncations, confirms and resets; every persist must read back exactly what the
model holds, through ``read`` and ``read_change_sets``. Hypothesis shrinks a
failure to a minimal sequence of operations.
"""

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
_writer_index = st.integers(0, 1)
_buffers = st.sampled_from([bytes, bytearray, memoryview])
_data = st.one_of(st.just(b""), st.binary(min_size=1, max_size=64), st.binary(min_size=300, max_size=2000))


class _Log:
    """One writer and the model of its log."""

    def __init__(self, storage, epoch: int) -> None:
        self.writer = storage.create_writer(f"model-{next(_operators)}", KG, epoch=epoch)
        self.initial = self.writer.initial_sqn()
        self.active = self.initial
        self.open_changes: list[tuple[int, bytes]] = []
        self.change_sets: dict[int, list[tuple[int, bytes]]] = {}
        self.lowest = self.initial
        self.appended = False

    def rollover(self) -> None:
        if self.open_changes:
            self.change_sets[self.active] = self.open_changes
            self.open_changes = []
            self.active += 1

    def expected_from(self, start: int) -> list[tuple[int, int, bytes]]:
        wanted = [sqn for sqn in sorted(self.change_sets) if sqn >= start]
        return [(sqn, kg, d) for sqn in wanted for kg, d in self.change_sets[sqn]]


def _read_change_sets(storage, handle):
    reader = storage.create_reader()
    try:
        return [(sqn, kg, bytes(d)) for sqn, changes in reader.read_change_sets(handle) for kg, d in changes]
    finally:
        reader.close()


def test_writer_matches_reference_model(storage, sut):
    class WriterModel(RuleBasedStateMachine):
        @initialize(epochs=st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)))
        def start(self, epochs):
            self.logs = [_Log(storage, epoch) for epoch in epochs]
            self.checkpoint = 0

        @rule(which=_writer_index, key_group=st.integers(-1, 5), data=_data, buffer=_buffers)
        def append(self, which, key_group, data, buffer):
            log = self.logs[which]
            if key_group < 0:
                log.writer.append_meta(buffer(data))
            else:
                log.writer.append(key_group, buffer(data))
            log.open_changes.append((key_group, data))
            log.appended = True

        @rule(which=_writer_index)
        def boundary(self, which):
            log = self.logs[which]
            log.rollover()
            assert log.writer.next_sqn() == log.active

        @rule(which=_writer_index, data=st.data())
        def persist(self, which, data):
            log = self.logs[which]
            log.rollover()
            start = data.draw(st.integers(log.lowest, log.active), label="start")
            self.checkpoint += 1
            handle = log.writer.persist(start, self.checkpoint).result(timeout=sut.timeout)
            assert (handle.sqn_range.start, handle.sqn_range.end) == (start, log.active)
            expected = log.expected_from(start)
            assert read_changes(storage, handle) == expected
            assert _read_change_sets(storage, handle) == expected

        @precondition(lambda self: any(log.lowest > log.initial for log in self.logs))
        @rule(which=_writer_index)
        def persist_below_truncation(self, which):
            log = self.logs[which]
            if log.lowest == log.initial:
                return
            try:
                log.writer.persist(log.lowest - 1, self.checkpoint + 1)
            except TruncatedError:
                return
            raise AssertionError("persist below the truncation point did not raise TruncatedError")

        @rule(which=_writer_index, data=st.data())
        def truncate(self, which, data):
            log = self.logs[which]
            before = data.draw(st.integers(log.lowest, log.active), label="before")
            log.writer.truncate(before)
            log.lowest = before
            for sqn in [s for s in log.change_sets if s < before]:
                del log.change_sets[sqn]

        @rule(which=_writer_index, data=st.data())
        def confirm_or_reset(self, which, data):
            log = self.logs[which]
            start = data.draw(st.integers(log.initial, log.active), label="start")
            end = data.draw(st.integers(start, log.active), label="end")
            if data.draw(st.booleans(), label="confirm"):
                log.writer.confirm(start, end, self.checkpoint)
            else:
                log.writer.reset(start, end, self.checkpoint)

        @invariant()
        def last_appended(self):
            for log in getattr(self, "logs", ()):
                if log.appended:
                    assert log.writer.last_appended_sqn() is not None

        def teardown(self):
            for log in getattr(self, "logs", ()):
                log.writer.close()

    run_state_machine_as_test(
        WriterModel,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
