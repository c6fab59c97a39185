"""Appends and persists in a loop until killed; prints each completed persist's handle."""

import json
import random
import sys

from dstl.spi import KeyGroupRange, load_storage


def payload(run: str, index: int, size: int) -> bytes:
    head = f"{run}:{index}:".encode()
    return head + bytes((index * 7 + i) % 251 for i in range(size))


def main() -> None:
    directory, run = sys.argv[1], sys.argv[2]
    rng = random.Random(run)
    storage = load_storage(
        {"dstl.storage": "local", "dstl.local.dir": directory, "dstl.local.segment-size": "64kb"},
        job_id="crash",
    )
    writers = [storage.create_writer(f"{run}-op{n}", KeyGroupRange(0, 8)) for n in range(2)]
    counts = [0, 0]
    checkpoint = 0
    while True:
        checkpoint += 1
        for n, writer in enumerate(writers):
            for _ in range(rng.randrange(1, 40)):
                writer.append(counts[n] % 8, payload(f"{run}-{n}", counts[n], rng.randrange(0, 3000)))
                counts[n] += 1
            handle = writer.persist(writer.initial_sqn(), checkpoint).result()
            sys.stdout.write(json.dumps({"writer": n, "count": counts[n], "handle": handle.to_json()}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
