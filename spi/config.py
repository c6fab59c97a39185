"""The flat, dot-separated configuration of dstl, validated against declared options.

Options are declared by the installed plugins (see :mod:`dstl.spi.hookspecs`).
Values come from a dict or from a Spark conf, where the same keys carry a
``spark.`` prefix (``spark.dstl.storage``). Unknown keys and bad values raise
:class:`~dstl.spi.ConfigError` naming the key, the expected form and the closest
valid key.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

from .errors import ConfigError
from .options import ConfigOption

__all__ = ["SPARK_PREFIX", "Config", "parse_key_values", "use_declared_options"]

SPARK_PREFIX = "spark."
#: Key namespaces dstl owns; a Spark conf's other keys are not dstl's business.
_OWN_NAMESPACES = ("dstl.", "state.")
_SECRET = re.compile(r"password|secret|token|credential|sasl\.|access[-_.]?key", re.IGNORECASE)


T = TypeVar("T")

def parse_key_values(pairs: Iterable[str], *, flag: str = "--config") -> dict[str, str]:
    """Parse command-line ``KEY=VALUE`` pairs.

    :raises ConfigError: naming ``flag`` when a pair has no ``=``.
    """
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            msg = f"{flag} expects KEY=VALUE, got {pair!r}"
            raise ConfigError(msg)
        values[key.strip()] = value.strip()
    return values


#: Where a config gets the declared options when it is not given any (the plugin registry,
#: installed by :mod:`dstl.spi.plugins`): config itself discovers nothing.
_declared: Callable[[], Iterable[ConfigOption]] | None = None


def use_declared_options(source: Callable[[], Iterable[ConfigOption]]) -> None:
    """Make ``source`` what configs built without ``options`` validate against."""
    global _declared
    _declared = source


class Config(Mapping[str, Any]):
    """Validated configuration: mapping of *set* keys to parsed values.

    :param values: raw values (strings with units, or typed values).
    :param options: the declared options; by default those of every installed plugin
        (from the source :func:`use_declared_options` installed: a config is a value and
        discovers no plugins itself).
    """

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        options: Iterable[ConfigOption] | None = None,
    ) -> None:
        if options is None:
            if _declared is None:
                msg = "no declared options to validate against: import dstl.spi (it installs the plugins')"
                raise ConfigError(msg)
            options = _declared()
        options = list(options)
        self._options = {opt.name: opt for opt in options if not opt.is_prefix}
        self._prefixes = {opt.name[:-1]: opt for opt in options if opt.is_prefix}
        self._aliases = {alias: opt.name for opt in options if not opt.is_prefix for alias in opt.aliases}
        self._alias_prefixes = {
            alias[:-1]: opt.name[:-1] for opt in options if opt.is_prefix for alias in opt.aliases
        }
        self._raw: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        given: dict[str, str] = {}  # option name -> the key it was given under
        for key, value in (values or {}).items():
            if not isinstance(key, str):
                msg = f"config keys must be strings, got {key!r}"
                raise ConfigError(msg)
            name = self._canonical(key)
            if name in given and given[name] != key and self._raw[name] != value:
                msg = (
                    f"{given[name]!r} and {key!r} both set {name!r}, to different values "
                    f"({self._raw[name]!r} and {value!r}): keep one"
                )
                raise ConfigError(msg)
            given[name] = key
            self._raw[name] = value
            self._values[name] = self.option(name).parse(key, value)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def of(cls, config: Config | Mapping[str, Any] | None) -> Config:
        """Return ``config`` if it is a :class:`Config`, else validate it into one."""
        if isinstance(config, Config):
            return config
        return cls(config or {})

    @classmethod
    def from_spark_conf(
        cls,
        conf: Any,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> Config:
        """Read ``spark.dstl.*`` and ``spark.state.*`` keys of a Spark conf.

        :param conf: a ``SparkConf``, a ``RuntimeConfig`` (``spark.conf``), or a
            mapping of Spark keys; anything with ``getAll()`` or ``items()``.
        :param extra: un-prefixed keys that override the conf.
        """
        if hasattr(conf, "getAll"):
            pairs = conf.getAll()
            items = pairs.items() if isinstance(pairs, Mapping) else pairs
        elif isinstance(conf, Mapping):
            items = conf.items()
        else:
            msg = f"cannot read a Spark conf from {type(conf).__name__}; pass SparkConf, spark.conf or a dict"
            raise ConfigError(msg)
        values: dict[str, Any] = {}
        for key, value in items:
            if key.startswith(SPARK_PREFIX) and key[len(SPARK_PREFIX) :].startswith(_OWN_NAMESPACES):
                values[key[len(SPARK_PREFIX) :]] = value
        values.update(extra or {})
        return cls(values)

    def with_values(self, values: Mapping[str, Any]) -> Config:
        """A new config with ``values`` set on top of this one's raw values."""
        return Config({**self._raw, **values}, options=self.declared_options())

    def under_checkpoint(self, location: str) -> Config:
        """This config with every unset option that defaults into a checkpoint location set there.

        Every storage's options are set, not only the chosen one's: handles written
        before a job switched storages stay readable.

        :param location: the job's checkpoint location (a path or fsspec URL).
        """
        defaults = {}
        for opt in self._options.values():
            if opt.under_checkpoint is not None and not self.get(opt.name):
                value = opt.under_checkpoint.value(location)
                if value is not None:
                    defaults[opt.name] = value
        return self.with_values(defaults) if defaults else self

    # -- lookup -----------------------------------------------------------------------------
    def option(self, key: str) -> ConfigOption:
        """The declared option for ``key`` (or an alias of it), or :class:`ConfigError` with a suggestion."""
        key = self._canonical(key)
        opt = self._options.get(key)
        if opt is not None:
            return opt
        for prefix, prefix_opt in self._prefixes.items():
            if key.startswith(prefix) and len(key) > len(prefix):
                return prefix_opt
        raise ConfigError(self._unknown_key_message(key))

    def _canonical(self, key: str) -> str:
        """The option name ``key`` stands for (itself unless it is an alias)."""
        name = self._aliases.get(key)
        if name is not None:
            return name
        for alias, prefix in self._alias_prefixes.items():
            if key.startswith(alias) and len(key) > len(alias):
                return prefix + key[len(alias) :]
        return key

    def _unknown_key_message(self, key: str) -> str:
        candidates = list(self._options) + [p + "*" for p in self._prefixes]
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
        message = f"unknown config key {key!r}."
        if close:
            message = f"unknown config key {key!r}; did you mean {close[0]!r}?"
        namespace = ".".join(key.split(".")[:2]) + "."
        if key.startswith("dstl.") and not any(c.startswith(namespace) for c in candidates):
            message += (
                f" No installed plugin declares options under {namespace!r}: is the storage plugin installed?"
            )
        return message + " Run 'dstl config' to list every option."

    @overload
    def get(self, key: ConfigOption[T], /) -> T: ...

    @overload
    def get(self, key: str, default: Any = None, /) -> Any: ...

    def get(self, key: str | ConfigOption[Any], default: Any = None, /) -> Any:
        """The parsed value of an option: set value, else the option's default.

        Code reads options through their typed constants (``config.get(OPTION)`` is
        typed by the option); a string key is for text that comes in (CLI, Spark conf).

        :raises ConfigError: when ``key`` is not a declared option.
        """
        if isinstance(key, ConfigOption):
            return self.get(key.name)
        key = self._canonical(key)
        if key in self._values:
            return self._values[key]
        opt = self.option(key)
        return opt.default if opt.default is not None else default

    def __getitem__(self, key: str) -> Any:
        """The parsed value of ``key`` (set or default)."""
        return self.get(key)

    def __iter__(self) -> Iterator[str]:
        """Iterate over the keys that were set explicitly."""
        return iter(self._values)

    def __len__(self) -> int:
        """Number of keys set explicitly."""
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` (or the option it is an alias of) was set explicitly."""
        return (self._canonical(key) if isinstance(key, str) else key) in self._values

    def with_prefix(self, prefix: str) -> dict[str, str]:
        """Keys set under a pass-through ``prefix``, with the prefix removed."""
        return {k[len(prefix) :]: v for k, v in self._values.items() if k.startswith(prefix)}

    def options_under(self, prefix: str) -> dict[str, Any]:
        """:meth:`with_prefix` for a library's keyword options (e.g. fsspec storage options).

        Values that read as JSON (``true``, ``8``, ``{...}``) are parsed, the rest kept as given.
        """
        found: dict[str, Any] = {}
        for key, value in self.with_prefix(prefix).items():
            try:
                found[key] = json.loads(value) if isinstance(value, str) else value
            except ValueError:
                found[key] = value
        return found

    def raw(self) -> dict[str, Any]:
        """The raw values as given (for passing the config to another process)."""
        return dict(self._raw)

    def declared_options(self) -> list[ConfigOption]:
        """Every option this config validates against."""
        return list(self._options.values()) + list(self._prefixes.values())

    def __repr__(self) -> str:
        """Show the explicitly set keys, secrets masked."""
        shown = {k: "***" if _SECRET.search(k) else v for k, v in self._raw.items()}
        return f"Config({shown!r})"
