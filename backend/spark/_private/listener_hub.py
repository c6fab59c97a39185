"""One listener per session on Spark's listener bus, handing events to the running dstl queries' bridges.

Queries join and leave the hub, not the bus: leaving is a local list change,
safe from any thread. PySpark's Connect client can deadlock when a listener
leaves its bus while the event stream ends (``remove`` joins the event thread
while holding the lock that thread takes on an error), and a classic listener's
removal is a JVM round trip; the hub stays on the bus for the session's life.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

__all__ = ["ListenerHub", "hub_of"]

_hubs: weakref.WeakKeyDictionary[Any, ListenerHub] = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


class ListenerHub(StreamingQueryListener):
    """Forwards every event of Spark's bus to the listeners that joined (each filters its own query)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: list[StreamingQueryListener] = []

    def join(self, listener: StreamingQueryListener) -> None:
        """``listener`` receives the events from now on."""
        with self._lock:
            self._members.append(listener)

    def leave(self, listener: StreamingQueryListener) -> None:
        """``listener`` receives no more events (nothing if it had left)."""
        with self._lock:
            if listener in self._members:
                self._members.remove(listener)

    def _forward(self, hook: str, event: Any) -> None:
        with self._lock:
            members = list(self._members)  # a member may leave while the hub forwards
        for member in members:
            getattr(member, hook)(event)

    def onQueryStarted(self, event: Any) -> None:
        """Forwarded."""
        self._forward("onQueryStarted", event)

    def onQueryProgress(self, event: Any) -> None:
        """Forwarded."""
        self._forward("onQueryProgress", event)

    def onQueryIdle(self, event: Any) -> None:
        """Forwarded."""
        self._forward("onQueryIdle", event)

    def onQueryTerminated(self, event: Any) -> None:
        """Forwarded."""
        self._forward("onQueryTerminated", event)


def hub_of(spark: Any) -> ListenerHub:
    """The session's hub, put on its listener bus the first time."""
    with _hubs_lock:
        hub = _hubs.get(spark)
        if hub is None:
            hub = ListenerHub()
            spark.streams.addListener(hub)
            _hubs[spark] = hub
        return hub
