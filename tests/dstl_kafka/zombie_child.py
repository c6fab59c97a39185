"""The first writer of a log: persists, waits to be told, persists again, reports."""

import json
import sys

from dstl.spi import FencedError, KeyGroupRange, load_storage


def main() -> None:
    config = json.loads(sys.argv[1])
    storage = load_storage(config, job_id="zombie-job")
    writer = storage.create_writer("shared", KeyGroupRange(0, 4), epoch=1)
    writer.append(0, b"before fencing")
    first = writer.persist(0, 1).result(timeout=30)
    print(json.dumps({"event": "persisted", "handle": first.to_json()}), flush=True)
    sys.stdin.readline()  # the second writer now exists
    writer.append(0, b"zombie write")
    try:
        writer.persist(0, 2).result(timeout=30)
        print(json.dumps({"event": "not fenced"}), flush=True)
    except FencedError as exc:
        print(json.dumps({"event": "fenced", "error": str(exc)}), flush=True)
    storage.close()


if __name__ == "__main__":
    main()
