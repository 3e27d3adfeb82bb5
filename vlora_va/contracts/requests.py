"""Requests: one task on one chunk, cut from a received chunk message, with times in the daemon's clock."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.wire import Chunk


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

    @property
    def num_images(self) -> int:
        return len(self.frames)

    @property
    def deadline_ms(self) -> float:
        return (self.deadline - self.ready) * 1000.0

    @property
    def key(self) -> tuple[str, int, str]:
        return self.stream, self.seq, self.task


def requests_from_chunk(chunk: Chunk, received: float, clock_offset: float = 0.0) -> list[Request]:
    """One Request per task of the chunk. clock_offset: daemon clock minus the sender's clock (seconds),
    so that ready / deadline are in the daemon's clock. A chunk was complete at its source no later than the
    daemon received it: an offset estimated a few ms too high (it is robust, not exact) must not place ready
    after received, or a served row's total latency would come out shorter than its compute time."""
    h = chunk.header
    ready = min(h.ready_wall + clock_offset, received)
    return [
        Request(stream=h.stream, seq=h.seq, task=t.name, adapter=t.adapter,
                frames=[chunk.frames[i] for i in t.frames], frame_ts=[h.frame_ts[i] for i in t.frames],
                letterbox=h.letterbox, orig_size=h.orig_size, ready=ready, received=received,
                deadline=ready + t.deadline_ms / 1000.0, priority=t.priority, dropped_before=h.dropped_before,
                best_effort=t.best_effort, outage_before_s=h.outage_s)
        for t in h.tasks
    ]
