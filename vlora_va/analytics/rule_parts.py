"""The parts the line and zone rules are built from (what they share): a confirmed track in one frame (TrackPoint),
what a rule says happened (Hit), running totals, and the per-track state table.

Rules keep their running totals as {direction-or-state: {class: n}} and hand a copy of them with every hit, so a
hit's counts stay what they were right after it, whatever happens later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class TrackPoint:
    """One confirmed track in one frame."""

    track_id: str
    cls: str
    box: Box  # x1, y1, x2, y2 in original-frame pixels

    @property
    def foot(self) -> tuple[float, float]:
        """The track's reference point: the bottom centre of its box (DeepStream's convention), where a person
        stands on the ground."""
        x1, _, x2, y2 = self.box
        return ((x1 + x2) / 2.0, y2)


@dataclass(frozen=True)
class Hit:
    """What a rule says happened to one track."""

    event: str  # line_crossed | zone_entered | zone_left | loitering
    phase: str | None  # zone_entered "start", zone_left "end", loitering "start"/"end", line_crossed None
    kind: str  # "line" | "zone"
    rule: str  # the line's or zone's name
    track_id: str
    cls: str
    box: Box
    ts: float  # media time of the frame the rule decided on (its snapshot shows this box)
    direction: str | None = None  # lines: "in" | "out"
    counts: dict = field(default_factory=dict)  # the rule's running totals right after this hit
    extra: dict = field(default_factory=dict)  # e.g. {"dwell_s": 12.3} for loitering and zone_left


def add(totals: dict, key: str, cls: str, n: int = 1) -> None:
    """totals[key][cls] += n."""
    by_class = totals[key]
    by_class[cls] = by_class.get(cls, 0) + n


def snapshot(totals: dict) -> dict:
    """A copy of a rule's totals that later counting does not change."""
    return {key: dict(by_class) for key, by_class in totals.items()}


class RowTable:
    """Per-track state as numpy columns, one row per live track and one column per rule, so that a frame's tracks
    are read and written with fancy indexing instead of a Python loop. SceneRules hands out the rows (a track keeps
    its row until it ends; a freed row is reset and reused) and grows every table together."""

    def __init__(self, rules: int, columns: dict[str, tuple[type, object]]):
        self.rules, self.columns = rules, columns  # name -> (dtype, the value of a fresh row)
        for name, (dtype, fill) in columns.items():
            setattr(self, name, np.full((0, rules), fill, dtype))

    def grow(self, capacity: int) -> None:
        for name, (dtype, fill) in self.columns.items():
            old = getattr(self, name)
            new = np.full((capacity, self.rules), fill, dtype)
            new[:len(old)] = old
            setattr(self, name, new)

    def reset(self, row: int) -> None:
        for name, (_, fill) in self.columns.items():
            getattr(self, name)[row] = fill
