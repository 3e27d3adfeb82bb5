"""Requests: one task on one chunk, cut from a received chunk message."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .wire import Chunk, Letterbox


@dataclass
class Request:
    stream: str
    seq: int
    task: str
    adapter: str
    frames: list[np.ndarray]  # model-size uint8 RGB frames (views on the received buffers)
    frame_ts: list[float]
    letterbox: Letterbox
    orig_size: tuple[int, int]
    ready_wall: float  # when the chunk was complete at the source: the latency origin
    received_wall: float
    deadline_wall: float
    dropped_before: int = 0  # chunks of this stream that ingest dropped just before this one

    @property
    def num_images(self) -> int:
        return len(self.frames)


def requests_from_chunk(chunk: Chunk, received_wall: float | None = None) -> list[Request]:
    h = chunk.header
    now = time.time() if received_wall is None else received_wall
    return [
        Request(stream=h.stream, seq=h.seq, task=t.name, adapter=t.adapter,
                frames=[chunk.frames[i] for i in t.frames], frame_ts=[h.frame_ts[i] for i in t.frames],
                letterbox=h.letterbox, orig_size=h.orig_size, ready_wall=h.ready_wall, received_wall=now,
                deadline_wall=t.deadline_wall, dropped_before=h.dropped_before)
        for t in h.tasks
    ]
