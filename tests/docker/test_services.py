"""The conformance suite and the main job against Apache Kafka and MinIO in containers.

Run with ``pytest -m docker`` on a machine with a Docker engine; elsewhere these
tests are skipped with the reason (the same suites run on Tansu and moto).
"""

import subprocess
import sys
import uuid

import pytest

from tests.backend.spark.test_demo import run_demo

pytestmark = pytest.mark.docker


def conformance(storage, config):
    command = [sys.executable, "-m", "dstl.spi.cli", "conformance", storage]
    for key, value in config.items():
        command += ["--config", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def kafka_config(bootstrap):
    return {
        "dstl.storage": "kafka",
        "dstl.kafka.bootstrap.servers": bootstrap,
        "dstl.kafka.topic": f"t-{uuid.uuid4().hex[:10]}",
    }


def test_conformance_on_apache_kafka(docker_kafka_bootstrap):
    conformance("kafka", kafka_config(docker_kafka_bootstrap))


def test_conformance_on_minio(docker_s3_endpoint):
    conformance("filesystem", docker_s3_endpoint.config(prefix=f"c-{uuid.uuid4().hex[:8]}"))


def test_main_job_on_apache_kafka(tmp_path, docker_kafka_bootstrap):
    run_demo(tmp_path, kafka_config(docker_kafka_bootstrap))


def test_main_job_on_minio(tmp_path, docker_s3_endpoint):
    run_demo(tmp_path, {"dstl.storage": "filesystem", **docker_s3_endpoint.config(prefix="demo")})
