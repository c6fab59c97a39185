"""Validation of names that storages turn into file names, object keys or topic names."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import InvalidIdentifierError

if TYPE_CHECKING:
    from .types import KeyGroupRange

__all__ = ["MAX_NAME_LENGTH", "check_relative_path", "log_id_for", "validate_name"]

MAX_NAME_LENGTH = 200
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def validate_name(value: object, what: str) -> str:
    """Return ``value`` if it is safe as a single path component, else raise.

    Safe means: a string of letters, digits, ``.``, ``_`` and ``-`` that starts and
    ends with a letter or digit, contains no ``..`` and is at most
    :data:`MAX_NAME_LENGTH` long. (Ending with one keeps names composed from it,
    like the log id ``<operator>.kg0-128``, valid.)

    :param value: the candidate name (operator id, job id, log id, storage id).
    :param what: what the name is, for the error message.
    :raises InvalidIdentifierError: when the name could escape a directory or is empty.
    """
    if not isinstance(value, str):
        msg = f"{what} must be a string, got {type(value).__name__}"
        raise InvalidIdentifierError(msg)
    if len(value) > MAX_NAME_LENGTH or not _NAME.fullmatch(value) or ".." in value:
        msg = (
            f"{what} {value!r} is not a safe name: use 1-{MAX_NAME_LENGTH} letters, digits, "
            "'.', '_' or '-', starting and ending with a letter or digit, without '..' "
            "(names become file names, object keys and topic names)"
        )
        raise InvalidIdentifierError(msg)
    return value


_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")


def check_relative_path(value: str, what: str) -> str:
    """Return ``value`` if it is a relative ``/``-separated path that stays below its root.

    :raises InvalidIdentifierError: on absolute paths, ``..`` or ``.`` components,
        backslashes, URL schemes, empty components or control characters.
    """
    bad = (
        not value
        or value.startswith("/")
        or "\\" in value
        or "://" in value
        or (len(value) > 1 and value[1] == ":")
        or _CONTROL_CHARACTER.search(value) is not None
    )
    if not bad:
        parts = value.split("/")
        bad = any(part in ("", ".", "..") for part in parts)
    if bad:
        msg = (
            f"{what} {value!r} is not a safe relative path: locations must be relative "
            "to the storage's base and may not contain '..', '.', empty or absolute parts"
        )
        raise InvalidIdentifierError(msg)
    return value


def log_id_for(operator_id: str, key_groups: KeyGroupRange) -> str:
    """The log id of the writer of ``operator_id`` over ``key_groups``.

    :raises InvalidIdentifierError: when ``operator_id`` is not a safe name.
    """
    validate_name(operator_id, "operator id")
    return validate_name(f"{operator_id}.kg{key_groups.start}-{key_groups.end}", "log id")
