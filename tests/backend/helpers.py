"""Helpers shared by the backend tests."""

from contextlib import contextmanager


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
