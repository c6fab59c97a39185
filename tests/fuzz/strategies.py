"""Hostile inputs: valid documents mutated structurally, and raw bytes mutated."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

#: Values that break naive parsers: huge and negative ints, non-finite floats, wrong types.
hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 0, 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64, 2**80, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", " ", "..", "../../etc/passwd", "/abs", "a/../b", "x\x00y", "é", "\ud800"]),
)

hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            paths.extend(_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            paths.extend(_paths(value, (*prefix, index)))
    return paths


def _replace(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        copy = dict(doc)
        if delete and not rest:
            copy.pop(head, None)
        else:
            copy[head] = _replace(doc[head], rest, value, delete)
        return copy
    copy = list(doc)
    if delete and not rest:
        del copy[head]
    else:
        copy[head] = _replace(doc[head], rest, value, delete)
    return copy


@st.composite
def mutated_documents(draw: st.DrawFn, valid: Any) -> Any:
    """``valid`` with one to three places replaced by hostile values, or deleted."""
    doc = valid
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        doc = _replace(doc, path, draw(hostile_values), delete=bool(path) and draw(st.booleans()))
    return doc


@st.composite
def mutated_bytes(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with bytes flipped, cut, inserted or duplicated."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "repeat", "set"]))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[position : position + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[position:position] = draw(st.binary(max_size=16))
        elif kind == "repeat":
            data[position:position] = data[position : position + draw(st.integers(1, 64))]
        elif data:
            data[position] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80]))
    return bytes(data)


def json_inputs(valid: Any) -> st.SearchStrategy[str | bytes]:
    """Text of structurally mutated documents, raw mutations of the valid text, or anything."""
    text = json.dumps(valid).encode()
    return st.one_of(
        mutated_documents(valid).map(lambda doc: json.dumps(doc, allow_nan=True)),
        mutated_bytes(text),
        st.binary(max_size=200),
        st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth),
    )
