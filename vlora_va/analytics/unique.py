"""Unique objects: how many different tracks of each class a stream saw over a sliding window ("unique visitors").

With the appearance tracker a person who leaves and comes back within reid_window_s keeps their track_id, so they
count once; without it (or after the window) they count again. Only track ids, classes and times are kept, never an
embedding; a track is forgotten once it was last seen more than `window_s` ago.
"""

from __future__ import annotations


class UniqueObjects:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._seen: dict[str, tuple[str, float]] = {}  # track_id -> (its class now, wall time last seen)

    def saw(self, track_id: str, cls: str, now: float) -> None:
        self._seen[track_id] = (cls, now)

    def counts(self, now: float) -> dict[str, int]:
        """{class: distinct tracks seen in the last window_s} (forgetting the older ones)."""
        self._seen = {k: v for k, v in self._seen.items() if now - v[1] <= self.window_s}
        out: dict[str, int] = {}
        for cls, _ in self._seen.values():
            out[cls] = out.get(cls, 0) + 1
        return out
