"""A ready-made plugin object for storages: registration plus conformance hooks.

A storage distribution can expose one of these as its entry point target
(``name = "package.plugin:plugin"``) instead of writing the hooks itself.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from .hookspecs import hookimpl
from .registry import StorageRegistry, StorageSpec, resolve_dotted

if TYPE_CHECKING:
    from dstl.conformance import ConformanceBackdoor

__all__ = ["StoragePlugin"]


class StoragePlugin:
    """Registers ``spec`` and answers the conformance hooks for its identifier.

    :param environment: ``"module:callable"`` taking the run's work directory and
        returning a context manager that yields config (imported only when used).
    :param backdoor: ``"module:class"`` of the storage's :class:`ConformanceBackdoor`.
    """

    def __init__(
        self, spec: StorageSpec, *, environment: str | None = None, backdoor: str | None = None
    ) -> None:
        self.spec = spec
        self.environment = environment
        self.backdoor = backdoor

    @hookimpl
    def dstl_register_storages(self, registry: StorageRegistry) -> None:
        """Register the storage."""
        registry.add(self.spec)

    @hookimpl
    def dstl_conformance_environment(
        self, identifier: str, workdir: Path
    ) -> AbstractContextManager[dict[str, str]] | None:
        """The storage's test environment, when asked for this storage."""
        if identifier != self.spec.identifier or self.environment is None:
            return None
        what = f"conformance environment of {identifier!r}"
        return resolve_dotted(self.environment, what, self.spec.install_hint)(workdir)

    @hookimpl
    def dstl_conformance_backdoor(self, identifier: str) -> ConformanceBackdoor | None:
        """The storage's backdoor, when asked for this storage."""
        if identifier != self.spec.identifier or self.backdoor is None:
            return None
        return resolve_dotted(
            self.backdoor, f"conformance backdoor of {identifier!r}", self.spec.install_hint
        )()
