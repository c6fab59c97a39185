"""The fsspec file system of state checkpoints and snapshots, with the job's storage options.

``state.checkpoints.storage-options.*`` keys pass through to fsspec (credentials,
an endpoint), so ``state.checkpoints.dir`` on GCS, Azure or MinIO needs nothing
from the environment. Values that read as JSON (``true``, ``8``, ``{...}``) are
passed as such, the rest as text (:meth:`Config.options_under`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping
from typing import Any

from dstl.spi import Config
from dstl.spi.kit.durability import fsync_directory

__all__ = [
    "STORAGE_OPTIONS_PREFIX",
    "checkpoint_fs",
    "put_atomically",
    "put_exclusively",
    "put_local_file",
    "storage_options",
]

STORAGE_OPTIONS_PREFIX = "state.checkpoints.storage-options."


def storage_options(config: Config | Mapping[str, Any] | None) -> dict[str, Any]:
    """The fsspec options set under ``state.checkpoints.storage-options.``."""
    return Config.of(config).options_under(STORAGE_OPTIONS_PREFIX) if config is not None else {}


def checkpoint_fs(url: str, config: Config | Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(file system, root path)`` of ``url`` with the config's checkpoint storage options."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **storage_options(config))
    return fs, root.rstrip("/")


def put_atomically(fs: Any, directory: str, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` under a temporary name in ``directory``, then move it there.

    Readers never see half a document. On failure the temporary is removed (best
    effort; recovery removes ``.tmp-*`` leftovers) and the ``OSError`` raised.
    """
    temporary = f"{directory}/.tmp-{uuid.uuid4().hex}"
    try:
        fs.pipe_file(temporary, data)
        fs.mv(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            fs.rm_file(temporary)
        raise


def put_exclusively(fs: Any, directory: str, path: str, data: bytes) -> None:
    """Create ``path`` holding ``data``, whole or not at all, unless it exists.

    On a local disk: written and synced under a temporary name, then hard-linked
    into place (``link`` fails on an existing name); elsewhere an exclusive create
    (a conditional put on S3, whose objects appear whole).

    :raises FileExistsError: when ``path`` exists (another writer created it).
    :raises OSError: when writing fails (no temporary is left behind).
    """
    from fsspec.implementations.local import LocalFileSystem

    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data, mode="create")
        return
    temporary = f"{directory}/.tmp-{uuid.uuid4().hex}"
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
        fsync_directory(directory)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def put_local_file(fs: Any, source: str, path: str) -> None:
    """Put the local file ``source`` at ``path`` on ``fs``; ``source`` is gone afterwards.

    On the same local file system it is renamed (not written a second time); elsewhere
    (another mount, S3, any fsspec URL) uploaded, then removed.
    """
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        try:
            os.rename(source, path)
        except OSError:  # another file system (EXDEV), or no such directory: copied instead
            pass
        else:
            return
    fs.put_file(source, path)
    os.unlink(source)
