"""dstl's own columns in the rows that travel between the driver and the instances' tasks."""

from __future__ import annotations

__all__ = [
    "EVENT_TIME_COLUMN",
    "HEARTBEAT_COLUMN",
    "INSTANCE_COLUMN",
    "KEY_GROUP_COLUMN",
    "REPORT_COLUMN",
    "WAKE_KEY_GROUP",
]

KEY_GROUP_COLUMN = "__dstl_key_group"
INSTANCE_COLUMN = "__dstl_instance"
#: The one row per instance that carries its :class:`~.protocol.InstanceReport` (null in output rows).
REPORT_COLUMN = "__dstl_report"
#: A row's event time in epoch ms (from the query's event-time column), added by the driver.
EVENT_TIME_COLUMN = "__dstl_event_ms"
#: The key group of a row that carries no data and only makes its instance run (a timer is due).
WAKE_KEY_GROUP = -1
#: Non-null only in the heartbeat rows that make batches run on an idle stream (dropped on the driver).
HEARTBEAT_COLUMN = "__dstl_heartbeat"
