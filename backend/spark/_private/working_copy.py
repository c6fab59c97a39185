"""The working state of one operator instance on this host: an LMDB file, a lock, a stamp.

Spark's Python workers are reused but not sticky to partitions, so the working
copy lives on local disk where any worker of the host opens it. The *stamp*
says which checkpoint the copy holds (a digest of that checkpoint's snapshot);
a task whose previous checkpoint matches the stamp continues from the copy
(warm path, nothing read back), any other task clears it and restores. The stamp
is removed before the copy changes and written after the checkpoint, so a task
that dies midway leaves no stamp and its successor restores.

The LMDB file is written without fsync. A stamp names the host's boot (Linux's
``boot_id``) and vouches for the copy only within that boot: until the host
restarts, every committed page is in its page cache, whichever process reads it,
so neither the environment nor the stamp is synced on a batch's path (at large
state that sync cost more than the batch's writes). After a host crash the copy
is restored. Where the boot is unknown, the order is made durable instead: the
stamp's removal is synced before the copy changes, and a new stamp is written only
after the environment was synced, then synced itself. Either way a stamp never
vouches for pages that may not have reached the disk.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from dstl.spi import DstlError
from dstl.spi.kit.durability import fsync_directory

from ...changelog import BackendSnapshot
from ...delegate import LmdbDelegate
from ...delegate.lmdb_records import LAYOUT
from ...documents import MAX_DOCUMENT_BYTES, parse_json

__all__ = [
    "WorkingCopy",
    "held_checkpoint",
    "open_regular_file",
    "snapshot_digest",
    "wait_for_snapshots",
    "write_atomically",
]

#: An instance's claim on materializing it (an exclusive ``flock`` while a snapshot runs).
MATERIALIZING_LOCK = "dstl-materializing.lock"

# One environment per path and process: LMDB forbids opening a file twice in a process.
_DELEGATES: dict[str, LmdbDelegate] = {}
EMPTY = "empty"
# The copies this thread holds exclusively: ``flock`` locks of two opens conflict even
# within a process, so a nested ``exclusive()`` of the same copy would wait for itself.
_HELD = threading.local()


@functools.cache
def host_boot() -> str | None:
    """This host's boot id (a new one at every start of the kernel); ``None`` where unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except (OSError, ValueError):
        return None


def snapshot_digest(snapshot: BackendSnapshot | None) -> str:
    """A digest of ``snapshot`` that survives a JSON round trip (``"empty"`` for no snapshot)."""
    return EMPTY if snapshot is None else snapshot.digest


def held_checkpoint(
    stamp: dict[str, Any] | None, base: BackendSnapshot | None, lineage: Sequence[str]
) -> tuple[bool, bool]:
    """``(warm, committed)`` of a copy stamped ``stamp`` (:meth:`WorkingCopy.stamp`).

    Warm: it holds the instance's ``base``. Committed: it holds one of ``lineage`` (the
    digests of the instance's recent committed snapshots), so it can catch up.
    """
    if stamp is None:
        return False, False
    return stamp["digest"] == snapshot_digest(base), stamp["digest"] in lineage


