"""Frame filtering at ingest: a task whose frames show nothing new since the last ones sent for it sends none.

    chunk's frames of the task ─► grey 64x64 thumbnails ─► |difference| to the thumbnails last sent, averaged
    over each 8x8 block ─► the largest block, the largest over the task's frames ─► below the threshold and fewer
    than refresh_chunks since: reuse that chunk
                          └► otherwise: send, and these thumbnails become the reference

The feature is local (the block that changed most), not the whole frame's mean: one person entering or leaving a
corner of the view changes the blocks they cover by tens of grey levels but the frame's mean by about one, the
size of sensor noise. On the quiet camera (sample_videos/quiet.mp4) a walker leaving the view changed the frame's
mean by 1.85 against a noise floor of about 0.35, and its largest block by 26.8 against a floor of 0.6-1.7; with
the mean, a threshold tuned on a busy stretch carried the last walker frame into the empty scene for 9 s.

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
BLOCK = 8  # the feature's block side in thumbnail pixels: 1/64 of the view, about one person at 10-15 m


def thumbnail(image: np.ndarray) -> np.ndarray:
    """A grey THUMB x THUMB float32 thumbnail of an RGB uint8 image (area-averaged: sensor noise averages out)."""
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (THUMB, THUMB), interpolation=cv2.INTER_AREA).astype(np.float32)


def difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The filter's feature (0-255): over paired thumbnails, the largest BLOCK x BLOCK block's mean absolute grey
    difference; the largest over the pairs."""
    return max(largest_block(x, y) for x, y in zip(a, b))


def largest_block(x: np.ndarray, y: np.ndarray) -> float:
    n = THUMB // BLOCK
    return float(np.abs(x - y).reshape(n, BLOCK, n, BLOCK).mean(axis=(1, 3)).max())


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

    def invalidate(self, seq: int) -> bool:
        """Chunk `seq` will never reach the daemon: if it is the reference, the next chunk sends its frames (True)."""
        if seq != self._sent_seq:
            return False
        self._stale.set()
        return True
