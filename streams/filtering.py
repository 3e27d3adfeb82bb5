"""Frame filtering at ingest: a task whose frames show nothing new since the last ones sent for it sends none.

    chunk's frames of the task ─► grey 64x64 thumbnails ─► mean |difference| to the thumbnails last sent, the
    largest over the task's frames ─► below the threshold and fewer than refresh_chunks since: reuse that chunk
                                   └► otherwise: send, and these thumbnails become the reference

The reference is what was last *sent*, not the previous chunk: a scene drifting slowly (light, a shadow) adds up
until it passes the threshold, instead of slipping under it one small step at a time. A decision costs a colour
conversion and a resize of an image ingest has already made (about 0.2 ms per 336-px frame on the reference
machine, `bench/filtering.py`); no torch. If a chunk that was the reference never
reaches the daemon (ingest's queue dropped it), `invalidate()` makes the next chunk send its frames.
"""

from __future__ import annotations

import threading

import cv2
import numpy as np

from vlora_va.contracts.filtering import FilterConfig

THUMB = 64  # thumbnail side: small enough to cost microseconds, big enough to see a person at 10 m


def thumbnail(image: np.ndarray) -> np.ndarray:
    """A grey THUMB x THUMB float32 thumbnail of an RGB uint8 image (area-averaged: sensor noise averages out)."""
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (THUMB, THUMB), interpolation=cv2.INTER_AREA).astype(np.float32)


def difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The filter's feature: the largest, over paired frames, of the mean absolute grey difference (0-255)."""
    return max(float(np.mean(np.abs(x - y))) for x, y in zip(a, b))


class FrameFilter:
    """One task of one stream. `decide(seq, images)` says whether this chunk's frames of the task must be sent."""

    def __init__(self, config: FilterConfig):
        self.config = config
        self._reference: list[np.ndarray] | None = None  # thumbnails of the frames last sent
        self._sent_seq = -1  # the chunk they were sent in
        self._stale = threading.Event()  # set from the sender's thread when a reference chunk was dropped
        self.sent = self.reused = 0
        self.last_difference: float | None = None

    def decide(self, seq: int, images: list[np.ndarray]) -> int:
        """-1: send the frames (and they become the reference); else the chunk whose result stands for this one."""
        thumbs = [thumbnail(im) for im in images]
        fresh = self._reference is None or self._stale.is_set() or len(thumbs) != len(self._reference)
        self.last_difference = None if fresh else difference(thumbs, self._reference)
        if (not fresh and seq - self._sent_seq < self.config.refresh_chunks
                and self.last_difference < self.config.threshold):
            self.reused += 1
            return self._sent_seq
        self._reference, self._sent_seq = thumbs, seq
        self._stale.clear()
        self.sent += 1
        return -1

    def invalidate(self, seq: int) -> None:
        """Chunk `seq` will never reach the daemon: if it is the reference, the next chunk sends its frames."""
        if seq == self._sent_seq:
            self._stale.set()
