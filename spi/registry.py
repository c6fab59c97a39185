"""The storage registry: what every installed storage plugin declared."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from .errors import PluginError, UnknownStorageError
from .names import validate_name
from .options import ConfigOption

if TYPE_CHECKING:
    from .config import Config
    from .storage import StateChangelogStorage

__all__ = ["KNOWN_CAPABILITIES", "StorageFactory", "StorageRegistry", "StorageSpec"]

StorageFactory = Callable[["Config", str], "StateChangelogStorage"]

#: Capabilities the conformance suite knows; plugins may declare others.
KNOWN_CAPABILITIES = frozenset(
    {
        "fencing",  # a newer epoch fences older writers
        "physical_truncation",  # discard frees the stored bytes
        "leak_check",  # the backdoor lists stored objects
        "survives_process_kill",  # persisted data outlives a SIGKILLed writer process
        "survives_power_loss",  # acknowledged data outlives a host crash (synced before acknowledged)
        "multi_process",  # several processes share one log (fencing across processes)
        "corruption_injection",  # the backdoor can damage stored bytes
        "forgery_injection",  # the backdoor can store forged change sets (dstl's format, valid checksums)
        "failure_injection",  # the backdoor can make the backing service unreachable
        "orphan_collection",  # collect_orphans deletes change data no live handle needs
        "metadata_check",  # the backdoor lists metadata (epoch files, markers, claims)
        "sync_failure_injection",  # the backdoor can make the next sync or upload fail once
        "subsecond_ages",  # collect_orphans ages objects to the millisecond (S3 counts whole seconds)
    }
)


@dataclass(frozen=True)
class StorageSpec:
    """What a storage plugin declares about one storage.

    :ivar identifier: the ``dstl.storage`` value (and the handle's ``storage_id``).
    :ivar factory: ``"module:attribute"`` or a callable ``(config, job_id) -> storage``;
        a string is imported only when the storage is created.
    :ivar options: the ``dstl.<name>.*`` options the storage reads.
    :ivar capabilities: e.g. ``fencing``, ``physical_truncation``, ``leak_check``,
        ``survives_process_kill``; the conformance suite runs the tests they enable.
    :ivar install_hint: the command that installs missing dependencies.
    """

    identifier: str
    factory: str | StorageFactory
    description: str
    options: tuple[ConfigOption, ...] = ()
    capabilities: frozenset[str] = frozenset()
    install_hint: str | None = None
    distribution: str = field(default="?", compare=False)
    version: str = field(default="?", compare=False)

    def __post_init__(self) -> None:
        """Validate the identifier and freeze the collections."""
        validate_name(self.identifier, "storage identifier")
        object.__setattr__(self, "options", tuple(self.options))
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))

    def resolve_factory(self) -> StorageFactory:
        """Import the factory, with an install hint when a dependency is missing."""
        if callable(self.factory):
            return self.factory
        return resolve_dotted(self.factory, f"storage {self.identifier!r}", self.install_hint)

    def create(self, config: Config, job_id: str) -> StateChangelogStorage:
        """Create the storage for ``job_id``."""
        return self.resolve_factory()(config, job_id)


def resolve_dotted(path: str, what: str, install_hint: str | None = None) -> Callable:
    """Import ``"module:attribute"``; errors name ``what`` and the install hint."""
    module_name, _, attribute = path.partition(":")
    try:
        target = importlib.import_module(module_name)
        for part in attribute.split(".") if attribute else ():
            target = getattr(target, part)
    except ImportError as exc:
        hint = f"; install it with: {install_hint}" if install_hint else ""
        msg = f"{what} cannot be loaded, a dependency is missing ({exc}){hint}"
        raise PluginError(msg) from exc
    except AttributeError as exc:
        msg = f"{what} declares {path!r}, which does not exist ({exc})"
        raise PluginError(msg) from exc
    return target  # type: ignore[return-value]


class StorageRegistry:
    """Storages by identifier, plus every declared config option.

    Plugins add to it during ``dstl_register_storages``; afterwards readers get a
    read-only view through :meth:`storages`.
    """

    def __init__(self) -> None:
        self._specs: dict[str, StorageSpec] = {}
        self._extra_options: list[ConfigOption] = []
        self._origin = ("?", "?")
        self.broken: dict[str, str] = {}

    def set_origin(self, distribution: str, version: str) -> None:
        """The distribution (and version) whose plugin registers the next storages."""
        self._origin = (distribution, version)

    def add(self, spec: StorageSpec) -> None:
        """Register ``spec``; a second storage with the same identifier is an error."""
        distribution, version = self._origin
        spec = dataclasses.replace(spec, distribution=distribution, version=version)
        existing = self._specs.get(spec.identifier)
        if existing is not None:
            msg = (
                f"storage {spec.identifier!r} is registered twice: by {existing.distribution} "
                f"and by {spec.distribution}; uninstall one of them"
            )
            raise PluginError(msg)
        self._specs[spec.identifier] = spec

    def add_options(self, options: Iterable[ConfigOption]) -> None:
        """Register options that belong to no single storage."""
        self._extra_options.extend(options)

    def storages(self) -> Mapping[str, StorageSpec]:
        """Read-only view of the registered storages."""
        return MappingProxyType(self._specs)

    def identifiers(self) -> list[str]:
        """Sorted identifiers of the registered storages."""
        return sorted(self._specs)

    def get(self, identifier: str) -> StorageSpec:
        """The spec of ``identifier``, or :class:`UnknownStorageError` listing the others."""
        spec = self._specs.get(identifier)
        if spec is None:
            raise UnknownStorageError(identifier, self._specs)
        return spec

    def options(self) -> list[ConfigOption]:
        """Every declared option, general ones first; names are unique."""
        seen: dict[str, ConfigOption] = {}
        for opt in self._extra_options + [o for s in self._specs.values() for o in s.options]:
            if opt.name in seen and seen[opt.name] != opt:
                msg = f"config option {opt.name!r} is declared twice with different definitions"
                raise PluginError(msg)
            seen[opt.name] = opt
        return list(seen.values())

    def __iter__(self) -> Iterator[StorageSpec]:
        """Iterate over the specs in identifier order."""
        return iter(self._specs[i] for i in self.identifiers())
