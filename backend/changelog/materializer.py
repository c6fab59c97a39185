"""Runs materializations of one backend: background, one at a time, failures counted."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from dstl.spi import ConfigError, InvalidHandleError, StorageError

from ..delegate import SECTION_ENTRIES, StateView
from ..documents import check_regular_file
from ..materialization import MaterializationRef, read_sections
from ..options import (
    CHANGELOG_MATERIALIZATION_BRIDGE,
    CHANGELOG_MATERIALIZATION_FULL_EVERY,
    CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS,
)
from ..pacing import pace, paced
from .changed_keys import ChangedKeys, ChangedKeysView
from .sections import OpenedSnapshot, load_runs, load_section, replaced_key_groups
from .snapshot_choice import SnapshotChoice
from .snapshot_encoding import Expiry, SnapshotEncoding

if TYPE_CHECKING:
    from dstl.spi import KeyGroupRange

    from ..delegate import StateDelegate

log = logging.getLogger(__name__)


class ChainPosition(NamedTuple):
    """The snapshot chain a checkpoint stands on, read at one moment (a completion moves all of it)."""

    #: The chain's newest snapshot if this materializer uploaded it (the log continues there).
    own: MaterializationRef | None
    chain: tuple[MaterializationRef, ...]
    bridge: tuple[MaterializationRef, ...]


class MaterializationTarget(Protocol):
    """What a :class:`Materializer` needs of the state it snapshots (as Flink's ``MaterializationTarget``).

    :class:`~dstl.backend.changelog.ChangelogKeyedStateBackend` is one; tests use fakes.
    """

    @property
    def job_id(self) -> str:
        """The job: snapshots go under ``<job>/snapshots/``."""

    @property
    def operator_id(self) -> str:
        """The operator (instance) whose state this is."""

    @property
    def log_id(self) -> str:
        """The changelog the snapshots cover (names the snapshot objects)."""

    @property
    def key_groups(self) -> KeyGroupRange:
        """The key groups of the state."""

    @property
    def delegate(self) -> StateDelegate:
        """The working state: read for snapshots, written by loads."""

    def begin_materialization(self) -> int:
        """Make the log ready to continue after a snapshot taken now; returns the SQN it continues at."""

    def registrations(self) -> dict[str, tuple[str, str]]:
        """``name -> (kind, serializer)`` of the registered states."""

    def ttl_states(self) -> dict[str, tuple[str, float]]:
        """``name -> (kind, seconds)`` of the states with TTL (left out of full snapshots once expired)."""

    def clock(self) -> float:
        """The wall clock TTL is measured with."""


class Materializer:
    """Uploads snapshots of a target's delegate under ``snapshot_dir`` (any fsspec URL)."""

    def __init__(
        self,
        backend: MaterializationTarget,
        snapshot_dir: str | None,
        max_failures: int,
        full_every: int = CHANGELOG_MATERIALIZATION_FULL_EVERY.default,
        *,
        bridge: bool = CHANGELOG_MATERIALIZATION_BRIDGE.default,
        encoding: SnapshotEncoding | None = None,
        max_tracked_keys: int = CHANGELOG_MATERIALIZATION_MAX_TRACKED_KEYS.default,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._backend = backend
        self._dir = snapshot_dir
        self._storage_options = dict(storage_options or {})  # fsspec's, for snapshot_dir
        self._max_failures = max_failures
        self._lock = threading.Lock()
        self._running: Future[MaterializationRef] | None = None
        self._thread: threading.Thread | None = None
        self.chain: tuple[MaterializationRef, ...] = ()  # full snapshot, then incrementals
        # The previous chain plus an incremental at the full snapshot's SQN: equivalent to
        # ``chain[0]`` for a working copy that holds a state of the previous chain.
        self.bridge: tuple[MaterializationRef, ...] = ()
        self._bridging = bridge
        self._encoding = encoding or SnapshotEncoding()
        self._full_every = max(1, full_every)
        self._max_tracked = max_tracked_keys
        self._dirty = ChangedKeys(max_tracked_keys)
        # Keys changed in the log of a resumed snapshot: read (into a sink) only if an incremental needs them.
        self._dirty_in_resumed_log: Callable[[Callable[[str, int, bytes], None]], None] | None = None
        self._needs_full = True
        # TTL: (state, key group, key) of entries a full snapshot found expired, for the owner
        # to remove from its working state; and the clock of the last full snapshot.
        self._expired: list[tuple[str, int, bytes]] = []
        self._expired_in_flight: list[tuple[str, int, bytes]] = []
        self._last_full_clock = -math.inf
        self._made: set[str] = set()  # paths of the snapshots this materializer uploaded
        self.failures = 0  # consecutive
        self.read_bytes = 0  # what loading snapshots read of them (a restore skips what it need not read)
        self.failed = 0
        self.started = 0
        self.completed = 0
        self.last_duration = 0.0
        self.running_sqn = 0  # where the running (or last) materialization's log continues
        self._fs: Any = None
        self._root = ""

    def _filesystem(self) -> tuple[Any, str]:
        if self._dir is None:
            msg = "materialization needs a snapshot directory: set state.checkpoints.dir (snapshot_dir)"
            raise ConfigError(msg)
        if self._fs is None:
            import fsspec

            self._fs, root = fsspec.core.url_to_fs(self._dir, **self._storage_options)
            self._root = root.rstrip("/")
        return self._fs, self._root

    def _prefix(self) -> str:
        backend = self._backend
        return f"{backend.job_id}/snapshots/{backend.operator_id}/{backend.log_id}-"

    @property
    def latest(self) -> MaterializationRef | None:
        """The newest snapshot of the chain (its SQN is where the log continues)."""
        return self.chain[-1] if self.chain else None

    def changed(self, state: str, key_group: int, key: bytes) -> None:
        """Record a key changed or removed since the last snapshot (for incrementals)."""
        self._dirty.add(state, key_group, key)

    def changed_many(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> None:
        """:meth:`changed` for each key (the bulk write path)."""
        self._dirty.add_many(state, key_groups, keys)

    def forgo_tracking(self) -> None:
        """Track no changed key one by one (whole key groups): for an owner that never snapshots itself."""
        groups = self._backend.key_groups
        self._dirty.make_whole(range(groups.start, groups.end))

    @property
    def running(self) -> bool:
        """Whether a materialization is in progress."""
        return self._running is not None and not self._running.done()

    @property
    def own_latest(self) -> MaterializationRef | None:
        """The newest snapshot of the chain if this materializer uploaded it (the log continues there)."""
        latest = self.latest
        return latest if latest is not None and latest.path in self._made else None

    def position(self) -> ChainPosition:
        """:attr:`own_latest`, :attr:`chain` and :attr:`bridge` together: a completion never splits them."""
        with self._lock:
            return ChainPosition(self.own_latest, self.chain, self.bridge)

    def resumed(
        self,
        chain: tuple[MaterializationRef, ...],
        changed_since: Callable[[Callable[[str, int, bytes], None]], None],
        bridge: tuple[MaterializationRef, ...] = (),
    ) -> None:
        """Continue the snapshot chain of a warm working copy (see ``ChangelogKeyedStateBackend.resume``).

        The chain stays the base of incrementals when it is this log's own (same
        prefix, same key groups); ``changed_since(sink)`` calls ``sink(state, key group,
        key)`` for each key changed after it.
        """
        backend = self._backend
        own = bool(chain) and all(
            ref.path.startswith(self._prefix()) and ref.key_groups == backend.key_groups for ref in chain
        )
        self.chain = tuple(chain) if own else ()
        self.bridge = tuple(bridge) if own else ()
        self._needs_full = not own
        # the chain's full snapshot says when it last left expired state out (TTL cadence)
        full_clock = self.chain[0].clock if self.chain else None
        self._last_full_clock = full_clock if full_clock is not None else -math.inf
        self._dirty_in_resumed_log = changed_since if own else None

    def made(self, ref: MaterializationRef) -> bool:
        """Whether this materializer uploaded ``ref`` (only then may its writer truncate the log)."""
        return ref.path in self._made

    def take_expired(self) -> list[tuple[str, int, bytes]]:
        """``(state, key group, key)`` the last full snapshot found expired (once; then empty)."""
        with self._lock:
            found, self._expired = self._expired, []
        return found

    def check_health(self) -> None:
        """Fail the checkpoint when materialization keeps failing."""
        if self.failures > self._max_failures:
            msg = (
                f"materialization of {self._backend.operator_id!r} failed {self.failures} times in a row "
                f"(state.changelog.max-failures-allowed={self._max_failures}); the log cannot be truncated. "
                "Check state.checkpoints.dir"
            )
            raise StorageError(msg)

    def start(self) -> Future[MaterializationRef]:
        """Start a materialization unless one runs (then return that one).

        What the caller waits for is O(1): a view of the state (a read transaction on
        LMDB, copy-on-write on the heap) and the figures the choice of a full or an
        incremental snapshot needs. The keys changed in a resumed snapshot's log are
        read in the background, with the snapshot: that log grows until the next one.
        """
        fs, root = self._filesystem()
        with self._lock:
            if self._running is not None and not self._running.done():
                return self._running
            backend = self._backend
            began = time.perf_counter()
            sqn = self.running_sqn = backend.begin_materialization()
            dirty, self._dirty = self._dirty, ChangedKeys(self._max_tracked)
            resumed_log, self._dirty_in_resumed_log = self._dirty_in_resumed_log, None
            # Full when asked, every k-th time, or when the incrementals would reach the
            # size of a full snapshot: the chain then stays below twice the state.
            full_keys = self.chain[0].entries if self.chain else 0
            chain_keys = sum(ref.entries for ref in self.chain[1:])
            per_group = full_keys / max(len(range(backend.key_groups.start, backend.key_groups.end)), 1)
            ttl_states, now = backend.ttl_states(), backend.clock()
            # With TTL, a full snapshot at least every shortest TTL: only a full one finds (and
            # leaves out) what expired without being written since. A resumed chain's full
            # snapshot carries its clock (a chain from before that: the first one is full).
            shortest_ttl = min((ttl for _, ttl in ttl_states.values()), default=math.inf)
            ttl_due = bool(ttl_states) and now - self._last_full_clock >= shortest_ttl
            forced = self._needs_full or ttl_due or len(self.chain) >= self._full_every
            view = None
            try:
                view = backend.delegate.view()  # read section by section in the background
                bridging = self._bridging and bool(self.chain)
                choice = SnapshotChoice(view, resumed_log, forced, full_keys, chain_keys, per_group, bridging)
                context = (backend.registrations(), ttl_states, now)
                self._expired_in_flight = []
                future: Future[MaterializationRef] = Future()
                thread = threading.Thread(
                    target=self._choose_and_upload,
                    args=(fs, root, sqn, choice, context, future, dirty, began),
                    daemon=True,
                )
                self._running, self._thread = future, thread
                self.started += 1
                thread.start()
            except BaseException:
                self._hand_back(dirty, resumed_log)
                if view is not None:  # an open LMDB view would block the map from growing
                    view.close()
                raise
            return future

    def _hand_back(
        self, dirty: ChangedKeys, resumed_log: Callable[[Callable[[str, int, bytes], None]], None] | None
    ) -> None:
        """A materialization that did not happen returns the changes it took (caller holds the lock)."""
        self._dirty.update(dirty)
        if resumed_log is not None and self._dirty_in_resumed_log is None:
            self._dirty_in_resumed_log = resumed_log

    def _choose_and_upload(
        self,
        fs: Any,
        root: str,
        sqn: int,
        choice: SnapshotChoice,
        context: tuple[dict, dict[str, tuple[str, float]], float],
        future: Future,
        dirty: ChangedKeys,
        began: float,
    ) -> None:
        """The background half of :meth:`start`: full or incremental, then the upload."""
        view, resumed_log = choice.view, choice.resumed_log
        try:
            full = choice.forced or choice.outgrown(dirty)
            # An incremental (or the bridge of a full one) needs the keys changed in a resumed
            # snapshot's log: read that log once; a failed upload hands them back with ``dirty``.
            if (not full or choice.bridging) and resumed_log is not None:
                resumed_log(paced(dirty.add, SECTION_ENTRIES))
                resumed_log = None
                full = full or choice.outgrown(dirty)
            bridged = full and choice.bridging
            choice.detach_if_long(full, dirty)
            views: list[tuple[str, StateView]] = []
            if not full or bridged:
                views.append(("incr", ChangedKeysView(view, dirty, owns=not full)))
            if full:
                views.append(("full", view))
        except Exception as exc:
            view.close()
            with self._lock:
                self.failures += 1
                self.failed += 1
                self._hand_back(dirty, resumed_log)
            log.warning("materialization of %s failed: %s", self._backend.operator_id, exc)
            future.set_exception(StorageError(f"materialization failed: {exc}", retriable=True))
            return
        self._upload(fs, root, sqn, views, context, future, dirty, began)

    def _upload(
        self,
        fs: Any,
        root: str,
        sqn: int,
        views: list[tuple[str, StateView]],
        context: tuple[dict, dict[str, tuple[str, float]], float],
        future: Future,
        dirty: ChangedKeys,
        began: float,
    ) -> None:
        backend = self._backend
        full = views[-1][0] == "full"
        written: list[str] = []  # paths this attempt created: removed again if it fails
        try:
            refs = [self._write(fs, root, sqn, kind, view, context, written) for kind, view in views]
        except Exception as exc:
            for path in written:
                with contextlib.suppress(Exception):  # best effort: recovery removes what is left
                    fs.rm_file(path)
            with self._lock:
                self.failures += 1
                self.failed += 1
                self._dirty.update(dirty)  # still unsnapshotted
                self._needs_full = self._needs_full or full
            log.warning(
                "materialization of %s failed (%d in a row): %s", backend.operator_id, self.failures, exc
            )
            future.set_exception(StorageError(f"materialization failed: {exc}", retriable=True))
            return
        finally:
            for _, view in views:
                view.close()
        ref = refs[-1]
        with self._lock:
            if full:
                self._expired, self._expired_in_flight = self._expired_in_flight, []
                self._last_full_clock = context[2]
                # An incremental written next to the full snapshot bridges the previous chain.
                self.bridge = (*self.chain, refs[0]) if len(refs) == 2 else ()
                self.chain = (ref,)
            else:
                self.chain = (*self.chain, ref)
            self._made.update(r.path for r in refs)
            self._needs_full = False
            self._dirty_in_resumed_log = None  # now part of the chain
            self.failures = 0
            self.completed += 1
            self.last_duration = time.perf_counter() - began
        future.set_result(ref)

    def _write(
        self,
        fs: Any,
        root: str,
        sqn: int,
        kind: str,
        view: StateView,
        context: tuple[dict, dict[str, tuple[str, float]], float],
        written: list[str],
    ) -> MaterializationRef:
        """Stream one snapshot object of ``view`` (``kind`` is ``full`` or ``incr``), a section at a time.

        A full snapshot leaves out state whose TTL expired (that is where it is cleaned
        up); memory holds one key group's section, not the state. Where it is encoded:
        :class:`~.snapshot_encoding.SnapshotEncoding`.
        """
        registrations, ttl_states, now = context
        backend = self._backend
        meta: dict[str, Any] = {
            "sqn": sqn,
            "registrations": registrations,
            "key_groups": [backend.key_groups.start, backend.key_groups.end],
        }
        if isinstance(view, ChangedKeysView) and view.replaced_key_groups:
            meta["replaced_key_groups"] = view.replaced_key_groups
        relative = f"{self._prefix()}sqn{sqn}-{kind}-{uuid.uuid4().hex[:8]}.snap"
        path = f"{root}/{relative}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        key_groups = range(backend.key_groups.start, backend.key_groups.end)
        written.append(path)
        ttl = ttl_states if kind == "full" else {}
        expiry = Expiry(ttl, now, self._max_tracked, self._expired_in_flight)
        size, entries = self._encoding.write(fs, path, view, key_groups, meta, expiry)
        clock = now if kind == "full" else None
        return MaterializationRef(relative, backend.key_groups, sqn, size, entries, clock)

    def load(
        self, ref: MaterializationRef, key_groups: KeyGroupRange | None = None
    ) -> dict[str, tuple[str, str]]:
        """Apply ``ref``'s sections of ``key_groups`` (default: the backend's); returns its registrations."""
        return self.apply(self.open(ref, key_groups))

    def open(self, ref: MaterializationRef, key_groups: KeyGroupRange | None = None) -> OpenedSnapshot:
        """Read ``ref``'s meta and index; its sections of ``key_groups`` are read as :meth:`apply` loads."""
        fs, root = self._filesystem()
        job = self._backend.job_id
        if not ref.path.startswith(f"{job}/snapshots/"):
            msg = (
                f"snapshot reference {ref.path!r} lies outside {job}/snapshots/ of this job: a damaged or "
                "forged checkpoint document (it is not read)"
            )
            raise InvalidHandleError(msg)
        path = f"{root}/{ref.path}"
        wanted = key_groups or self._backend.key_groups
        where = f"{self._dir}/{ref.path}"
        try:
            check_regular_file(fs, path, f"snapshot {where}")
        except FileNotFoundError as exc:
            msg = f"snapshot {where} does not exist"
            raise StorageError(msg) from exc

        def read_range(start: int, end: int) -> bytes:
            try:
                data: bytes = fs.cat_file(path, start=start, end=end)
            except FileNotFoundError as exc:
                msg = f"snapshot {where} does not exist"
                raise StorageError(msg) from exc
            self.read_bytes += len(data)
            return data

        meta, sections = read_sections(read_range, wanted, where=where, size=ref.size)
        replaced = frozenset(
            key_group for key_group in replaced_key_groups(meta, where=where) if key_group in wanted
        )
        return OpenedSnapshot(meta, sections, where, replaced)

    def apply(
        self, opened: OpenedSnapshot, *, replaced_later: frozenset[int] = frozenset()
    ) -> dict[str, tuple[str, str]]:
        """Load an opened snapshot into the delegate; returns its registrations.

        :param replaced_later: key groups a later snapshot of the chain replaces whole:
            their sections are not read (what they hold would be dropped).
        """
        delegate = self._backend.delegate
        for key_group in opened.replaced - replaced_later:
            delegate.drop_key_group(key_group)  # the sections hold all that is left of it
        load = load_runs if opened.sections.columnar else load_section
        for key_group, body in opened.sections.excluding(replaced_later):
            load(delegate, key_group, body, opened.where)
            pace()  # a restore in the background (a standby copy's) gives way to the worker's task
        return {
            name: (kind, serializer)
            for name, (kind, serializer) in opened.meta.get("registrations", {}).items()
        }

    def discard(self, refs: Iterable[MaterializationRef]) -> None:
        """Remove snapshots of this log nothing will reference (best effort: recovery sweeps the rest)."""
        fs, root = self._filesystem()
        for ref in refs:
            if not ref.path.startswith(self._prefix()):
                continue  # only this log's own snapshots
            try:
                fs.rm_file(f"{root}/{ref.path}")
            except (OSError, FileNotFoundError) as exc:
                log.info("could not remove unreferenced snapshot %s: %s", ref.path, exc)

    def close(self) -> None:
        """Wait for a running materialization."""
        thread = self._thread
        if thread is not None:
            thread.join(60)
