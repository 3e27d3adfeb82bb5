"""Line crossings: which confirmed tracks crossed which line segments this frame, and which way.

For a line from P1 = (x1, y1) to P2 = (x2, y2) and a track's reference point (cx, cy), in pixels with y down,

    s = (x2 - x1)(cy - y1) - (y2 - y1)(cx - x1)        (s / |P2 - P1| is the signed distance to the line)

`in` is s going from negative to positive: from the walker's left to the walker's right for someone walking the line
from P1 to P2, as seen on screen. On a vertical line drawn top to bottom, walking from right to left is `in`.

Hysteresis (a Schmitt trigger per track and line): a track's side of a line is only settled where its point is at
least `min_distance_px` from the line (its "settled side"). A crossing is a change of settled side whose path went
through the segment itself: between leaving the old settled side and reaching the new one, some frame-to-frame step
of the point crossed the segment P1P2 (a straight step between two frames, so a track that jumps across in one step
at 5 fps counts when that step passes through the segment). So
  - a track jittering around the line, however often it flips sign, makes no crossing until it settles on the other
    side, and then exactly one;
  - a track that comes back to its old settled side makes none, and it counts again only when it really crosses back
    (the other direction);
  - a track that passes the line's extension (beside the segment) makes none; its settled side still changes, so a
    later crossing is counted from where it really is;
  - a track first seen inside the band has no settled side: its first settled side is where it starts from.
All of it is numpy over the frame's tracks x lines; only crossings go through Python.
"""

from __future__ import annotations

import numpy as np

from vlora_va.analytics.rule_parts import Hit, RowTable, TrackPoint, add, snapshot
from vlora_va.contracts.scene import LineConfig


class Lines:
    """All lines of one stream: per-track state in a RowTable (rows from SceneRules), totals per line."""

    def __init__(self, lines: tuple[LineConfig, ...]):
        self.configs = lines
        pts = np.array([ln.points for ln in lines], dtype=np.float64).reshape(len(lines), 2, 2)
        self.p1, self.p2 = pts[:, 0], pts[:, 1]
        self.d = self.p2 - self.p1
        length = np.hypot(self.d[:, 0], self.d[:, 1])
        self.min_s = np.array([ln.min_distance_px for ln in lines]) * length  # the band, in units of s
        self.cooldown = np.array([ln.cooldown_s for ln in lines], dtype=np.float64)
        self.totals = [{"in": {}, "out": {}} for _ in lines]
        self.state = RowTable(len(lines), {
            "side": (np.int8, 0),  # the settled side: -1 / +1, 0 = not settled yet
            "through": (np.bool_, False),  # since leaving the settled side, a step went through the segment
            "sent": (np.float64, -np.inf),  # media time of this track's last returned crossing (cooldown)
        })

    def s(self, feet: np.ndarray) -> np.ndarray:
        """s of every point (N, 2) for every line: (N, L)."""
        return (self.d[:, 0] * (feet[:, 1:2] - self.p1[:, 1])) - (self.d[:, 1] * (feet[:, 0:1] - self.p1[:, 0]))

    def _through_segment(self, prev: np.ndarray, feet: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> np.ndarray:
        """Whether each step prev -> feet meets each segment P1P2 (N, L): its ends are not strictly on one side of
        the line, and P1 and P2 are not strictly on one side of the step. A step along the line is no crossing."""
        step = feet - prev
        c1 = step[:, 0:1] * (self.p1[:, 1] - prev[:, 1:2]) - step[:, 1:2] * (self.p1[:, 0] - prev[:, 0:1])
        c2 = step[:, 0:1] * (self.p2[:, 1] - prev[:, 1:2]) - step[:, 1:2] * (self.p2[:, 0] - prev[:, 0:1])
        return (s0 * s1 <= 0) & ((s0 != 0) | (s1 != 0)) & (c1 * c2 <= 0)

    def step(self, ts: float, rows: np.ndarray, tracks: list[TrackPoint], feet: np.ndarray, prev: np.ndarray,
             has_prev: np.ndarray) -> list[Hit]:
        """One frame: update the tracks' state, count the crossings, return the ones the cooldown lets through."""
        if not self.configs:
            return []
        st = self.state
        s1 = self.s(feet)
        through = st.through[rows] | (self._through_segment(prev, feet, self.s(prev), s1) & has_prev[:, None])
        side = st.side[rows]
        now = (s1 > 0).astype(np.int8) - (s1 < 0)  # the side now: -1 / +1, 0 on the line (or a NaN box)
        settled = (np.abs(s1) >= self.min_s) & (now != 0)
        crossed = settled & (side != 0) & (now != side) & through
        st.side[rows] = np.where(settled, now, side)
        st.through[rows] = through & ~settled  # a settled point starts a new passage
        if not crossed.any():
            return []
        hits = []
        for li, i in zip(*np.nonzero(crossed.T)):  # line by line, in the tracks' order
            hit = self._count(ts, int(li), int(rows[i]), tracks[i], "in" if now[i, li] > 0 else "out")
            if hit is not None:
                hits.append(hit)
        return hits

    def _count(self, ts: float, li: int, row: int, track: TrackPoint, direction: str) -> Hit | None:
        """Count a crossing; the hit, unless this track's last returned crossing of this line is under the line's
        cooldown ago (the cooldown runs from the last hit RETURNED, so a track flickering across the line yields
        at most one hit per cooldown_s, and a steady walker still shows up)."""
        add(self.totals[li], direction, track.cls)
        if ts - self.state.sent[row, li] < self.cooldown[li]:
            return None
        self.state.sent[row, li] = ts
        return Hit("line_crossed", None, "line", self.configs[li].name, track.track_id, track.cls, track.box, ts,
                   direction, snapshot(self.totals[li]))
