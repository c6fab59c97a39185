import subprocess
import sys

from tests.fixtures.thirdparty import run_dstl


def test_version():
    result = run_dstl(["--version"])
    assert result.returncode == 0
    assert result.stdout.startswith("dstl ")


def test_storages_lists_memory():
    result = run_dstl(["storages"])
    assert result.returncode == 0, result.stderr
    assert "memory" in result.stdout and "fencing" in result.stdout


def test_config_lists_options():
    result = run_dstl(["config"])
    assert result.returncode == 0
    assert "dstl.dfs.upload.timeout" in result.stdout and "dstl.storage" in result.stdout


def test_no_command_is_usage_error():
    assert run_dstl([]).returncode == 2


def test_bad_config_is_usage_error_with_message():
    result = run_dstl(
        ["demo", "--storage", "local", "--seconds", "0.1", "--config", "dstl.memory.namespce=x"]
    )
    assert result.returncode == 2
    assert "did you mean 'dstl.memory.namespace'" in result.stdout


def test_unknown_storage_exit_code():
    result = run_dstl(["demo", "--storage", "nope", "--seconds", "0.1"])
    assert result.returncode == 2
    assert "installed storages" in result.stdout


def test_demo_refuses_a_single_process_storage():
    result = run_dstl(["demo", "--storage", "memory", "--seconds", "1"])
    assert result.returncode == 2
    assert "lives in one process" in result.stdout and "multi_process" in result.stdout


def test_console_script_installed():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import shutil,sys,os; print(shutil.which('dstl', path=os.path.dirname(sys.executable)))",
        ],
        capture_output=True,
        text=True,
    )
    assert result.stdout.strip() != "None"


def test_piped_listings_are_whole_and_machine_readable():
    import json as _json

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "dstl.spi.cli", *args], capture_output=True, text=True, timeout=120
        )

    piped = run("config")  # stdout is a pipe: no 80-column cut
    assert "dstl.read-only" in piped.stdout
    lines = piped.stdout.splitlines()
    assert any("dstl.read-only" in line and "Open the storage only to read handles" in line for line in lines)
    options = _json.loads(run("config", "--json").stdout)
    assert any(o["key"] == "dstl.storage" and o["default"] == "local" for o in options)
    storages = _json.loads(run("storages", "--json").stdout)
    assert {"memory", "local", "filesystem", "kafka"} <= {s["identifier"] for s in storages["storages"]}


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``dstl config --json | head -1``: the reader is gone before the output is written."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as once head has exited
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dstl.spi.cli", "config", "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_inspect_of_a_missing_directory_is_a_clear_error(tmp_path, capsys):
    from dstl.spi.cli import main

    assert main(["inspect", str(tmp_path / "nonexistent")]) == 2
    assert "is no directory" in capsys.readouterr().out
