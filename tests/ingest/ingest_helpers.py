"""Helpers for the ingest tests: small pipeline configs, a real PULL receiver, a worker
in a thread, generated test videos.

The machines these tests run on are shared and slow: every wait here is on a condition, with a
generous time-out, never a fixed sleep with a sub-second margin."""

from __future__ import annotations

import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Callable

import av
import numpy as np
import zmq

from vlora_va.contracts.config import DaemonConfig, IngestConfig, PipelineConfig, StreamConfig, TaskConfig
from vlora_va.contracts.wire import Chunk, SourceStatus, decode_message

IMAGE_SIZE = 112  # small model frames keep the tests fast
QUIET_S = 1.0  # once a worker has flushed, this long without a message means nothing is still in flight


def tasks(*spec: tuple[str, int, float]) -> tuple[TaskConfig, ...]:
    """tasks(("det", 2, 500.0), ...) -> TaskConfigs whose adapter is named like the task."""
    return tuple(TaskConfig(name=n, adapter=n, frames_per_chunk=k, deadline_ms=d) for n, k, d in spec)


DEFAULT_TASKS = tasks(("det", 2, 500.0), ("act", 4, 1000.0))


def stream(id: str, source, **kw) -> StreamConfig:
    kw.setdefault("realtime", False)
    kw.setdefault("tasks", DEFAULT_TASKS)
    return StreamConfig(id=id, source=str(source), **kw)


def pipeline(endpoint: str, *streams: StreamConfig, **ingest) -> PipelineConfig:
    return PipelineConfig(daemon=DaemonConfig(endpoint=endpoint, image_size=IMAGE_SIZE), ingest=IngestConfig(**ingest),
                          adapters={}, streams=streams, sinks=())


class Receiver:
    """The daemon's side of the wire: a PULL socket bound on loopback that decodes every message."""

    def __init__(self, ctx: zmq.Context, rcvhwm: int = 1000, rcvbuf: int = -1):
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.RCVBUF, rcvbuf)  # -1: the OS default (autotuned, megabytes)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.chunks: list[Chunk] = []
        self.statuses: list[SourceStatus] = []  # the heartbeats (kept apart: they are not chunks)
        self.received_wall: list[float] = []

    def receive(self, timeout: float) -> Chunk | None:
        """The next chunk, or None when none came within timeout (a heartbeat is kept in `statuses`)."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        chunk = decode_message(self.sock.recv_multipart(copy=False))
        if isinstance(chunk, SourceStatus):
            self.statuses.append(chunk)
            return None
        self.chunks.append(chunk)
        self.received_wall.append(time.time())
        return chunk

    def drain(self, worker: "WorkerThread", timeout: float, delay: float = 0.0) -> list[Chunk]:
        """Receive until the worker has flushed (or ended) and then nothing more arrives for QUIET_S (at most
        `timeout` seconds in all). `delay` sleeps after each message: a slow daemon."""
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            if self.receive(0.1) is not None:
                quiet_since = None
                if delay:
                    time.sleep(delay)
            elif worker.flushed.is_set() or not worker.is_alive():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= QUIET_S:
                    break
        worker.release.set()  # like the daemon's "drained": everything sent has been read
        return self.chunks

    def pump(self, until: Callable[[], bool], timeout: float) -> bool:
        """Receive (every chunk lands in self.chunks) until `until()` is true; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                return False
            self.receive(0.05)
        return True

    def by_stream(self) -> dict[str, list[Chunk]]:
        out: dict[str, list[Chunk]] = {}
        for c in self.chunks:
            out.setdefault(c.header.stream, []).append(c)
        return out


class WorkerThread(threading.Thread):
    """run_ingest in a background thread (like the CLI's worker process, without the process)."""

    def __init__(self, config: PipelineConfig, stream_ids=None):
        super().__init__(daemon=True, name="test-ingest-worker")
        self.config, self.stream_ids = config, stream_ids
        self.stop_event = threading.Event()
        self.flushed, self.release = threading.Event(), threading.Event()
        self.stats: dict | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from vlora_va.ingest.worker import run_ingest

        try:
            self.stats = run_ingest(self.config, self.stream_ids, self.stop_event, self.flushed, self.release)
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self, timeout: float = 15.0) -> dict:
        self.release.set()
        self.join(timeout)
        assert not self.is_alive(), f"ingest worker still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.stats


# ---------------------------------------------------------------- generated videos

BACKGROUND = (40, 160, 220)  # RGB of the generated pictures' flat background
SQUARE = (0.5, 0.5, 0.25)  # the white square: centre x, centre y, side, as fractions of the width / height


def square_box(width: int, height: int) -> tuple[int, int, int, int]:
    """x1, y1, x2, y2 (pixels, exclusive end) of the white square in a generated picture of this size."""
    cx, cy, side = SQUARE
    half_w, half_h = int(width * side / 2), int(height * side / 2)
    return (int(width * cx) - half_w, int(height * cy) - half_h, int(width * cx) + half_w, int(height * cy) + half_h)


def make_video(path: Path, fps: int, width: int, height: int, seconds: float,
               gap: tuple[int, int] | None = None) -> Path:
    """An H.264 MP4 written like sample_videos/make_samples.py writes them (PyAV's libx264, yuv420p, +faststart,
    1-s GOPs): a flat BACKGROUND, a static white square (square_box) and a dark bar that moves every frame.
    gap=(i, n): frame i and the ones after it are stamped n frame intervals later (n frames of media missing,
    a camera that stalled)."""
    x1, y1, x2, y2 = square_box(width, height)
    with av.open(str(path), "w", options={"movflags": "+faststart"}) as out:
        v = out.add_stream("libx264", rate=fps)
        v.width, v.height, v.pix_fmt = width, height, "yuv420p"
        v.options = {"preset": "ultrafast", "crf": "20", "g": str(fps)}
        for i in range(int(round(seconds * fps))):
            img = np.empty((height, width, 3), np.uint8)
            img[:] = BACKGROUND
            img[y1:y2, x1:x2] = 255
            bar = (i * max(2, width // 40)) % width
            img[: height // 8, bar: bar + width // 16] = 20
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            frame.pts = i + (gap[1] if gap and i >= gap[0] else 0)
            frame.time_base = Fraction(1, fps)
            out.mux(v.encode(frame))
        out.mux(v.encode(None))
    return path
