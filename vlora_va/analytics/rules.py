"""SceneRules: one stream's lines and zones, applied frame by frame to its tracked task's confirmed tracks.

    rules = SceneRules(stream.lines, stream.zones)
    hits = rules.update(ts, [TrackPoint("k3x9a-4", "person", (282.4, 215.2, 318.0, 301.0)), ...])  # every frame
    hits += rules.end(["k3x9a-4"], ts)                                 # the tracks the tracker ended
    rules.counts(), rules.occupancy()                                  # running totals, who is inside now

Frames come in media-time order (the tracker's order), each with all confirmed tracks seen in it. A Hit is what a
line (lines.py: crossings through the segment, hysteresis, direction) or a zone (zones.py: presence, loitering,
lifecycle pairs) says happened; counts always change, while a per-rule, per-track cooldown holds back hits that
would flood (see those modules for exactly which). The serving layer turns hits into event rows.

State is kept only for live tracks, in numpy tables with one row per track (so a frame is a few array operations,
not a loop over tracks x rules). `end` forgets a track and frees its row for the next one; a track not seen for
stale_after_s of media time is ended by the next update as if `end` had been called, a safety net for a caller that
misses an end (the tracker ends lost tracks far sooner). So a long-running stream holds state for the tracks in view.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from vlora_va.analytics.rule_parts import Hit, TrackPoint, snapshot
from vlora_va.analytics.lines import Lines
from vlora_va.analytics.zones import Zones
from vlora_va.contracts.scene import LineConfig, ZoneConfig

__all__ = ["Hit", "SceneRules", "TrackPoint"]


class SceneRules:
    """All lines and zones of one stream's tracked task."""

    def __init__(self, lines: tuple[LineConfig, ...], zones: tuple[ZoneConfig, ...], *, zone_frames: int = 2,
                 stale_after_s: float = 60.0):
        self.lines, self.zones = Lines(tuple(lines)), Zones(tuple(zones), zone_frames)
        self.stale_after_s = stale_after_s
        self._row_of: dict[str, int] = {}  # live track id -> its row in the state tables
        self._free: list[int] = []  # rows to reuse
        self._ids: list[str | None] = []  # row -> track id
        self._last: list[TrackPoint | None] = []  # row -> the track as last seen (an end's box)
        self._foot = np.zeros((0, 2))  # row -> reference point last seen (the start of the next step)
        self._seen = np.zeros(0, dtype=bool)  # row -> seen at least once
        self._seen_at = np.zeros(0)  # row -> media time last seen

    def update(self, ts: float, tracks: list[TrackPoint]) -> list[Hit]:
        """One frame's confirmed tracks: the hits of this frame (and the ends of tracks gone stale)."""
        hits = self._expire(ts)
        if not tracks:
            return hits
        boxes = np.array([t.box for t in tracks], dtype=np.float64).reshape(len(tracks), 4)
        feet = np.column_stack(((boxes[:, 0] + boxes[:, 2]) * 0.5, boxes[:, 3]))  # TrackPoint.foot, vectorised
        rows = np.array([self._row(t.track_id) for t in tracks], dtype=np.intp)
        hits += self.lines.step(ts, rows, tracks, feet, self._foot[rows], self._seen[rows])
        hits += self.zones.step(ts, rows, tracks, feet)
        self._foot[rows], self._seen[rows], self._seen_at[rows] = feet, True, ts
        for row, track in zip(rows.tolist(), tracks):
            self._last[row] = track
        return hits

    def end(self, track_ids: Iterable[str], ts: float) -> list[Hit]:
        """The tracker ended these tracks: they leave the zones they are in (zone_left, loitering end) and their state
        is dropped. Ids without state (never seen, already ended) are ignored."""
        hits: list[Hit] = []
        for track_id in track_ids:
            row = self._row_of.pop(track_id, None)
            if row is None:
                continue
            last = self._last[row]
            if last is not None:
                hits += self.zones.end(ts, row, last)
            self._release(row)
        return hits

    def counts(self) -> dict:
        """Running totals: {"lines": {name: {"in": {cls: n}, "out": {...}}}, "zones": {name: {"inside": {...},
        "entered": {...}, "left": {...}}}} (copies)."""
        return {"lines": {c.name: snapshot(t) for c, t in zip(self.lines.configs, self.lines.totals)},
                "zones": {c.name: snapshot(t) for c, t in zip(self.zones.configs, self.zones.totals)}}

    def occupancy(self) -> dict:
        """{zone: {cls: tracks inside now}} (a class stays listed at 0 once seen, so a gauge goes back to 0)."""
        return {c.name: dict(t["inside"]) for c, t in zip(self.zones.configs, self.zones.totals)}

    @property
    def live_tracks(self) -> int:
        """How many tracks hold state now."""
        return len(self._row_of)

    # ---------------------------------------------------------------- rows
    def _row(self, track_id: str) -> int:
        row = self._row_of.get(track_id)
        if row is None:
            if not self._free:
                self._grow()
            row = self._free.pop()
            self._row_of[track_id], self._ids[row] = row, track_id
        return row

    def _grow(self) -> None:
        old = len(self._ids)
        cap = max(64, 2 * old)
        self._ids += [None] * (cap - old)
        self._last += [None] * (cap - old)
        self._foot = np.concatenate([self._foot, np.zeros((cap - old, 2))])
        self._seen = np.concatenate([self._seen, np.zeros(cap - old, dtype=bool)])
        self._seen_at = np.concatenate([self._seen_at, np.zeros(cap - old)])
        self.lines.state.grow(cap)
        self.zones.state.grow(cap)
        self._free += range(cap - 1, old - 1, -1)  # popped from the end: the lowest row first

    def _release(self, row: int) -> None:
        self.lines.state.reset(row)
        self.zones.state.reset(row)
        self._ids[row] = self._last[row] = None
        self._seen[row] = False
        self._free.append(row)

    def _expire(self, ts: float) -> list[Hit]:
        stale = np.flatnonzero(self._seen & (ts - self._seen_at > self.stale_after_s))
        return self.end([self._ids[row] for row in stale], ts) if len(stale) else []
