"""docker/compose.yaml has the services, ports and environment the README documents (no engine needed)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
README = (ROOT / "README.md").read_text()
SERVICES = COMPOSE["services"]


def readme_services():
    section = README.split("## Docker (`docker/`)")[1].split("\n## ")[0]
    rows = re.findall(r"^\| ([a-z0-9-]+) \| [^|]+ \| ([^|]+) \|", section, re.M)
    return {name: {int(p) for p in re.findall(r"\d{4}", ports)} for name, ports in rows if name != "service"}


def published_ports(service):
    return {int(str(p).split(":")[0]) for p in service.get("ports", [])}


def test_every_documented_service_exists_with_its_ports():
    documented = readme_services()
    assert set(documented) == set(SERVICES)
    for name, ports in documented.items():
        assert published_ports(SERVICES[name]) == ports, name


def test_kafka_runs_in_kraft_mode_with_an_inside_and_an_outside_listener():
    env = SERVICES["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "KAFKA_ZOOKEEPER_CONNECT" not in env
    assert "kafka:19092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "localhost:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")


def test_jobs_run_the_main_job_against_the_stack():
    kafka_job = SERVICES["job-kafka"]
    assert "--storage kafka" in kafka_job["command"] and "kafka:19092" in kafka_job["command"]
    s3_job = SERVICES["job-s3"]
    assert "--storage filesystem" in s3_job["command"] and "s3://dstl/" in s3_job["command"]
    assert "http://minio:9000" in s3_job["command"]
    for job in (kafka_job, s3_job):
        assert job["environment"]["DSTL_SPARK_MASTER"] == "spark://spark-master:7077"
        assert "--verify" in job["command"]
        assert "data:/data" in job["volumes"]
    assert "data:/data" in SERVICES["spark-worker"]["volumes"]


def test_start_is_ordered_by_health_checks():
    for name in ("kafka", "minio", "spark-master"):
        assert SERVICES[name]["healthcheck"]["test"], name
    assert SERVICES["job-kafka"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert SERVICES["job-s3"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    assert SERVICES["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert "mc mb" in " ".join(SERVICES["minio-init"]["entrypoint"]) and "local/dstl" in " ".join(
        SERVICES["minio-init"]["entrypoint"]
    )


def test_only_minio_dev_defaults_are_committed_and_marked():
    text = (ROOT / "docker" / "compose.yaml").read_text()
    assert "LOCAL DEVELOPMENT DEFAULTS" in text
    secrets = set(re.findall(r"(?:PASSWORD|secret-access-key)[=:]\s*(\S+)", text))
    assert secrets == {"minioadmin"}


def test_the_image_installs_dstl_with_spark_and_java():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "openjdk-17" in dockerfile and "[kafka,s3,spark]" in dockerfile
    assert all(
        SERVICES[name]["build"]["dockerfile"] == "docker/Dockerfile" for name in ("spark-master", "job-s3")
    )
