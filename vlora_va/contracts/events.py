"""The event row: something that happened, not only what was in a frame.

Result rows (results.py) say what one task saw in one chunk; event rows say what happened on a stream: a track
crossed a line, entered or left a zone or stayed too long in it, the stream went offline or came back. Both go
to every sink as one JSON object per line, told apart by "type" ("result" | "event").

    {"v":3,"type":"event","id":"k3x9a-17","event":"line_crossed","stream":"pedestrians","task":"detect","chunk":61,
     "line":"path","direction":"in","track_id":"k3x9a-4","class":"person","ts":61.4,
     "captured_at":"2026-11-26T10:15:30.123Z","box":[282.4,215.2,318.0,301.0],
     "counts":{"in":{"person":5},"out":{"person":3}},"counts_since":"2026-11-26T10:14:29.000Z","snapshot":null}

`event` is an open list: readers must accept names they do not know (later versions add some). `phase` says where
in a lifecycle an event is: zone_entered is a presence's "start" and zone_left its "end"; loitering has "start"
(the dwell time passed) and "end" (the track left); stream_offline is "start" and stream_online "end" of an
outage. line_crossed has no phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlora_va.contracts.results import RESULT_VERSION, iso_utc

EVENTS = ("line_crossed", "zone_entered", "zone_left", "loitering", "stream_offline", "stream_online", "stream_moved")
PHASES = ("start", "update", "end")


@dataclass(frozen=True)
class EventRecord:
    id: str  # unique across daemon restarts: "<run id>-<n>"
    event: str  # one of EVENTS, or a later name
    stream: str
    ts: float  # media time the event happened at
    captured_at: float | None  # wall time (daemon clock) of that frame
    task: str | None = None
    chunk: int | None = None
    phase: str | None = None  # one of PHASES where a lifecycle applies
    line: str | None = None
    zone: str | None = None
    direction: str | None = None  # lines: "in" | "out"
    track_id: str | None = None
    cls: str | None = None
    box: tuple[float, float, float, float] | None = None
    counts: dict | None = None  # the rule's running totals (see module docstring)
    counts_since: float | None = None  # wall time the totals started from
    snapshot: str | None = None  # path of the JPEG of the frame, box drawn
    extra: dict = field(default_factory=dict)  # e.g. {"dwell_s": 12.4} for loitering

    type = "event"  # every row has a type; result rows say "result"

    def __post_init__(self):
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"event phase must be one of {PHASES}, got {self.phase!r}")

    def to_json(self) -> dict:
        row = {"v": RESULT_VERSION, "type": "event", "id": self.id, "event": self.event}
        if self.phase:
            row["phase"] = self.phase
        row["stream"] = self.stream
        for key, value in (("task", self.task), ("chunk", self.chunk), ("line", self.line), ("zone", self.zone),
                           ("direction", self.direction), ("track_id", self.track_id), ("class", self.cls)):
            if value is not None:
                row[key] = value
        row["ts"] = round(self.ts, 4)
        row["captured_at"] = iso_utc(self.captured_at) if self.captured_at is not None else None
        if self.box is not None:
            row["box"] = [round(v, 1) for v in self.box]
        if self.counts is not None:
            row["counts"] = self.counts
            row["counts_since"] = iso_utc(self.counts_since) if self.counts_since is not None else None
        row["snapshot"] = self.snapshot
        row.update(self.extra)
        return row
