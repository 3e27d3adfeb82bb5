"""Zones: which confirmed tracks are inside which polygons, when they came and went, and who stayed too long.

A track is inside a zone when its reference point (the bottom centre of its box) is inside the polygon (even-odd ray
casting; a point exactly on an edge may read either way, which the hysteresis absorbs).

Hysteresis against boundary flicker: a track's state in a zone changes only after `confirm_frames` (default 2)
frames in a row on the other side, counted over the frames the track is seen in. The presence then dates from the
first of those frames (dwell is measured from there), and the hit is made on the frame that confirmed it (its box and
snapshot are that frame's). A track seen inside for a single frame is not counted; a new track seen inside a zone
enters it once confirmed.

Lifecycles, per track and zone:
  - presence: zone_entered (phase start) ... zone_left (phase end), on leaving or when the track ends;
  - loitering (zones with dwell_s > 0): loitering start once inside dwell_s, loitering end when the presence ends
    (before its zone_left). extra["dwell_s"] says how long it had been inside.
Counts always change ("entered", "left", and "inside" now), by the class the track had when it entered, so a class
that changes on the way does not unbalance "inside"; a presence's hits all carry that class.

Cooldown: it gates only the STARTS. A zone_entered (or loitering start) is not returned when this track's last
returned one on this zone is under cooldown_s ago, and an END is returned exactly when its start was. So every
returned start gets its returned end (however soon it comes) and no end comes without its start, a silenced
presence stays silent to its end, and a track flickering in and out yields at most one entered/left pair per
cooldown_s. Loitering is its own lifecycle: it can be returned inside a silenced presence, and then so is its end.
"""

from __future__ import annotations

import numpy as np

from vlora_va.analytics.rule_parts import Hit, RowTable, TrackPoint, add, snapshot
from vlora_va.contracts.scene import ZoneConfig