class WorkingCopy:
    """The LMDB working state of the instance named ``name`` under ``root``."""

    def __init__(self, root: str | Path, name: str, *, map_size: int) -> None:
        self.path = Path(root) / name
        self.path.mkdir(parents=True, exist_ok=True)
        self._stamp = self.path / "dstl-stamp.json"
        self._offer = self.path / "dstl-materialized.json"
        self._expired = self.path / "dstl-expired.json"
        key = str(self.path.resolve())
        if key not in _DELEGATES:
            _DELEGATES[key] = LmdbDelegate(self.path / "state", map_size=map_size)
        self.delegate = _DELEGATES[key]

    @contextmanager
    def exclusive(self, *, wait: bool = True) -> Iterator[bool]:
        """Hold the copy alone (a retried or speculative attempt of the same instance waits).

        Re-entrant within a thread: the kept output's check and the task it guards nest.
        Yields whether the copy is held: without ``wait``, ``False`` at once while another
        holds it (a standby refresh gives way to the instance's task).
        """
        held: set[Path] = _HELD.__dict__.setdefault("paths", set())
        if self.path in held:
            yield True
            return
        with _lock_file(self.path / "dstl.lock") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            held.add(self.path)
            try:
                yield True
            finally:
                held.discard(self.path)
                fcntl.flock(lock, fcntl.LOCK_UN)

    def claim_materialization(self) -> BinaryIO | None:
        """The host's claim on materializing this instance, or ``None`` while another task's runs.

        Spark's Python workers are not sticky: the instance's next batch may run in another
        worker process while a materialization of an earlier batch, paced into the gaps
        between batches, still runs there. A second one would repeat its work and, once the
        first is adopted, fail to read logs discarded meanwhile. The claim is an exclusive
        ``flock`` held until the caller closes it (the OS drops it with a dead process).
        """
        handle = _lock_file(self.path / MATERIALIZING_LOCK)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        return handle

    def stamp(self) -> dict[str, Any] | None:
        """``{"digest", "registrations", "snapshot"}`` of the checkpoint the copy holds, or ``None``.

        ``snapshot`` is the held :class:`BackendSnapshot` (``None`` in stamps that
        lack it): what a catch-up starts from.
        """
        try:
            doc = read_document(self._stamp)
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("digest"), str):
            return None
        if doc.get("layout") != LAYOUT:
            return None  # written by a version that lays records out otherwise: restore the copy
        if "boot" in doc and doc["boot"] != host_boot():
            return None  # unsynced, from before the host restarted: pages may not have reached the disk
        registrations = doc.get("registrations")
        if not isinstance(registrations, dict) or not all(
            isinstance(kinds, list) and len(kinds) == 2 and all(isinstance(part, str) for part in kinds)
            for kinds in registrations.values()
        ):
            return None  # damaged or hand-edited: the copy is at no known checkpoint, restore it
        held = None
        if doc.get("snapshot") is not None:
            try:
                held = BackendSnapshot.from_dict(doc["snapshot"])
            except DstlError:
                return None
            if snapshot_digest(held) != doc["digest"]:
                return None
        return {
            "digest": doc["digest"],
            "registrations": {k: tuple(v) for k, v in registrations.items()},
            "snapshot": held,
        }

    def offer(
        self,
        checkpoint: BackendSnapshot,
        rebased: BackendSnapshot,
        run_id: int,
        expired: Sequence[ExpiredKey] = (),
    ) -> None:
        """A materialization that ``checkpoint`` did not wait for completed as ``rebased``.

        A later task of the same run moves its checkpoint onto it (see :meth:`take_offer`).
        ``expired`` are the keys a full snapshot found expired (at most
        :data:`MAX_CARRIED_EXPIRED`): the next task removes them from the working state.
        The file is written atomically; a lost one only means the snapshot goes unused.
        """
        doc = {
            "run": run_id,
            "checkpoint": checkpoint.to_dict(),
            "rebased": rebased.to_dict(),
            "expired": _expired_doc(expired),
        }
        write_atomically(self._offer, json.dumps(doc).encode())

    def take_offer(self) -> Offer | None:
        """The newest background materialization, removed once read.

        Only a task of the same run may move onto it: a restarted job removes
        unreferenced snapshots at recovery.
        """
        try:
            doc = read_document(self._offer)
            self._offer.unlink(missing_ok=True)
            return offer_from_document(doc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError, TypeError, KeyError, DstlError):
            self._offer.unlink(missing_ok=True)  # damaged: the snapshot goes unused, nothing else
            return None

    def keep_expired(self, expired: Sequence[ExpiredKey]) -> None:
        """Expired keys a task had no budget left to remove: the instance's next task continues."""
        if expired:
            write_atomically(self._expired, json.dumps({"expired": _expired_doc(expired)}).encode())
        else:
            self._expired.unlink(missing_ok=True)

    def take_expired(self) -> list[ExpiredKey]:
        """What :meth:`keep_expired` kept (removed once read; damaged: nothing)."""
        try:
            doc = read_document(self._expired)
            self._expired.unlink(missing_ok=True)
            return _expired_keys(doc["expired"])
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError, TypeError, KeyError):
            self._expired.unlink(missing_ok=True)  # only hints: the next full snapshot finds them again
            return []

    def invalidate(self) -> None:
        """The copy is about to change: until :meth:`mark`, it is at no checkpoint (durably).

        Removing a stamp of this boot needs no sync: after a host crash it is not trusted
        anyway. A synced stamp (no boot in it) could come back after one: its removal is synced.
        """
        try:
            doc = read_document(self._stamp)
        except FileNotFoundError:
            return
        except (OSError, ValueError, RecursionError):
            doc = None
        self._stamp.unlink(missing_ok=True)
        if not isinstance(doc, dict) or not isinstance(doc.get("boot"), str):
            fsync_directory(self.path)

    def mark(self, snapshot: BackendSnapshot, registrations: dict[str, tuple[str, str]]) -> None:
        """The copy now holds exactly ``snapshot``: the stamp says so, atomically.

        It names this boot (trusted until the host restarts, nothing synced); where the
        boot is unknown, the environment is synced first and the stamp durably after it.
        """
        boot = host_boot()
        doc: dict[str, Any] = {
            "layout": LAYOUT,
            "digest": snapshot_digest(snapshot),
            "registrations": registrations,
            "snapshot": snapshot.to_dict(),
        }
        if boot is None:
            self.delegate.sync()
        else:
            doc["boot"] = boot
        write_atomically(self._stamp, json.dumps(doc).encode(), sync=boot is None)


#: ``(state name, key group, key bytes)`` a full snapshot found expired.
ExpiredKey = tuple[str, int, bytes]
#: Expired keys carried from one task to the next (the rest: found by the next full snapshot).
MAX_CARRIED_EXPIRED = 100_000


