"""The session's listener hub: queries join and leave it without touching Spark's bus."""

from __future__ import annotations

from types import SimpleNamespace

from dstl.backend.spark._private.listener_hub import ListenerHub, hub_of


class Recorder:
    def __init__(self, hub: ListenerHub | None = None) -> None:
        self.events: list[tuple[str, object]] = []
        self.hub = hub

    def onQueryStarted(self, event):
        self.events.append(("started", event))

    def onQueryProgress(self, event):
        self.events.append(("progress", event))

    def onQueryIdle(self, event):
        self.events.append(("idle", event))

    def onQueryTerminated(self, event):
        self.events.append(("terminated", event))
        if self.hub is not None:
            self.hub.leave(self)  # from the bus's own thread, while the hub forwards


def test_members_get_every_event_and_may_leave_while_it_is_forwarded():
    hub = ListenerHub()
    leaving, staying = Recorder(), Recorder()
    leaving.hub = hub
    hub.join(leaving)
    hub.join(staying)
    for name in ("Started", "Progress", "Idle", "Terminated"):
        getattr(hub, f"onQuery{name}")(name)
    hub.onQueryProgress("after")
    assert [kind for kind, _ in leaving.events] == ["started", "progress", "idle", "terminated"]
    assert staying.events[-1] == ("progress", "after")
    hub.leave(leaving)  # again: nothing happens


class Session:
    def __init__(self, added: list) -> None:
        self.streams = SimpleNamespace(addListener=added.append)


def test_a_session_gets_one_hub_on_its_bus():
    added: list = []
    session = Session(added)
    assert hub_of(session) is hub_of(session)
    assert added == [hub_of(session)]
    assert hub_of(Session(added)) is not added[0]  # another session, another hub
