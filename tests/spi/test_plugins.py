import os
from pathlib import Path

import pytest

from dstl.spi import (
    ChangelogHandle,
    ConfigError,
    KeyGroupRange,
    PluginError,
    SequenceNumberRange,
    StorageRegistry,
    StorageSpec,
    UnknownStorageError,
    get_registry,
    load_storage,
    storage_for_handle,
)
from dstl.spi.memory import MemoryStorage
from dstl.spi.plugins import get_plugin_manager

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_storage_lists_installed():
    with pytest.raises(UnknownStorageError) as info:
        load_storage({"dstl.storage": "nope"}, job_id="job")
    assert "nope" in str(info.value)
    assert "memory" in info.value.installed
    assert "memory" in str(info.value)


def test_memory_is_registered_through_its_entry_point():
    spec = get_registry().get("memory")
    assert spec.distribution == "dstl"
    assert "fencing" in spec.capabilities
    assert get_plugin_manager().get_plugin("memory") is not None


def test_load_storage_picks_by_config(memory_config):
    with load_storage(memory_config, job_id="job") as storage:
        assert isinstance(storage, MemoryStorage)


def test_job_id_is_validated(memory_config):
    with pytest.raises(ValueError, match="not a safe name"):
        load_storage(memory_config, job_id="../../x")


def test_storage_for_handle_ignores_configured_storage(memory_config):
    handle = ChangelogHandle.create(
        storage_id="memory",
        log_id="op.kg0-1",
        key_groups=KeyGroupRange(0, 1),
        sqn_range=SequenceNumberRange(0, 0),
    )
    config = {**memory_config, "dstl.storage": "local"}  # the job switched storage since
    with storage_for_handle(handle, config) as storage:
        assert storage.identifier == "memory"


def test_storage_for_handle_of_uninstalled_storage():
    handle = ChangelogHandle.create(
        storage_id="cassandra",
        log_id="op.kg0-1",
        key_groups=KeyGroupRange(0, 1),
        sqn_range=SequenceNumberRange(0, 0),
    )
    with pytest.raises(UnknownStorageError, match="cassandra"):
        storage_for_handle(handle, {})


def test_duplicate_identifier_is_an_error():
    registry = StorageRegistry()
    registry.set_origin("dist-a", "1")
    registry.add(StorageSpec("x", "a:b", "one"))
    registry.set_origin("dist-b", "2")
    with pytest.raises(PluginError, match="dist-a and by dist-b"):
        registry.add(StorageSpec("x", "c:d", "two"))


def test_lazy_factory_reports_install_hint():
    spec = StorageSpec("x", "no_such_module_dstl:Storage", "x", install_hint="pip install 'dstl[x]'")
    with pytest.raises(PluginError, match=r"pip install 'dstl\[x\]'"):
        spec.resolve_factory()


def test_registry_view_is_read_only():
    with pytest.raises(TypeError):
        get_registry().storages()["evil"] = None  # type: ignore[index]


def test_hookspecs_are_documented_and_prefixed():
    from dstl.spi import hookspecs

    specs = [name for name in dir(hookspecs) if name.startswith("dstl_")]
    assert specs, "no hookspecs found"
    for name in specs:
        assert getattr(hookspecs, name).__doc__, f"hook {name} has no docstring"
    for name in get_plugin_manager().hook.__dict__:
        assert name.startswith("dstl_"), name


def test_env_plugin_declares_general_options(monkeypatch):
    from dstl.spi import Config, refresh_plugins

    monkeypatch.setenv("DSTL_PLUGINS", "tests.spi.extra_options_plugin")
    refresh_plugins()
    try:
        config = Config({"dstl.example.flush-interval": "250ms"})
        assert config["dstl.example.flush-interval"] == 0.25
        assert Config({})["dstl.example.flush-interval"] == 5.0
    finally:
        monkeypatch.delenv("DSTL_PLUGINS")
        refresh_plugins()
    with pytest.raises(ConfigError, match="unknown config key"):
        Config({"dstl.example.flush-interval": "1s"})


def test_broken_env_plugin_is_reported_not_fatal(monkeypatch):
    from dstl.spi import refresh_plugins

    monkeypatch.setenv("DSTL_PLUGINS", "no_such_module_for_dstl")
    refresh_plugins()
    try:
        registry = get_registry()
        assert "no_such_module_for_dstl" in registry.broken
        assert "memory" in registry.identifiers()
    finally:
        monkeypatch.delenv("DSTL_PLUGINS")
        refresh_plugins()


def test_a_plugin_adds_a_subcommand_and_the_built_in_ones_come_the_same_way():
    from tests.fixtures.thirdparty import run_dstl

    env = {**os.environ, "DSTL_PLUGINS": "tests.spi.extra_command_plugin", "PYTHONPATH": str(ROOT)}
    result = run_dstl(["hello", "world"], env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello world"
    listed = run_dstl(["--help"], env=env).stdout
    for command in ("hello", "demo", "inspect", "savepoint", "conformance", "storages", "config"):
        assert f"    {command}" in listed, (command, listed)
