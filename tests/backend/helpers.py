"""Helpers shared by the backend tests."""

from contextlib import contextmanager

from dstl.spi import KeyGroupRange


def owns_key(backend, key) -> bool:
    """Whether ``key`` belongs to the backend's key groups (and make it current if so)."""
    try:
        backend.set_current_key(key)
    except ValueError:
        return False
    return True


class _FailingFilesystem:
    """Stands in for the snapshot filesystem: every write fails (a materialization failure)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def pipe_file(self, *args, **kwargs):
        raise OSError("injected: snapshot store unavailable")

    def open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            raise OSError("injected: snapshot store unavailable")
        return self._real.open(path, mode, **kwargs)


@contextmanager
def failing_snapshot_store(backend):
    """Within the block, the backend's snapshot uploads fail."""
    materializer = backend.materializer
    materializer._filesystem()
    real = materializer._fs
    materializer._fs = _FailingFilesystem(real)
    try:
        yield
    finally:
        materializer._fs = real


def restored_counts(storage, checkpoints_dir, snapshot, config, *, epoch, keys=range(200)):
    """The ``count`` value state per key after restoring ``snapshot`` into a new backend of ``op``."""
    from dstl.backend.changelog import ChangelogKeyedStateBackend

    backend = ChangelogKeyedStateBackend(
        storage, "op", KeyGroupRange(0, 128), epoch=epoch, snapshot_dir=checkpoints_dir
    )
    backend.restore(snapshot, config)
    state = backend.value_state("count")
    values = {}
    for key in keys:
        backend.set_current_key(key)
        values[key] = state.value()
    backend.close()
    return values


class FakeTarget:
    """Working state and a log position, nothing else of a backend."""

    def __init__(self, delegate):
        self.job_id = "job"
        self.operator_id = "op"
        self.log_id = "op.kg0-8"
        self.key_groups = KeyGroupRange(0, 8)
        self.delegate = delegate
        self.sqn = 0

    def begin_materialization(self):
        self.sqn += 10
        return self.sqn

    def registrations(self):
        return {"v": ("value", "msgpack"), "m": ("map", "msgpack")}

    def ttl_states(self):
        return {}

    def clock(self):
        return 0.0


def stored_state(delegate):
    """Every ``(state, key group, key) -> entry`` of the states ``v`` and ``m`` in key groups 0-7."""
    return {
        (state, kg, key): entry
        for state in ("v", "m")
        for kg in range(8)
        for key, entry in delegate.entries(state, kg)
    }


def snapshot_bytes(sections, meta=b'{"sqn": 1}', count=None, codec=0, version=2):
    """A version-2 (or 3) snapshot built by hand from section bodies (hostile input is hand-made).

    ``sections`` holds ``(key group, stored body)`` or ``(key group, stored body, raw length)``.
    """
    import struct

    from google_crc32c import value as crc

    out = bytearray(b"DSTM" + bytes([version, codec, 0, 0]))
    index = b""
    for key_group, body, *raw_length in sections:
        raw = raw_length[0] if raw_length else len(body)
        index += struct.pack("<iQII", key_group, len(out), len(body) + 4, raw)
        out += body + struct.pack("<I", crc(body))
    meta_offset = len(out)
    out += meta + index
    sections_count = len(sections) if count is None else count
    out += struct.pack("<QIII4s", meta_offset, len(meta), sections_count, crc(meta + index), b"DSTE")
    return bytes(out)
