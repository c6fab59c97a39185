"""An instance's output of its latest batch, kept so that a further read of the batch replays it.

The sink's first action over a batch's output runs the instances. A second action
(a sink that writes twice, a chained step's reads, the collection of reports a sink
left unread) runs the same tasks again, as Spark runs its own stateful operators
again for every action over a ``foreachBatch`` frame. Spark's state store reloads
the previous version then; the working copy cannot go back, so the task returns
what it returned the first time instead: the output and the report kept here,
beside the working copy, until the instance's next batch. Without this, every
batch's output would be ``localCheckpoint``-ed, which costs 70-100 ms a batch at
1,000-100,000 rows.

The file is read back as untrusted bytes: only a regular file holding an
uncompressed Arrow stream of the expected schema, for the same run, batch and
instance plan, is replayed; its decoded size is bounded by its stored size. Anything else is
ignored, with a warning, and the task runs the batch again from its base.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ...documents import MAX_DOCUMENT_BYTES, parse_json
from .protocol import TaskPlan
from .working_copy import open_regular_file, write_atomically

__all__ = ["KEPT_OUTPUT_FILE", "KeptKey", "keep_output", "kept_output"]

log = logging.getLogger(__name__)

#: The kept output, in the instance's working-copy directory.
KEPT_OUTPUT_FILE = "dstl-output.arrows"
_LENGTH = struct.Struct("<I")  # of the record that leads the file
#: Arrow's ``MessageHeader`` union: the only message kept besides the schema.
_RECORD_BATCH = 3


@dataclass(frozen=True)
class KeptKey:
    """Which batch an output belongs to: the run, the batch and the instance's own plan of it."""

    run_id: int
    batch_id: int
    #: a digest of the batch's plan token and the instance's encoded plan (its base, lineage,
    #: materialize and wake)
    plan_digest: str

    @classmethod
    def of(cls, plan: TaskPlan, instance: int) -> KeptKey:
        """The key of instance ``instance``'s batch in ``plan`` (its plan is not decoded).

        The plan's token keeps another query of the job that shares the working directory
        (a first batch's plan is the same in every fresh run) from replaying this output.
        """
        encoded = plan.instances.get(instance, "").encode()
        digest = hashlib.sha256(plan.batch_token.encode() + b"\0" + encoded).hexdigest()
        return cls(plan.run_id, plan.batch_id, digest)

    def to_dict(self) -> dict[str, Any]:
        """The key as the kept file records it."""
        return {"run": self.run_id, "batch": self.batch_id, "plan": self.plan_digest}


def keep_output(directory: Path, key: KeptKey, batches: list[Any], report: str) -> None:
    """Keep ``batches`` (the instance's output) and its encoded ``report`` for a replay of ``key``.

    The file is the record (its length, then JSON: the key and the report) and then the
    batches as an Arrow stream. Not synced, and a failed write is a warning: a file
    lost only means a further read runs the batch again from its base.
    """
    import pyarrow as pa

    record = json.dumps({**key.to_dict(), "report": report}).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    path = directory / KEPT_OUTPUT_FILE
    try:
        write_atomically(path, _LENGTH.pack(len(record)), record, memoryview(sink.getvalue()))
    except OSError as exc:  # the batch's state is persisted: a further read only runs it again
        log.warning("dstl: could not keep the output %s (%s); a further read runs the batch again", path, exc)


def kept_output(directory: Path, key: KeptKey, schema: Any) -> tuple[list[Any], str] | None:
    """The output batches and the encoded report kept for ``key``, or ``None`` (run the batch).

    Another batch's output costs reading its record only.

    :param schema: the Arrow schema of the output batches (the report column included).
    """
    path = directory / KEPT_OUTPUT_FILE
    try:
        with open_regular_file(path) as file:
            kept = _read(file, key, schema)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        kept = f"{exc}"
    if isinstance(kept, str):  # why it is not this batch's output ("": an earlier batch's)
        if kept:
            log.warning("dstl: ignoring the kept output %s (%s); the batch runs again", path, kept)
        return None
    return kept


def _read(file: BinaryIO, key: KeptKey, schema: Any) -> tuple[list[Any], str] | str:
    """The kept batches and report for ``key``, or why there are none (``""``: another batch's)."""
    import pyarrow as pa

    size = os.fstat(file.fileno()).st_size
    head = file.read(_LENGTH.size)
    length = _LENGTH.unpack(head)[0] if len(head) == _LENGTH.size else -1
    if not 0 < length <= min(MAX_DOCUMENT_BYTES, size - _LENGTH.size):
        return "no record of its batch"
    doc = parse_json(file.read(length), "the kept output's record")
    if not isinstance(doc, dict) or not isinstance(doc.get("report"), str):
        return "a damaged record of its batch"
    if {name: doc.get(name) for name in ("run", "batch", "plan")} != key.to_dict():
        return ""  # an earlier batch's (or run's) output: nothing to replay
    stream = pa.BufferReader(file.read(size - _LENGTH.size - length))  # bodies: slices of these bytes
    batches = []
    try:
        messages = pa.ipc.MessageReader.open_stream(stream)
        stored = pa.ipc.read_schema(messages.read_next_message())
        if not stored.equals(schema):
            return f"schema {stored} is not the output's {schema}"
        for message in messages:
            if message.type != "record batch" or _compressed(message.metadata.to_pybytes()):
                return f"a {message.type} message that is not an uncompressed record batch"
            batch = pa.ipc.read_record_batch(message, schema)
            batch.validate(full=True)  # offsets within the stored buffers
            batches.append(batch)
    except (pa.ArrowException, OSError, StopIteration, ValueError) as exc:  # pyarrow's IO errors: OSError
        return f"a damaged Arrow stream: {exc}"
    return (batches, doc["report"]) if batches else "no record batch"


def _compressed(metadata: bytes) -> bool:
    """Whether a record batch message's body is compressed (or its metadata is no record batch).

    Reads Arrow's ``Message`` flatbuffer: the ``header_type`` (field 1), the header
    table (field 2) and, in that ``RecordBatch``, its ``compression`` (field 3).
    Compressed bodies are refused: their decoded size is not bounded by the file's.
    """
    try:
        message = _table(metadata, _u32(metadata, 0))
        type_at = _field(metadata, message, 1)
        header_at = _field(metadata, message, 2)
        if not type_at or not header_at or metadata[message + type_at] != _RECORD_BATCH:
            return True
        header = _table(metadata, message + header_at + _u32(metadata, message + header_at))
        return _field(metadata, header, 3) != 0
    except (struct.error, IndexError, ValueError):
        return True


def _u32(data: bytes, at: int) -> int:
    if at < 0:
        raise ValueError(at)
    return int(struct.unpack_from("<I", data, at)[0])


def _table(data: bytes, at: int) -> int:
    """A flatbuffer table's position, checked to lie in ``data``."""
    if not 0 <= at <= len(data) - 4:
        raise ValueError(at)
    return at


def _field(data: bytes, table: int, index: int) -> int:
    """The offset of field ``index`` in ``table`` (0: absent), read from its vtable."""
    vtable = table - int(struct.unpack_from("<i", data, table)[0])
    if vtable < 0:
        raise ValueError(vtable)
    size = int(struct.unpack_from("<H", data, vtable)[0])
    slot = 4 + 2 * index
    return 0 if slot + 2 > size else int(struct.unpack_from("<H", data, vtable + slot)[0])
