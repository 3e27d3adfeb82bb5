"""Which streams are online: ingest's heartbeats (wire.SourceStatus) say when each source last delivered a frame.

A stream goes offline when its source has delivered no frame for `offline_after_s`, whether the source stalls,
the camera is down and ingest keeps reconnecting, the source failed, or ingest itself stopped talking (no
heartbeat: its last word ages). It comes back online at the next heartbeat that reports a fresh frame. A source
that ended by itself (a file) is not offline. A stream is judged only once ingest has spoken of it.

While the daemon is not reading (its transport holds as many images as it may: backpressure), heartbeats wait in
the socket with the chunks, so silence says nothing about the sources: that time does not count (`deaf`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Stream:
    offline_after_s: float
    last_frame: float | None = None  # daemon wall time of the source's last frame
    ended: bool = False
    online: bool | None = None  # None: not judged yet
    away: bool = False  # moved to another daemon: its late chunks say nothing until a heartbeat comes here again


class Liveness:
    def __init__(self, offline_after_s: dict[str, float]):
        self._streams = {sid: _Stream(after) for sid, after in offline_after_s.items()}
        self._deaf_since: float | None = None

    def deaf(self, deaf: bool, now: float) -> None:
        """Whether the daemon is reading its socket now (False: backpressure). Time spent deaf is added to every
        stream's last frame once reading resumes."""
        if deaf and self._deaf_since is None:
            self._deaf_since = now
        elif not deaf and self._deaf_since is not None:
            lost = now - self._deaf_since
            self._deaf_since = None
            for s in self._streams.values():
                if s.last_frame is not None:
                    s.last_frame += lost

    def heard(self, stream: str, state: str, frame_age_s: float, received: float) -> None:
        """A heartbeat (times in the daemon's clock). Unknown streams are ignored."""
        s = self._streams.get(stream)
        if s is None:
            return
        s.away = False
        s.ended = state == "ended"
        last = received - frame_age_s
        s.last_frame = last if s.last_frame is None else max(s.last_frame, last)

    def frames(self, stream: str, captured_at: float) -> None:
        """A chunk arrived: its last frame was captured then (a heartbeat may lag behind it)."""
        s = self._streams.get(stream)
        if s is not None and not s.away:
            s.last_frame = captured_at if s.last_frame is None else max(s.last_frame, captured_at)

    def changes(self, now: float) -> list[tuple[str, bool, float]]:
        """(stream, online now, since when) for each stream whose state changed since the last call. An offline
        stream's "since" is its last frame (the outage began then). Nothing changes while the daemon is deaf."""
        if self._deaf_since is not None:
            return []
        out = []
        for sid, s in self._streams.items():
            if s.last_frame is None:
                continue
            online = s.ended or now - s.last_frame <= s.offline_after_s
            if online != s.online:
                first = s.online is None
                s.online = online
                if not (first and online):  # coming online at the start is not news
                    out.append((sid, online, now if online else s.last_frame))
        return out

    def forget(self, stream: str) -> None:
        """The stream left this daemon (cluster mode moved it): it is judged afresh if it comes back."""
        s = self._streams.get(stream)
        if s is not None:
            self._streams[stream] = _Stream(s.offline_after_s, away=True)

    def online(self, stream: str) -> bool | None:
        s = self._streams.get(stream)
        return None if s is None else s.online