class Offer(NamedTuple):
    """A background materialization handed to the instance's next task."""

    run_id: int
    checkpoint: BackendSnapshot
    rebased: BackendSnapshot
    expired: list[ExpiredKey]


def offer_from_document(doc: Any) -> Offer | None:
    """The offer a ``dstl-materialized.json`` document holds; ``None`` when it is not one.

    :raises DstlError: on a damaged snapshot in it (and ``KeyError``/``TypeError`` on a
        document of another shape: the caller drops it).
    """
    checkpoint = BackendSnapshot.from_dict(doc["checkpoint"])
    rebased = BackendSnapshot.from_dict(doc["rebased"])
    if type(doc["run"]) is not int:
        return None
    return Offer(doc["run"], checkpoint, rebased, _expired_keys(doc.get("expired", [])))


def wait_for_snapshots(working_dir: str | os.PathLike[str], timeout: float = 60.0) -> bool:
    """Wait until no instance under ``working_dir`` still materializes; whether none does in ``timeout`` s.

    A stopped query's instances stay warm in Spark's Python workers, and a snapshot begun
    in its last batches goes on there in the background: wait before removing or copying
    the query's directories. ``working_dir`` is ``dstl.spark.working-dir`` on this host.
    """
    deadline = time.monotonic() + timeout
    for lock in sorted(Path(working_dir).rglob(MATERIALIZING_LOCK)):
        with _lock_file(lock) as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.05)
                    continue
                fcntl.flock(handle, fcntl.LOCK_UN)
                break
    return True


def _lock_file(path: Path) -> BinaryIO:
    """``path`` opened (created if missing) to ``flock``: a regular file of the copy, never a link.

    A link could create or lock a file outside the job, a FIFO hang the open: neither is
    opened, and the error names the entry to remove.
    """
    msg = f"{path} is not a regular file: remove it (the working copy recreates its lock files)"
    return os.fdopen(_open_entry(path, os.O_RDWR | os.O_CREAT, msg), "r+b")


def _open_entry(path: Path, flags: int, msg: str) -> int:
    """``path`` opened with ``flags``, never through a link nor blocking on a FIFO: a regular file.

    :raises DstlError: ``msg``, when the entry is a link, directory, FIFO or socket.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # a link, a directory, a FIFO
            raise DstlError(msg) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DstlError(msg)
    return fd


def read_document(path: Path) -> Any:
    """The JSON document in ``path``, read only if it is a regular file of a document's size.

    A FIFO would block the task, a link could lead anywhere, a huge file exhaust
    memory: each is refused with ``OSError``/``ValueError`` (the copy is then at
    no known checkpoint, or the hint is dropped).
    """
    with open_regular_file(path) as file:
        if os.fstat(file.fileno()).st_size > MAX_DOCUMENT_BYTES:
            msg = f"{path} is larger than the {MAX_DOCUMENT_BYTES} bytes a document may have"
            raise ValueError(msg)
        data = file.read(MAX_DOCUMENT_BYTES + 1)
    return parse_json(data, str(path))


def open_regular_file(path: Path) -> BinaryIO:
    """``path`` opened to read if it is a regular file, never through a link nor a FIFO.

    :raises OSError: it is missing or a link; ``ValueError``: it is no regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        msg = f"{path} is not a regular file"
        raise ValueError(msg)
    return os.fdopen(fd, "rb")


def write_atomically(path: Path, *parts: bytes | memoryview, sync: bool = False) -> None:
    """Replace ``path`` with ``parts``, in order, at once (``sync``: durably), never through a link.

    The temporary file is created anew (``O_EXCL``), so nothing written reaches another
    inode: a stale one of this process id is removed if it is a plain file with no
    other link; a link, hard link or other entry in its place is a :class:`DstlError`
    naming it. A failed write leaves no temporary file.
    """
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    msg = f"{temporary} is not a regular file: remove it (the working copy writes it anew; hard links too)"
    try:
        status = os.lstat(temporary)
    except FileNotFoundError:
        pass
    else:  # left by a dead process of the same id
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            raise DstlError(msg)
        temporary.unlink()
    fd = _open_entry(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, msg)
    try:
        with os.fdopen(fd, "wb") as file:
            for part in parts:
                file.write(part)
            file.flush()
            if sync:
                os.fsync(file.fileno())
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if sync:
        fsync_directory(path.parent)


def _expired_doc(expired: Sequence[ExpiredKey]) -> list[list[Any]]:
    return [[name, key_group, key.hex()] for name, key_group, key in expired[:MAX_CARRIED_EXPIRED]]


def _expired_keys(doc: Any) -> list[ExpiredKey]:
    """Parse carried expired keys; anything malformed is dropped (they are only hints, re-checked)."""
    found = []
    for item in doc[:MAX_CARRIED_EXPIRED] if isinstance(doc, list) else ():
        if (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and type(item[1]) is int
            and isinstance(item[2], str)
        ):
            try:
                found.append((item[0], item[1], bytes.fromhex(item[2])))
            except ValueError:
                continue
    return found
