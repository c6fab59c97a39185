"""Export a stateful query's per-batch figures to Prometheus, under Flink's metric names.

.. code-block:: python

    exporter = PrometheusExporter(port=9249)        # Flink's reporter port; 0 picks one
    query.add_listener(exporter)                    # updated after every batch

Gauges and counters carry a ``query`` label (the job id). Names follow Flink's
changelog backend and checkpoint metrics (``lastCheckpointDuration``,
``lastCheckpointSize``, ``lastCheckpointFullSize``,
``numberOfStartedMaterialization``) and its DSTL upload metrics
(``numberOfUploadRequests``, ``numberOfUploadFailures``, ``uploadLatenciesNanos``),
with a ``dstl_`` prefix; dstl's own figures sit next to them. Needs
``pip install 'dstl[metrics]'``. The server listens on loopback unless an
address is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .progress import BatchProgress

__all__ = ["PrometheusExporter"]

#: gauge name -> its value from a batch's progress
_GAUGES: dict[str, tuple[str, Callable[[BatchProgress], float | None]]] = {
    "lastCheckpointDuration": ("slowest instance's checkpoint (persist), ms", lambda p: p.checkpoint_ms),
    "lastCheckpointSize": ("bytes uploaded for the latest checkpoint", lambda p: p.persisted_bytes),
    "lastCheckpointFullSize": (
        "bytes a restore of the latest checkpoint reads",
        lambda p: p.full_checkpoint_bytes,
    ),
    "lastRestoreDuration": ("slowest instance's restore in the latest batch, ms", lambda p: p.restore_ms),
    "uploadLatenciesNanos": (
        "slowest instance's upload latency p99, ns",
        lambda p: p.storage["upload_latency_p99_s"] * 1e9 if "upload_latency_p99_s" in p.storage else None,
    ),
    "lastBatchDuration": ("the latest batch, driver time, ms", lambda p: p.batch_ms),
    "lastBatchId": ("the latest completed batch", lambda p: p.batch_id),
    "currentWatermark": ("the event-time watermark the latest batch used, ms", lambda p: p.watermark_ms),
}
#: counter name -> its increment from a batch's progress
_COUNTERS: dict[str, tuple[str, Callable[[BatchProgress], float]]] = {
    "numberOfStartedMaterialization": ("materializations started", lambda p: len(p.materialized)),
    "numberOfUploadRequests": ("storage uploads", lambda p: p.storage.get("uploads", 0)),
    "numberOfUploadFailures": ("failed persists", lambda p: p.storage.get("persist_failures", 0)),
    "numberOfRestores": ("instances restored in full", lambda p: p.full_restores),
    "numberOfRecordsIn": ("input rows", lambda p: p.rows),
    "numberOfTimersFired": ("timers fired", lambda p: p.timers_fired),
    "numberOfLateRecordsDropped": ("rows dropped as late", lambda p: p.late_rows),
    "numberOfExpiredEntriesRemoved": ("state entries TTL removed", lambda p: p.expired_removed),
}


class PrometheusExporter:
    """A :meth:`~.query.StatefulQuery.add_listener` listener that keeps Prometheus metrics current.

    :param query: the ``query`` label (e.g. the job id).
    :param port: serve ``/metrics`` over HTTP on it (``0``: any free port, see
        :attr:`port`); ``None`` serves nothing (read :attr:`registry` yourself).
    :param address: where to listen (loopback by default).
    :param registry: a ``prometheus_client.CollectorRegistry`` (default: a new one).
    """

    def __init__(
        self,
        query: str = "dstl",
        *,
        port: int | None = None,
        address: str = "127.0.0.1",
        registry: Any = None,
    ) -> None:
        try:
            import prometheus_client
        except ImportError as exc:
            msg = "the Prometheus exporter needs prometheus-client: pip install 'dstl[metrics]'"
            raise ImportError(msg) from exc
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        self._query = query
        self._gauges = {
            name: prometheus_client.Gauge(f"dstl_{name}", doc, ["query"], registry=self.registry)
            for name, (doc, _) in _GAUGES.items()
        }
        self._counters = {
            name: prometheus_client.Counter(f"dstl_{name}", doc, ["query"], registry=self.registry)
            for name, (doc, _) in _COUNTERS.items()
        }
        self._server: Any = None
        self.port: int | None = None
        if port is not None:
            self._server, _ = prometheus_client.start_http_server(port, addr=address, registry=self.registry)
            self.port = self._server.server_port

    def __call__(self, progress: BatchProgress) -> None:
        """Take in one batch's figures."""
        for name, (_, value_of) in _GAUGES.items():
            value = value_of(progress)
            if value is not None:
                self._gauges[name].labels(self._query).set(value)
        for name, (_, amount_of) in _COUNTERS.items():
            amount = amount_of(progress)
            if amount:
                self._counters[name].labels(self._query).inc(amount)

    def close(self) -> None:
        """Stop serving ``/metrics``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
