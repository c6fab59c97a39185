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
