"""The main job end to end on every storage: SIGKILL mid-stream, restart, PASS vs a batch recomputation."""

import os
import subprocess
import sys

import pytest


def run_demo(tmp_path, config):
    command = [sys.executable, "-m", "dstl.spi.cli", "demo", "--seconds", "6", "--verify"]
    command += ["--workdir", str(tmp_path / "demo")]
    for key, value in config.items():
        command += ["--config", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "killed with SIGKILL" in done.stdout
    assert not (tmp_path / "demo" / "job-config.json").exists(), "the job's config (secrets) stayed on disk"
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["local", "filesystem"])
def test_driver_killed_and_restarted_gives_exact_state(tmp_path, storage):
    run_demo(tmp_path, {"dstl.storage": storage})
    if storage == "filesystem":  # with no dstl.dfs.base-path the log lives under the query's checkpoint
        assert any((tmp_path / "demo" / "checkpoint" / "dstl-dfs").rglob("*")), "no log under the checkpoint"


def test_a_failed_job_shows_dstls_error_not_sparks_trace():
    from dstl.backend.spark.demo.run import _failure_cause

    log = "\n".join(
        [
            "26/11/25 ERROR Executor: Exception in task 0.0",
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):",
            "dstl.spi.errors.ConfigError: dstl.dfs.base-path is not set: set it to an fsspec URL",
            *[f"\tat org.apache.spark.Frame{i}" for i in range(40)],
        ]
    )
    cause = "dstl.spi.errors.ConfigError: dstl.dfs.base-path is not set: set it to an fsspec URL"
    assert _failure_cause(log) == cause
    assert _failure_cause("a\nb\nplain failure") == "a\nb\nplain failure"


@pytest.mark.slow
def test_driver_kill_on_s3(tmp_path, s3_config):
    run_demo(tmp_path, s3_config)


@pytest.mark.slow
def test_driver_kill_on_kafka(tmp_path, kafka_config):
    run_demo(tmp_path, kafka_config)


def test_the_job_gets_its_config_from_a_private_file_not_its_command_line(tmp_path):
    from dstl.backend.spark.demo.run import _read_config, job_command

    secret = "s3-secret-that-ps-must-not-show"
    command, path = job_command(tmp_path, 5, {"dstl.storage": "filesystem", "dstl.dfs.s3.secret-key": secret})
    assert not any(secret in part for part in command)
    assert command[command.index("--config-file") + 1] == str(path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert _read_config(path)["dstl.dfs.s3.secret-key"] == secret
    job_command(tmp_path, 5, {})  # a second run replaces the file
    assert _read_config(path) == {}
    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(SystemExit, match="JSON object of strings"):
        _read_config(str(tmp_path / "bad.json"))


def test_the_demo_table_fits_an_80_column_terminal():
    from rich.console import Console

    from dstl.backend.spark.demo.run import _table

    row = {
        "run": 2,
        "batch_id": 12345,
        "rows": 100000,
        "keys_touched": 30000,
        "warm_instances": 12,
        "caught_up": 3,
        "full_restores": 1,
        "instances": 16,
        "restore_ms": 12345.6,
        "checkpoint_ms": 123.4,
        "persisted_bytes": 12345678,
        "full_checkpoint_bytes": 123456789,
        "materialized": ["kg0-64"],
    }
    console = Console(width=80, record=True)
    console.print(_table([row] * 3, "dstl demo: PySpark local-cluster[2,1,1024], storage filesystem"))
    text = console.export_text()
    assert "…" not in text, text
    for header in ("restore", "ckpt", "persist", "state", "w/c/f"):
        assert header in text
    assert "12/3/1" in text
