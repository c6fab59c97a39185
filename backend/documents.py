"""Reading JSON documents that come back from shared storage (untrusted).

One strict reader for every document: bounded size and nesting, UTF-8 only,
duplicate keys refused (with plain ``json`` the last one silently wins), and only
:class:`~dstl.spi.InvalidHandleError` escapes, naming the document and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dstl.spi import InvalidHandleError
from dstl.spi.handle import reject_duplicate_keys

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_DOCUMENT_DEPTH",
    "check_fields",
    "check_regular_file",
    "list_directory",
    "load_document",
    "parse_json",
    "read_regular_file",
    "read_small_int",
]

#: Largest document read back (a checkpoint of 128 instances with long logs is far below).
MAX_DOCUMENT_BYTES = 16 << 20
#: Deepest nesting of objects and lists (dstl's own documents need 8).
MAX_DOCUMENT_DEPTH = 24


def parse_json(text: str | bytes, what: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse untrusted JSON ``text`` within the size and depth bounds.

    :raises InvalidHandleError: naming ``what`` and the problem.
    """
    if not isinstance(text, str | bytes | bytearray):
        msg = f"{what} must be text or bytes, got {type(text).__name__}"
        raise InvalidHandleError(msg)
    if len(text) > max_bytes:
        msg = f"{what} is {len(text)} bytes, more than the {max_bytes} a dstl document may have"
        raise InvalidHandleError(msg)
    try:
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8")
        doc = json.loads(text, object_pairs_hook=reject_duplicate_keys)
    except UnicodeDecodeError as exc:
        msg = f"{what} is not UTF-8 text: {exc}"
        raise InvalidHandleError(msg) from exc
    except RecursionError as exc:
        msg = f"{what} is nested deeper than {MAX_DOCUMENT_DEPTH} levels"
        raise InvalidHandleError(msg) from exc
    except ValueError as exc:
        msg = f"{what} is not valid JSON: {exc}"
        raise InvalidHandleError(msg) from exc
    _check_depth(doc, what)
    return doc


def check_regular_file(fs: Any, path: str, what: str) -> dict[str, Any]:
    """``path``'s listing entry, if it is a regular file (not a link, FIFO, device or directory).

    Reading a FIFO blocks for ever and a link may lead to ``/dev/zero`` or out of
    the job's directory: what comes back from shared storage is only read as a
    regular file.

    :raises InvalidHandleError: naming ``what`` when it is anything else.
    :raises FileNotFoundError: when it does not exist.
    """
    info = fs.info(path)
    if info.get("type") != "file" or info.get("islink"):
        msg = f"{what} is not a regular file (a link, FIFO, device or directory): it is not read"
        raise InvalidHandleError(msg)
    return dict(info)


def read_regular_file(fs: Any, path: str, what: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of regular file ``path``, reading at most ``max_bytes`` (+1 to tell it is longer).

    :raises InvalidHandleError: when it is no regular file or is longer than ``max_bytes``.
    :raises FileNotFoundError: when it does not exist.
    """
    size = check_regular_file(fs, path, what).get("size")
    if isinstance(size, int) and size > max_bytes:
        msg = f"{what} is {size} bytes, more than the {max_bytes} a dstl document may have"
        raise InvalidHandleError(msg)
    data = fs.cat_file(path, start=0, end=max_bytes + 1)
    if len(data) > max_bytes:
        msg = f"{what} is more than the {max_bytes} bytes a dstl document may have"
        raise InvalidHandleError(msg)
    return bytes(data)


def _check_depth(doc: Any, what: str) -> None:
    level: list[Any] = [doc]
    for _ in range(MAX_DOCUMENT_DEPTH + 1):
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return
    msg = f"{what} is nested deeper than {MAX_DOCUMENT_DEPTH} levels"
    raise InvalidHandleError(msg)


def check_fields(doc: Any, what: str, fields: Mapping[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """``doc`` as a JSON object whose ``fields`` exist with the given types (bool is no int).

    :raises InvalidHandleError: naming ``what`` and the offending field.
    """
    if not isinstance(doc, dict):
        msg = f"{what} must be a JSON object, got {type(doc).__name__}"
        raise InvalidHandleError(msg)
    for name, kind in fields.items():
        value = doc.get(name)
        if name not in doc or not isinstance(value, kind) or isinstance(value, bool):
            msg = f"{what} field {name!r} is missing or of the wrong type: {value!r:.80}"
            raise InvalidHandleError(msg)
    return doc


def load_document(
    text: str | bytes,
    what: str,
    fields: Mapping[str, type | tuple[type, ...]],
    *,
    max_bytes: int = MAX_DOCUMENT_BYTES,
) -> dict[str, Any]:
    """Parse ``text`` (:func:`parse_json`) as an object with ``fields`` (:func:`check_fields`).

    Missing optional fields are the caller's business (``doc.get``).
    """
    return check_fields(parse_json(text, what, max_bytes=max_bytes), what, fields)


def list_directory(fs: Any, directory: str) -> list[str]:
    """The paths in ``directory``; none when it does not exist (object stores have no empty directories)."""
    try:
        return list(fs.ls(directory, detail=False))
    except FileNotFoundError:
        return []


def read_small_int(fs: Any, path: str) -> int:
    """A small counter file's value (untrusted: 0 when it is not one)."""
    text = fs.cat_file(path, start=0, end=32)
    return int(text) if text.strip().isdigit() else 0
