"""The conformance suite (TCK) every dstl storage must pass, and its runner.

Run it on any installed storage::

    dstl conformance ID [--config KEY=VALUE ...] [--junitxml PATH] [-k EXPR]
    pytest -p dstl.conformance --dstl-storage=ID [--dstl-config KEY=VALUE ...]

A storage plugin supplies its test environment through the
``dstl_conformance_environment`` hook and raw access through
``dstl_conformance_backdoor`` (a :class:`ConformanceBackdoor`); the capabilities
it declares decide which tests apply, the others are reported as not supported.
"""

from __future__ import annotations

import pytest

from ._private.pytest_plugin import (
    StorageUnderTest,
    dstl_environment,
    dstl_environment_dir,
    pytest_addoption,
    pytest_configure,
    pytest_runtest_setup,
    storage,
    sut,
)
from .backdoor import FORGERY_PADDING, ConformanceBackdoor


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a test as applying only to storages that declare every capability named.

    Built lazily, so importing this package never trips ``--strict-markers``.
    """
    return pytest.mark.dstl_requires(*capabilities)


__all__ = [
    "FORGERY_PADDING",
    "ConformanceBackdoor",
    "StorageUnderTest",
    "dstl_environment",
    "dstl_environment_dir",
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_setup",
    "requires",
    "storage",
    "sut",
]