class Zones:
    """All zones of one stream: per-track state in a RowTable (rows from SceneRules), totals per zone."""

    def __init__(self, zones: tuple[ZoneConfig, ...], confirm_frames: int = 2):
        if confirm_frames < 1:
            raise ValueError(f"confirm_frames must be >= 1, got {confirm_frames}")
        self.configs, self.confirm = zones, confirm_frames
        self.dwell = np.array([z.dwell_s for z in zones], dtype=np.float64)
        self.cooldown = np.array([z.cooldown_s for z in zones], dtype=np.float64)
        self._edges(zones)
        self.totals = [{"inside": {}, "entered": {}, "left": {}} for _ in zones]
        self.state = RowTable(len(zones), {
            "inside": (np.bool_, False),  # the settled state
            "streak": (np.int16, 0),  # frames in a row seen on the other side of the settled state
            "streak_ts": (np.float64, 0.0),  # media time of the first of them
            "since": (np.float64, 0.0),  # media time the presence began (its first frame inside)
            "cls": (object, None),  # the class the track entered with
            "shown": (np.bool_, False),  # this presence's zone_entered was returned
            "loiter": (np.bool_, False),  # this presence is loitering
            "loiter_shown": (np.bool_, False),  # its loitering start was returned
            "sent_enter": (np.float64, -np.inf),  # last returned zone_entered (cooldown)
            "sent_loiter": (np.float64, -np.inf),  # last returned loitering start (cooldown)
        })

    def _edges(self, zones: tuple[ZoneConfig, ...]) -> None:
        """Every zone's edges in one array, so one pass of ray casting serves all zones (np.add.reduceat)."""
        x1, y1, x2, y2, starts = [], [], [], [], []
        for z in zones:
            starts.append(len(x1))
            for (ax, ay), (bx, by) in zip(z.points, z.points[1:] + z.points[:1]):
                x1.append(ax)
                y1.append(ay)
                x2.append(bx)
                y2.append(by)
        self.x1, self.y1 = np.array(x1, dtype=np.float64), np.array(y1, dtype=np.float64)
        dy = np.array(y2, dtype=np.float64) - self.y1
        # x where the edge meets a horizontal ray, per unit of y; horizontal edges never meet one (their test below
        # is always false), so their slope is a harmless 0
        self.slope = np.divide(np.array(x2, dtype=np.float64) - self.x1, dy, out=np.zeros_like(dy), where=dy != 0)
        self.y2 = self.y1 + dy
        self.starts = np.array(starts, dtype=np.intp)

    def contains(self, feet: np.ndarray) -> np.ndarray:
        """Whether every point (N, 2) is inside every zone: (N, Z), by counting the edges a ray to the right
        crosses."""
        px, py = feet[:, 0:1], feet[:, 1:2]
        spans = (self.y1 > py) != (self.y2 > py)
        crosses = spans & (px < self.x1 + (py - self.y1) * self.slope)
        return (np.add.reduceat(crosses, self.starts, axis=1) & 1).astype(bool)

    def step(self, ts: float, rows: np.ndarray, tracks: list[TrackPoint], feet: np.ndarray) -> list[Hit]:
        """One frame: settle the tracks' states, count, return the hits the cooldown lets through."""
        if not self.configs:
            return []
        st = self.state
        raw = self.contains(feet)
        inside, streak = st.inside[rows], st.streak[rows]
        differs = raw != inside
        st.streak_ts[rows] = np.where(differs & (streak == 0), ts, st.streak_ts[rows])
        streak = np.where(differs, streak + 1, 0)
        change = streak >= self.confirm
        st.streak[rows] = np.where(change, 0, streak)
        hits: list[Hit] = []
        for zi, i in zip(*np.nonzero(change.T)):
            row, z = int(rows[i]), int(zi)
            if inside[i, z]:
                hits += self._leave(ts, z, row, tracks[i], left_at=float(st.streak_ts[row, z]))
            else:
                hits += self._enter(ts, z, row, tracks[i])
        if (self.dwell > 0).any():
            due = st.inside[rows] & ~st.loiter[rows] & (self.dwell > 0) & (ts - st.since[rows] >= self.dwell)
            for zi, i in zip(*np.nonzero(due.T)):
                hits += self._loiter(ts, int(zi), int(rows[i]), tracks[i])
        return hits

    def end(self, ts: float, row: int, track: TrackPoint) -> list[Hit]:
        """The track ended (the tracker let it go): it leaves every zone it is in, at ts."""
        hits: list[Hit] = []
        for z in np.flatnonzero(self.state.inside[row]):
            hits += self._leave(ts, int(z), row, track, left_at=ts)
        return hits

    def _hit(self, event: str, phase: str, z: int, track: TrackPoint, cls: str, ts: float,
             extra: dict | None = None) -> Hit:
        return Hit(event, phase, "zone", self.configs[z].name, track.track_id, cls, track.box, ts, None,
                   snapshot(self.totals[z]), extra or {})

    def _enter(self, ts: float, z: int, row: int, track: TrackPoint) -> list[Hit]:
        st = self.state
        st.inside[row, z], st.since[row, z], st.cls[row, z] = True, st.streak_ts[row, z], track.cls
        add(self.totals[z], "entered", track.cls)
        add(self.totals[z], "inside", track.cls)
        st.shown[row, z] = ts - st.sent_enter[row, z] >= self.cooldown[z]
        if not st.shown[row, z]:
            return []
        st.sent_enter[row, z] = ts
        return [self._hit("zone_entered", "start", z, track, track.cls, ts)]

    def _loiter(self, ts: float, z: int, row: int, track: TrackPoint) -> list[Hit]:
        st = self.state
        st.loiter[row, z] = True
        st.loiter_shown[row, z] = ts - st.sent_loiter[row, z] >= self.cooldown[z]
        if not st.loiter_shown[row, z]:
            return []
        st.sent_loiter[row, z] = ts
        dwell = {"dwell_s": round(float(ts - st.since[row, z]), 3)}
        return [self._hit("loitering", "start", z, track, st.cls[row, z], ts, dwell)]

    def _leave(self, ts: float, z: int, row: int, track: TrackPoint, left_at: float) -> list[Hit]:
        """End the presence (and its loitering): counts always, an end hit exactly where its start was returned."""
        st = self.state
        dwell = {"dwell_s": round(max(0.0, float(left_at - st.since[row, z])), 3)}
        cls = st.cls[row, z]
        add(self.totals[z], "left", cls)
        add(self.totals[z], "inside", cls, -1)
        hits = []
        if st.loiter[row, z] and st.loiter_shown[row, z]:
            hits.append(self._hit("loitering", "end", z, track, cls, ts, dwell))
        if st.shown[row, z]:
            hits.append(self._hit("zone_left", "end", z, track, cls, ts, dwell))
        st.inside[row, z] = st.loiter[row, z] = st.shown[row, z] = st.loiter_shown[row, z] = False
        st.cls[row, z] = None
        return hits
