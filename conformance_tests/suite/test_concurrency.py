"""Concurrency: many threads appending and persisting on one storage lose nothing."""

from __future__ import annotations

import threading
from collections import Counter

from dstl.conformance.testing import change_bytes, read_data
from dstl.spi import KeyGroupRange


def test_threads_append_and_persist_without_loss_or_duplicates(storage, sut):
    threads_n, rounds, per_round = 8, 12, 25
    handles = {}
    errors = []

    def work(n):
        try:
            writer = storage.create_writer(f"t{n}", KeyGroupRange(0, 32))
            for round_ in range(rounds):
                for index in range(per_round):
                    writer.append((n + index) % 32, change_bytes(f"t{n}", round_ * per_round + index))
                handles[n] = writer.persist(0, round_ + 1).result(timeout=sut.timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(sut.timeout * 2)
    assert not errors, errors
    for n in range(threads_n):
        got = read_data(storage, handles[n])
        expected = [change_bytes(f"t{n}", i) for i in range(rounds * per_round)]
        duplicates = [d for d, c in Counter(got).items() if c > 1]
        assert not duplicates, f"duplicated changes: {duplicates[:3]}"
        assert got == expected


def test_readers_run_while_writers_persist(storage, sut):
    writer = storage.create_writer("rw", KeyGroupRange(0, 4))
    writer.append(0, b"stable")
    stable = writer.persist(0, 1).result(timeout=sut.timeout)
    stop = threading.Event()
    failures = []

    def read_loop():
        while not stop.is_set():
            if read_data(storage, stable) != [b"stable"]:
                failures.append("stable handle changed while others persisted")
                return

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for round_ in range(20):
            writer.append(round_ % 4, change_bytes("more", round_))
            writer.persist(0, round_ + 2).result(timeout=sut.timeout)
    finally:
        stop.set()
        reader.join(sut.timeout)
    assert not failures
