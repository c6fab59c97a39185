"""The first writer of a log: persists until steady, waits to be told, persists again, reports."""

import json
import sys

from dstl.spi import FencedError, KeyGroupRange, load_storage

STEADY_PERSISTS = 4


def main() -> None:
    config = json.loads(sys.argv[1])
    storage = load_storage(config, job_id="zombie-job")
    writer = storage.create_writer("shared", KeyGroupRange(0, 4), epoch=1)
    writer.append(0, b"before fencing")
    first = writer.persist(0, 1).result(timeout=30)
    # The first persists ask for the claims; once the ledger knows the partition
    # is this process's alone, persists stop asking. Fencing must still happen.
    for checkpoint in range(2, STEADY_PERSISTS + 1):
        if checkpoint == STEADY_PERSISTS:
            asked_before = storage.metrics.counter("fencing_requests")
        writer.append(0, f"steady {checkpoint}".encode())
        writer.persist(0, checkpoint).result(timeout=30)
    steady_requests = storage.metrics.counter("fencing_requests") - asked_before
    assert storage.metrics.counter("uploads") >= STEADY_PERSISTS
    print(
        json.dumps({"event": "persisted", "handle": first.to_json(), "steady_requests": steady_requests}),
        flush=True,
    )
    sys.stdin.readline()  # the second writer now exists
    writer.append(0, b"zombie write")
    try:
        writer.persist(0, STEADY_PERSISTS + 1).result(timeout=30)
        print(json.dumps({"event": "not fenced"}), flush=True)
    except FencedError as exc:
        print(json.dumps({"event": "fenced", "error": str(exc)}), flush=True)
    storage.close()


if __name__ == "__main__":
    main()
