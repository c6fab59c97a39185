"""The pytest plugin behind ``pytest -p dstl.conformance --dstl-storage=ID``."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dstl.spi import Config, ConfigError, StateChangelogStorage, get_registry, load_storage
from dstl.spi.config import parse_key_values
from dstl.spi.plugins import PLUGINS_ENV, get_plugin_manager

from ..backdoor import ConformanceBackdoor

SUITE_DIR = Path(__file__).resolve().parent.parent / "suite"
NOT_SUPPORTED = "not supported"
REQUIRES_MARKER = "dstl_requires"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--dstl-*`` options."""
    group = parser.getgroup("dstl", "dstl conformance suite")
    group.addoption("--dstl-storage", default=None, help="identifier of the storage under test")
    group.addoption(
        "--dstl-config", action="append", default=[], metavar="KEY=VALUE", help="config for the storage"
    )
    group.addoption(
        "--dstl-timeout", type=float, default=60.0, help="seconds a persist or read may take (default 60)"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; run the suite when a storage is named and no path was given."""
    config.addinivalue_line(
        "markers", f"{REQUIRES_MARKER}(capability): the test applies only to storages declaring it"
    )
    if config.getoption("dstl_storage") and config.args_source is not pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(SUITE_DIR)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Report tests whose capability the storage lacks as not supported."""
    identifier = item.config.getoption("dstl_storage")
    if not identifier:
        return
    capabilities = get_registry().get(identifier).capabilities
    for marker in item.iter_markers(REQUIRES_MARKER):
        for capability in marker.args:
            if capability not in capabilities:
                pytest.skip(
                    f"{NOT_SUPPORTED}: storage {identifier!r} does not declare capability {capability!r}"
                )


@dataclass
class StorageUnderTest:
    """The storage the suite checks: its identifier, config, capabilities and backdoor.

    Storages opened through :meth:`open` are closed when the test ends.
    """

    identifier: str
    base_config: dict[str, str]
    capabilities: frozenset[str]
    backdoor: ConformanceBackdoor | None
    workdir: Path
    timeout: float
    #: Where the storage's test environment keeps its files (local directories, a broker's data).
    environment_dir: Path | None = None
    job_id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:12]}")
    _opened: list[StateChangelogStorage] = field(default_factory=list)

    @property
    def config(self) -> dict[str, str]:
        """The config that selects and configures the storage under test."""
        return {**self.base_config, "dstl.storage": self.identifier}

    def open(
        self, job_id: str | None = None, overrides: Mapping[str, str] | None = None
    ) -> StateChangelogStorage:
        """A new storage instance of the job (a fresh one each call)."""
        storage = load_storage(Config({**self.config, **(overrides or {})}), job_id=job_id or self.job_id)
        self._opened.append(storage)
        return storage

    def abandon(self, storage: StateChangelogStorage) -> None:
        """Never close ``storage`` (its host crashed: closing would write what a crash cannot)."""
        self._opened.remove(storage)

    def require_backdoor(self) -> ConformanceBackdoor:
        """The backdoor, or a failure naming the missing hook."""
        if self.backdoor is None:
            pytest.fail(
                f"storage {self.identifier!r} declares a backdoor capability "
                "but implements no dstl_conformance_backdoor hook"
            )
        return self.backdoor

    def subprocess_env(self) -> dict[str, str]:
        """Environment for child processes: same plugins as this process."""
        return {**os.environ, PLUGINS_ENV: os.environ.get(PLUGINS_ENV, "")}

    def close(self) -> None:
        """Close every storage opened by the test."""
        while self._opened:
            with contextlib.suppress(Exception):
                self._opened.pop().close()


@pytest.fixture(scope="session")
def dstl_environment_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the storage's test environment works in, for the whole session."""
    return tmp_path_factory.mktemp(f"dstl-{request.config.getoption('dstl_storage') or 'none'}")


@pytest.fixture(scope="session")
def dstl_environment(request: pytest.FixtureRequest, dstl_environment_dir: Path) -> Iterator[dict[str, str]]:
    """Start the storage's backing service for the session; yields its config."""
    identifier = request.config.getoption("dstl_storage")
    if not identifier:
        pytest.skip("no --dstl-storage given")
    get_registry().get(identifier)  # unknown storage: a clear error, not a skip
    try:
        user = parse_key_values(request.config.getoption("dstl_config"), flag="--dstl-config")
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    env = get_plugin_manager().hook.dstl_conformance_environment(
        identifier=identifier, workdir=dstl_environment_dir
    )
    with env if env is not None else contextlib.nullcontext({}) as provided:
        yield {**dict(provided), **user}


@pytest.fixture
def sut(
    request: pytest.FixtureRequest,
    dstl_environment: dict[str, str],
    dstl_environment_dir: Path,
    tmp_path: Path,
) -> Iterator[StorageUnderTest]:
    """The storage under test, with a job id of its own."""
    identifier = request.config.getoption("dstl_storage")
    spec = get_registry().get(identifier)
    backdoor = get_plugin_manager().hook.dstl_conformance_backdoor(identifier=identifier)
    under_test = StorageUnderTest(
        identifier=identifier,
        base_config=dict(dstl_environment),
        capabilities=spec.capabilities,
        backdoor=backdoor,
        workdir=tmp_path,
        timeout=request.config.getoption("dstl_timeout"),
        environment_dir=dstl_environment_dir,
    )
    try:
        yield under_test
    finally:
        under_test.close()


@pytest.fixture
def storage(sut: StorageUnderTest) -> StateChangelogStorage:
    """An open instance of the storage under test."""
    return sut.open()
