"""Reading JSON documents that come back from shared storage (untrusted)."""

from __future__ import annotations

import json
from typing import Any

from dstl.spi import InvalidHandleError

__all__ = ["load_document"]


def load_document(text: str | bytes, what: str, fields: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """Parse ``text`` as a JSON object whose ``fields`` exist with the given types.

    Missing optional fields are the caller's business (``doc.get``).

    :raises InvalidHandleError: naming ``what`` and the offending field.
    """
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        msg = f"{what} is not valid JSON: {exc}"
        raise InvalidHandleError(msg) from exc
    if not isinstance(doc, dict):
        msg = f"{what} must be a JSON object, got {type(doc).__name__}"
        raise InvalidHandleError(msg)
    for name, kind in fields.items():
        value = doc.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            msg = f"{what} field {name!r} is missing or of the wrong type: {value!r}"
            raise InvalidHandleError(msg)
    return doc
