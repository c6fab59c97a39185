"""Conformance support of the ``kafka`` storage."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from dstl.conformance import ConformanceBackdoor


@contextlib.contextmanager
def kafka_environment(workdir: Path) -> Iterator[dict[str, str]]:
    """A broker (Tansu, or DSTL_TEST_KAFKA_BOOTSTRAP) and a topic prefix of the run's own."""
    from dstl.kafka.testing import kafka_broker

    with kafka_broker() as bootstrap:
        yield {"dstl.kafka.bootstrap.servers": bootstrap, "dstl.kafka.topic": f"dstl-{workdir.name}"}


class KafkaBackdoor(ConformanceBackdoor):
    """Kafka records cannot be edited or listed per job cheaply; only failure injection."""

    def unreachable_config(self, config: Mapping[str, str]) -> tuple[dict[str, str], float]:
        """A bootstrap address nobody listens on, with a short request timeout."""
        from dstl.dfs.testing import free_port

        return {
            "dstl.kafka.bootstrap.servers": f"127.0.0.1:{free_port()}",
            "dstl.kafka.request.timeout": "2s",
        }, 2.0 + 3.0
