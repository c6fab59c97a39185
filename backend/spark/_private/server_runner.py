"""A query on Spark Connect: the ``foreachBatch`` function builds its runner where it runs.

Spark Connect pickles the function and calls it in a Python process of the
server, batch after batch. A :class:`~.runner.BatchRunner` holds locks, the
checkpoint coordinator and its driver lease, so it is never pickled: the client
sends :class:`ServerSideRunner` (the config and the query's spec), which builds
the runner on its first batch. The client runs no batch and cannot see the
runner, so each batch's figures are recorded (:class:`ProgressRecords`) under the
job's state directory, where the client reads them to join with Spark's progress.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from dstl.spi import Config

from ...documents import read_regular_file
from ...filesystems import checkpoint_fs, put_atomically
from ..progress import BatchProgress
from .runner import BatchRunner, QuerySpec

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import DataFrame

__all__ = ["PROGRESS_DIR", "LazyRunner", "ProgressRecords", "ServerSideRunner"]

#: Under the job's state directory (beside ``checkpoints``): one record per batch.
PROGRESS_DIR = "progress"
#: Records kept: Spark keeps 100 progress updates of a query (numRecentProgressUpdates).
KEPT_RECORDS = 100
#: A record is a few KB; anything larger is not one of ours.
_MAX_RECORD_BYTES = 1 << 20


class ProgressRecords:
    """Each batch's :class:`BatchProgress`, as a small JSON file per batch (the newest 100 kept).

    :param state_dir: ``state.checkpoints.dir`` (a path or fsspec URL).
    """

    def __init__(self, state_dir: str, job_id: str, config: Config | Mapping[str, Any] | None = None) -> None:
        self._fs, root = checkpoint_fs(state_dir, config)
        self.directory = f"{root}/{job_id}/{PROGRESS_DIR}"
        self._read: OrderedDict[int, BatchProgress] = OrderedDict()
        self._made = False  # the directory exists (created by the first write)

    def _path(self, batch_id: int) -> str:
        return f"{self.directory}/{batch_id}.json"

    def write(self, progress: BatchProgress) -> None:
        """Record ``progress`` (a replayed batch's record is replaced); forget the one 100 batches older."""
        if not self._made:
            self._fs.makedirs(self.directory, exist_ok=True)
            self._made = True
        put_atomically(self._fs, self.directory, self._path(progress.batch_id), progress.to_json().encode())
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm_file(self._path(progress.batch_id - KEPT_RECORDS))

    def read(self, batch_id: int) -> BatchProgress | None:
        """The record of ``batch_id`` (``None``: no batch of it ran state work, or it is forgotten).

        :raises InvalidHandleError: when the record is damaged (it names the file).
        """
        if batch_id in self._read:
            return self._read[batch_id]
        path = self._path(batch_id)
        try:
            data = read_regular_file(self._fs, path, f"progress record {path}", max_bytes=_MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        progress = BatchProgress.from_json(data, f"progress record {path}")
        self._read[batch_id] = progress
        while len(self._read) > KEPT_RECORDS:
            self._read.popitem(last=False)
        return progress


class LazyRunner:
    """A :class:`BatchRunner` built where it first runs, from the config and the query's spec.

    Pickled without the runner (it holds locks, the checkpoint coordinator and its
    driver lease): on Spark Connect the function runs in a Python process of the
    server, which builds its own. With ``records_progress`` the runner records
    every batch's figures (:class:`ProgressRecords`) for a client that cannot see it.
    """

    def __init__(self, cfg: Config, spec: QuerySpec, *, records_progress: bool) -> None:
        self._config = cfg.raw()
        self._spec = spec
        self._records_progress = records_progress
        self._runner: BatchRunner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "_runner"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runner = None

    @property
    def runner(self) -> BatchRunner:
        """The runner, built on first use."""
        if self._runner is None:
            runner = BatchRunner(Config.of(self._config), self._spec)
            if self._records_progress:
                records = ProgressRecords(runner.state_dir, self._spec.job_id, runner.cfg)
                runner.listeners.append(records.write)
            self._runner = runner
        return self._runner

    def progress_of(self, batch_id: int) -> BatchProgress | None:
        """The figures of ``batch_id`` (``None`` before the runner ran here)."""
        return None if self._runner is None else self._runner.progress_of(batch_id)


class ServerSideRunner(LazyRunner):
    """The ``foreachBatch`` function of a Connect query: its runner records every batch's progress."""

    def __init__(self, cfg: Config, spec: QuerySpec) -> None:
        super().__init__(cfg, spec, records_progress=True)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.runner(batch, batch_id)
