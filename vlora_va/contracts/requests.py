"""Requests: one task on one chunk, cut from a received chunk message (`wire.Chunk.requests`), with times in the
daemon's clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vlora_va.contracts.geometry import Letterbox


def frame_key(frame: np.ndarray) -> tuple:
    """The identity of a frame buffer: requests of one chunk that look at the same frame share its buffer (what
    a shared prefix runs once for)."""
    return frame.__array_interface__["data"][0], frame.shape


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
    ready: float  # daemon wall clock: when the chunk was complete at the source (the latency origin)
    received: float  # daemon wall clock: when the daemon read the message
    deadline: float  # daemon wall clock: ready + the task's budget
    priority: int = 0  # higher is served first under overload
    dropped_before: int = 0  # chunks of this stream that ingest dropped just before this one
    degraded: str = ""  # what overload did to it, e.g. "overload: 4 of 8 frames" (its row says so)
    best_effort: bool = False  # not live: never shed, served when live work leaves room (see wire.TaskRequest)
    outage_before_s: float = 0.0  # media seconds of this stream its source missed just before this chunk
    jpegs: dict[float, bytes] = field(default_factory=dict, repr=False)  # media time -> the frame's JPEG (snapshots)
    reuse_chunk: int = -1  # >= 0: no frames; its row is this earlier chunk's result (frame filtering)
    embed: bool = False  # its detections carry appearance embeddings (a tracked task; set by the daemon)
    frame_keys: tuple = field(init=False, repr=False)  # frame_key of each frame (made from the frames)

    def __post_init__(self):
        self.frame_keys = tuple(frame_key(f) for f in self.frames)

    @property
    def num_images(self) -> int:
        return len(self.frames)

    @property
    def deadline_ms(self) -> float:
        return (self.deadline - self.ready) * 1000.0

    @property
    def key(self) -> tuple[str, int, str]:
        return self.stream, self.seq, self.task
