"""Fuzz every parser of untrusted input: only DstlError escapes (see ``oracle``).

Counts per parser are printed (``-s`` or the CI log) for the record.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.changelog.records import (
    Op,
    decode_change,
    decode_registration,
    encode_change,
    encode_registration,
)
from dstl.backend.checkpoints import CompletedCheckpoint
from dstl.backend.materialization.format import read_sections, write_snapshot
from dstl.spi import ChangelogHandle, Config, DstlError, KeyGroupRange, SequenceNumberRange
from dstl.spi.kit import checked_locations, decode_change_set, encode_change_set, iter_change_sets
from dstl.spi.kit.changeset_format import forge_change_set
from tests.fuzz.oracle import EXAMPLES, FUZZ_SETTINGS, VARIANTS, Tally, bounded_memory, variants
from tests.fuzz.strategies import hostile_values, json_inputs, mutated_bytes

_LOCATIONS = {
    "local": {"segment": "job/segments/seg-abc-00000001.log", "offset": 0, "length": 64, "sqn": 0},
    "filesystem": {"object": "job/data/abc-0000000000-a0.dstl", "offset": 8, "length": 64, "sqn": 0},
    "memory": {"object": "job/op.kg0-8/000000000001", "offset": 0, "length": 64, "sqn": 0},
    "kafka": {"topic": "t.job", "partition": 3, "first": 10, "last": 12, "sqn": 0, "writer": "w"},
}


def _reader_fields():
    from dstl.dfs._private.storage import DfsReader
    from dstl.kafka._private.storage import KafkaReader
    from dstl.local import LocalReader
    from dstl.spi.memory import MemoryStorageReader

    return {
        "local": LocalReader.location_fields,
        "filesystem": DfsReader.location_fields,
        "memory": MemoryStorageReader.location_fields,
        "kafka": KafkaReader.location_fields,
    }


def _handle(storage_id: str) -> ChangelogHandle:
    return ChangelogHandle.create(
        storage_id=storage_id,
        log_id="op.kg0-8",
        key_groups=KeyGroupRange(0, 8),
        sqn_range=SequenceNumberRange(0, 1),
        epoch=3,
        locations=[_LOCATIONS[storage_id]],
    )


def _fuzz(name, documents, parse, expand=None):
    """Run ``parse`` on :data:`EXAMPLES` documents under the oracle.

    Each drawn document also yields :data:`VARIANTS` - 1 byte-level variants
    (``expand(document, seed)`` for documents that are not bytes or text).
    """
    tally = Tally(name)

    def default_expand(document, seed):
        return variants(document, seed) if isinstance(document, bytes | str) else []

    @FUZZ_SETTINGS
    @given(documents, st.integers(0, 2**32))
    def run(document, seed):
        tally.check(lambda: parse(document))
        for variant in (expand or default_expand)(document, seed):
            tally.check(lambda variant=variant: parse(variant))

    with bounded_memory():
        run()
    print(tally.report())
    assert not tally.escapes, tally.escapes[:5]
    assert tally.runs >= EXAMPLES, f"only {tally.runs} documents were generated"


@pytest.mark.parametrize("storage_id", sorted(_LOCATIONS))
def test_handles_and_their_locations(storage_id):
    fields = _reader_fields()[storage_id]
    valid = json.loads(_handle(storage_id).to_json())
    _fuzz(
        f"handle+locations[{storage_id}]",
        json_inputs(valid),
        lambda text: checked_locations(ChangelogHandle.from_json(text), fields),
    )


def _checkpoint_doc() -> dict:
    snapshot = {
        "checkpoint_id": 4,
        "handles": [json.loads(_handle("local").to_json())],
        "materialized": [
            {"path": "job/snapshots/op/op.kg0-8-1.snap", "key_groups": [0, 8], "sqn": 1, "size": 9}
        ],
    }
    return {
        "version": 1,
        "checkpoint_id": 4,
        "snapshots": {"kg0-8": snapshot},
        "time": {"watermark_ms": 120_000, "next_timers": {"kg0-8": 130_000}},
    }


def _savepoint_doc() -> dict:
    full = {
        "checkpoint_id": 4,
        "handles": [],
        "materialized": [
            {"path": "job/snapshots/savepoint-4/instance-0.snap", "key_groups": [0, 8], "sqn": 0, "size": 9}
        ],
    }
    checkpoint = {**_checkpoint_doc(), "snapshots": {"kg0-8": full}}
    return {"version": 1, "job": "job", "max_parallelism": 128, "checkpoint": checkpoint}


def _offer_doc() -> dict:
    snapshot = _checkpoint_doc()["snapshots"]["kg0-8"]
    return {
        "run": 3,
        "checkpoint": snapshot,
        "rebased": {**snapshot, "handles": []},
        "expired": [["totals", 3, "6b6579"], ["__dstl.timers", 5, "00ff"]],
    }


def test_checkpoint_documents():
    _fuzz("checkpoint document", json_inputs(_checkpoint_doc()), CompletedCheckpoint.from_json)


def test_savepoint_documents():
    from dstl.backend.checkpoints.savepoints import Savepoint

    _fuzz("savepoint document", json_inputs(_savepoint_doc()), lambda text: Savepoint.from_json(text, "fuzz"))


def test_working_copy_offers_and_expired_key_hints():
    from dstl.backend.documents import parse_json
    from dstl.backend.spark._private.working_copy import offer_from_document

    def parse(text):
        # a document of another shape (KeyError, TypeError): the task drops it
        with contextlib.suppress(KeyError, TypeError):
            offer_from_document(parse_json(text, "fuzz"))

    _fuzz("working-copy offer", json_inputs(_offer_doc()), parse)


def test_backend_snapshot_documents():
    valid = _checkpoint_doc()["snapshots"]["kg0-8"]
    _fuzz("backend snapshot document", json_inputs(valid), BackendSnapshot.from_json)


_SECTIONS = {0: [["s", b"k", 1], ["s", b"l", [1, 2]]], 5: [["m", b"x", {"a": 1}]]}
_META = {"sqn": 3, "registrations": {"s": ["value", "msgpack"]}}
_SNAPSHOT = write_snapshot(_SECTIONS, _META)
_SNAPSHOT_ZSTD = write_snapshot(_SECTIONS, _META, "zstd")
_SNAPSHOT_LZ4 = write_snapshot(_SECTIONS, _META, "lz4")


def test_snapshot_objects():
    def parse(data):
        _, sections = read_sections(
            lambda start, end: data[start:end], KeyGroupRange(0, 8), where="fuzz", size=len(data)
        )
        list(sections)

    compressed = st.one_of(mutated_bytes(_SNAPSHOT_ZSTD), mutated_bytes(_SNAPSHOT_LZ4))
    bombs = st.sampled_from(_SNAPSHOT_BOMBS)
    _fuzz(
        "snapshot object",
        st.one_of(mutated_bytes(_SNAPSHOT), compressed, bombs, st.binary(max_size=300)),
        parse,
    )


def _snapshot_bombs() -> list[bytes]:
    """Valid snapshots whose one zstd section unpacks to far more arrays than any writer stores."""
    from tests.fuzz.test_bombs import _snapshot_with_section, _zstd_of_repeated

    shapes = [
        (b"\xdd" + (1 << 20).to_bytes(4, "big"), b"\x90", 1 << 20),  # a million empty arrays
        (b"\xdc\x10\x00", b"\xdc\x00\x40" + b"\x90" * 64, 4096),  # 4096 arrays of 64
    ]
    return [
        _snapshot_with_section(_zstd_of_repeated(head, unit, count), len(head) + len(unit) * count)
        for head, unit, count in shapes
    ]


_SNAPSHOT_BOMBS = _snapshot_bombs()
# A zstd body declaring (and holding) 64 MiB in ~2 KB: refused by the compression ratio.
_CHANGE_SET_BOMB = forge_change_set(
    "op.kg0-8", 3, 9, 1, zstandard.ZstdCompressor().compress(b"\0" * (64 << 20)), flags=2
)
# Odd SQNs are zstd frames (their bodies compress), even ones plain.
_FRAMES = b"".join(
    encode_change_set(
        "op.kg0-8", 3, sqn, [(sqn % 8, b"x" * 64 * sqn), (-1, b"meta")], codec="zstd" if sqn % 2 else "none"
    )
    for sqn in range(4)
)


def test_change_set_frames():
    def parse(document):
        data, offset = document
        list(iter_change_sets(data, location="fuzz"))
        decode_change_set(data, offset, location="fuzz", key_groups=(0, 4))

    frames = st.tuples(
        st.one_of(mutated_bytes(_FRAMES), st.just(_FRAMES + _CHANGE_SET_BOMB), st.binary(max_size=300)),
        st.integers(0, 400),
    )
    _fuzz(
        "change-set frame",
        frames,
        parse,
        expand=lambda document, seed: [(data, document[1]) for data in variants(document[0], seed)],
    )


_RECORDS = [
    encode_change(Op.VALUE_PUT, 1, b"key", {"v": 1}),
    encode_change(Op.MAP_PUT, 2, b"key", b"field", [1, 2]),
    encode_change(Op.CLEAR, 3, b"key"),
]
_REGISTRATION = encode_registration(1, "totals", "value", "msgpack")


def test_change_records():
    def parse(data):
        try:
            decode_change(data, where="fuzz")
        except DstlError:
            decode_registration(data, where="fuzz")

    records = st.one_of(*(mutated_bytes(r) for r in [*_RECORDS, _REGISTRATION]), st.binary(max_size=64))
    _fuzz("change record", records, parse)


def _declared_options():
    return [option for option in Config.of({}).declared_options() if not option.is_prefix]


def test_config_values():
    options = _declared_options()
    text_values = st.one_of(
        st.text(max_size=30),
        st.sampled_from(["nan", "inf", "-1", "0", " ", "1e400", "99999999999999999999", "5 mb", "10 min"]),
        st.integers().map(str),
        st.tuples(
            st.integers(0, 10**25), st.sampled_from(["", "ms", "s", "min", "h", "d", "kb", "mb", "gb", "tb"])
        ).map(lambda pair: f"{pair[0]}{pair[1]}"),
    )

    def other_options(pair, seed):  # the same value, for other options
        import random

        return [(option, pair[1]) for option in random.Random(seed).sample(options, VARIANTS - 1)]

    _fuzz(
        "config value",
        st.tuples(st.sampled_from(options), st.one_of(text_values, hostile_values)),
        lambda pair: Config.of({pair[0].name: pair[1]})[pair[0].name],
        expand=other_options,
    )


def _tree(root):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_local_reads_and_discards_of_forged_handles_stay_in_the_job(tmp_path):
    """Forged local handles: read and discarded, only DstlError, nothing outside the job touched."""
    from dstl.conformance.testing import persist, read_data
    from dstl.spi import load_storage

    outside = tmp_path / "outside.log"
    outside.write_bytes(b"DSTC" + b"\0" * 100)
    other_job = tmp_path / "dstl" / "other" / "segments"
    other_job.mkdir(parents=True)
    (other_job / "seg-aaaaaaaaaaaa-00000001.log").write_bytes(b"not yours")
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "dstl")}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KeyGroupRange(0, 8))
        writer.append(1, b"live")
        live = persist(writer, 0, 1)
        untouched = {k: v for k, v in _tree(tmp_path).items() if "/job/" not in k}

        def use(text):
            forged = ChangelogHandle.from_json(text)
            try:
                read_data(storage, forged)
            finally:
                storage.discard([forged])

        _fuzz("local read+discard of forged handles", json_inputs(json.loads(live.to_json())), use)
        after = {k: v for k, v in _tree(tmp_path).items() if "/job/" not in k}
        assert after == untouched, "a file outside the job's directory was touched"
