"""A later stateful step of a query: it reads the step before's output, batch by batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .server_runner import LazyRunner

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from dstl.spi import Config

    from ..processor import BatchClock
    from .runner import QuerySpec

__all__ = ["ChainedStep"]


class ChainedStep(LazyRunner):
    """The step before's next step: runs ``before`` (the per-row steps between) and then its own runner.

    Called by the step before in every batch, idle ones included (its timers may be
    due), with that step's clock: the batch's watermark is the query's.
    """

    def __init__(
        self,
        cfg: Config,
        spec: QuerySpec,
        before: Callable[[DataFrame], DataFrame],
        *,
        records_progress: bool,
    ) -> None:
        super().__init__(cfg, spec, records_progress=records_progress)
        self._before = before

    def __call__(self, output: DataFrame, batch_id: int, clock: BatchClock) -> None:
        self.runner(self._before(output), batch_id, clock)
