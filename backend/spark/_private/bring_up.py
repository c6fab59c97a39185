"""Bringing an instance's working copy to its base checkpoint: warm, rebased, caught up or restored."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, BinaryIO

from dstl.spi import Config

from ...changelog import BackendSnapshot, ChangelogKeyedStateBackend, rebase
from .protocol import Restore
from .working_copy import WorkingCopy

if TYPE_CHECKING:
    from ...changelog.materializer import Materializer

log = logging.getLogger(__name__)

__all__ = ["bring_up", "may_catch_up", "offer_when_done"]


def bring_up(
    backend: ChangelogKeyedStateBackend,
    copy: WorkingCopy,
    stamp: dict[str, Any] | None,
    previous: BackendSnapshot | None,
    *,
    warm: bool,
    committed: bool,
    cfg: Config,
    run_id: int,
) -> tuple[Restore, int]:
    """Bring the working copy to ``previous``; returns how and the bytes read.

    Warm: the copy is at ``previous`` already; rebased: also, and a background
    materialization of an earlier batch completed, so the checkpoint moves onto it.
    Caught up: it holds an earlier committed checkpoint of the same lineage (the
    instance ran elsewhere since), and only the log and incremental snapshots after
    it are applied. Otherwise
    the copy is cleared and restored in full (``fresh`` when there is no state yet).
    """
    offer = copy.take_offer()
    # Expired keys a full snapshot found: the offer's (newest) or what the last task left.
    expired = copy.take_expired()
    rebased = None
    if offer is not None and warm and previous is not None and offer.run_id == run_id:
        rebased = rebase(previous, offer.checkpoint, offer.rebased)
    if offer is not None:
        expired = offer.expired or expired
        if rebased is None:
            # Never to be referenced (only this offer could have): remove what it wrote.
            referenced = {
                *offer.checkpoint.references,
                *(previous.references if previous is not None else ()),
            }
            backend.materializer.discard([ref for ref in offer.rebased.references if ref not in referenced])
    if expired:
        backend.expect_expired(expired)  # hints only: each key is checked again before removal
    if warm:
        if previous is None:
            return Restore.WARM, 0
        backend.resume(rebased or previous, stamp["registrations"], cfg)  # type: ignore[index]
        return (Restore.REBASED if rebased else Restore.WARM), 0
    if may_catch_up(stamp, previous, committed=committed):
        assert stamp is not None and previous is not None  # for the type checker: may_catch_up says so
        read = backend.catch_up(stamp["snapshot"], previous, stamp["registrations"], cfg)
        if read is not None:
            return Restore.CAUGHT_UP, read
    copy.delegate.clear()
    if previous is None:
        return Restore.FRESH, 0
    read_before = backend.materializer.read_bytes  # the snapshots' parts it reads, not their sizes
    backend.restore(previous, cfg)
    return Restore.FULL, sum(
        h.size for h in previous.all_handles
    ) + backend.materializer.read_bytes - read_before


def may_catch_up(stamp: dict[str, Any] | None, previous: BackendSnapshot | None, *, committed: bool) -> bool:
    """Whether a copy stamped ``stamp`` may catch up to ``previous`` rather than restore in full.

    A catch-up is tried then (:func:`bring_up`); the log it needs may still be gone.
    """
    return committed and previous is not None and stamp is not None and stamp["snapshot"] is not None


def _offer(
    copy: WorkingCopy,
    checkpoint: BackendSnapshot,
    rebased: Future[BackendSnapshot],
    run_id: int,
    materializer: Materializer,
    claim: BinaryIO,
    offered: threading.Event,
) -> None:
    """Hand a completed background materialization (and what it found expired) to the next task."""
    try:
        copy.offer(checkpoint, rebased.result(), run_id, materializer.take_expired())
    except Exception as exc:
        log.warning("background materialization of %s failed: %s", copy.path.name, exc)
    finally:
        claim.close()  # the instance may materialize again
        offered.set()


def offer_when_done(
    copy: WorkingCopy,
    checkpoint: BackendSnapshot,
    rebased: Future[BackendSnapshot],
    run_id: int,
    materializer: Materializer,
    claim: BinaryIO,
) -> threading.Event:
    """Once a background materialization completes, offer it to the instance's next task.

    ``claim`` (:meth:`~.working_copy.WorkingCopy.claim_materialization`) is released then.
    Returns what is set once that is done (offered, or failed and logged).
    """
    offered = threading.Event()
    rebased.add_done_callback(
        lambda done: _offer(copy, checkpoint, done, run_id, materializer, claim, offered)
    )
    return offered
