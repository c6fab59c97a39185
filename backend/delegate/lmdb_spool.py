"""A private copy of an LMDB read view, so that a long reader stops pinning the live file's pages.

LMDB never reuses a page that an open read transaction may still see. A materialization
that reads its view for minutes, paced into the gaps between batches, therefore makes
every page the batches rewrite meanwhile a new one: the file grows by about the pages a
batch touches, every batch, until the map must grow and the view is given up. A spool
copies the view's pages once (LMDB's compacting copy, in C and outside the GIL, at about
disk speed) into a directory beside the environment; the reader continues on the copy
and the live file reuses its pages again.

A spool is named after the process that made it: one left behind by a process that
died is removed when the environment is next opened; a live process's spool is not.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path

import lmdb

from ..pacing import give_way

__all__ = ["copy_out", "open_copy", "remove_stale_spools"]

#: Between the environment's directory name and ``<pid>-<random>`` in a spool's name.
SPOOL_MARK = ".spool-"
#: A file this big takes a copy long enough (tens of ms and up, a core and the disk) to wait for
#: a gap between batches first; a smaller one is copied at once.
GIVE_WAY_BYTES = 64 << 20


def copy_out(env: lmdb.Environment, txn: lmdb.Transaction, path: str) -> tuple[Path, lmdb.Environment]:
    """Copy what ``txn`` sees of ``env`` (at ``path``) to a new spool; its directory and environment.

    The caller closes the environment and removes the directory when done.

    :raises lmdb.Error: the copy failed (e.g. the disk is full); nothing is left behind.
    :raises OSError: likewise.
    """
    info = env.info()
    if info["last_pgno"] * env.stat()["psize"] >= GIVE_WAY_BYTES:
        give_way()
    spool = Path(f"{path}{SPOOL_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    spool.mkdir()
    try:
        env.copy(str(spool), compact=True, txn=txn)
        return spool, open_copy(spool)
    except BaseException:
        shutil.rmtree(spool, ignore_errors=True)
        raise


def open_copy(directory: Path | str) -> lmdb.Environment:
    """A spool's environment: read-only and without a lock file (nothing writes a copy)."""
    return lmdb.open(str(directory), readonly=True, lock=False, max_dbs=0)


def remove_stale_spools(path: str) -> int:
    """Remove the spools of ``path``'s environment whose process is gone; how many were removed.

    Only directories named as spools are removed (a symbolic link or a file of such
    a name is left alone): the directory beside the environment may hold anything.
    """
    environment = Path(path)
    removed = 0
    try:
        candidates = list(environment.parent.iterdir())
    except OSError:
        return 0
    for entry in candidates:
        pid = _owner(entry.name, environment.name)
        if pid is None or _alive(pid):
            continue
        try:
            if not stat.S_ISDIR(entry.lstat().st_mode):
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed


def _owner(name: str, environment: str) -> int | None:
    """The pid in a spool's directory name, or ``None`` when ``name`` is not a spool of ``environment``."""
    prefix = f"{environment}{SPOOL_MARK}"
    if not name.startswith(prefix):
        return None
    pid, _, tag = name[len(prefix) :].partition("-")
    return int(pid) if pid.isdigit() and pid.isascii() and tag else None


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one we may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (or no such pid at all)
        return False
    except PermissionError:
        return True
    return True
